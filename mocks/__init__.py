"""The simulated fabric: topology, traffic, faults and renderers for real collectors."""
