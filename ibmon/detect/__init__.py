"""Detectors: one module per family, each turning port views into edge-triggered events."""
