"""``vnpu serve``: an OpenAI-compatible inference server on virtual NPUs.

- :mod:`.engine`: the engines (plain Python over :mod:`runtime.api`, no HTTP);
- :mod:`.api`: the HTTP side (protocol models, routes, OpenAI error shapes);
- :mod:`.config`: ``serve.yaml`` (schema-validated) and model placement;
- :mod:`.metrics`: Prometheus exposition (vLLM's metric set under ``vnpu:``, npu-exporter device gauges);
- :mod:`.server`: engines + routes + uvicorn, health, SIGTERM drain.
"""
