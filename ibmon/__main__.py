"""``python -m ibmon``: the same entry point as the ``ibmon`` console script."""

from ibmon.cli import main

main()
