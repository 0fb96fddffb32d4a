"""Counters to totals and rates: the tracker, its column store and the port views it makes."""
