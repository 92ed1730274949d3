"""The deep health check (``GET /health?deep=true``, and the check a recovered device passes before the
engines move back to it): real work on every device and through every model, not only state.

- each device: its health level (OK or Warning passes; Alarm, Critical or lost fails) and one tiny kernel
  run (an ``add`` of 256 floats) checked against numpy;
- each in-process model engine: one request of its kind where it runs now (a one-token greedy
  generation, or one embedding: :func:`.actions.probe`).

One deep check runs at a time (a caller that arrives while one runs waits for it and gets its own).

Blocking: the kernel runs and the probes block the caller until they end.
"""
from __future__ import annotations

import threading

from .actions import PROBES, device_check, probe

_one_at_a_time = threading.Lock()


def deep_health(service, rt) -> tuple[int, dict]:
    """``(200 or 503, body)``: the shallow health, then every device's check and every model's probe
    (``rt`` None: a server without devices of its own -- replicas check theirs)."""
    status, body = service.health()
    with _one_at_a_time:
        devices = {}
        for i in range(rt.device_count() if rt is not None else 0):
            try:
                ok, why = device_check(rt.device(i))
            except Exception as e:  # noqa: BLE001 - the device's answer
                ok, why = False, f"{type(e).__name__}: {e}"
            devices[str(i)] = {"ok": ok, "detail": why}
        models = {}
        for name, eng in list(getattr(service, "engines", {}).items()):
            if getattr(eng, "kind", None) in PROBES:
                ok, why = probe(service, name, 60.0)
                models[name] = {"ok": ok, "detail": why}
    healthy = status == 200 and all(d["ok"] for d in (*devices.values(), *models.values()))
    out = {**body, "deep": True, "devices": devices, "models": models}
    if status == 200 and not healthy:
        out["status"] = "degraded"
    return (200 if healthy else 503), out


__all__ = ["deep_health"]
