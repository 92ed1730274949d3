"""Observability: the metrics history and event log a server keeps (:mod:`runtime.observe.metrics_store`)."""
