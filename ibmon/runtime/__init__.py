"""The running daemon: composition, poll pipelines, self metrics, logging and process setup."""
