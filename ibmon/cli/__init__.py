"""The ``ibmon`` command line: run, demo, scan, top, explain, topology."""
