"""Outputs of ibmon: Prometheus exposition, MQTT, JSON API."""
