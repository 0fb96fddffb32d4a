"""``python -m ibmon``: the same entry point as the ``ibmon`` console script
(``ibmon.cli.entry``)."""

from ibmon.cli.entry import main

main()
