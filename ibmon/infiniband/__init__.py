"""InfiniBand facts: the counter catalogue, link widths and speeds, PortXmitWait units."""
