"""``python -m ibmon``: the same entry point as the ``ibmon`` console script (``ibmon.entry``)."""

from ibmon.entry import main

main()
