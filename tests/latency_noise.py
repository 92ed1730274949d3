"""Deterministic request-latency noise of healthy devices, for straggler tests (no devices, no clock).

Two sources, both as ``(t_s, device, latency_s)`` reports in completion order -- what
``DevicePool.report_latency`` sees from a job runner (one worker per logical device, requests back to back):

* :func:`recorded` -- a trace recorded on the 2-core box while other jobs ran: ``MlpWorkload(d=64,
  hidden=256, batch=8)`` (tens of µs of kernels behind RPCs), 1500 requests on 4 device actors
  (``latency_trace_2core.csv``: completion time, device, latency; per-device medians 2.2-3.5 ms, MAD
  1.1-1.3 ms, the median of 9 consecutive requests of one device wandering from 0.8 to 12.4 ms).
* :func:`healthy_stream` -- a seeded model of the same: a per-device base (a device on a busier core is
  steadily slower: medians 1.8-3.1 ms, as measured in a quieter run), log-normal jitter, scheduling stalls
  (a request waits out another process's time slice) and episodes in which another process takes one
  device's core for a stretch of requests.  :data:`CPU_HOGS` makes stalls the rule rather than the exception.
"""
from __future__ import annotations

import collections
import heapq
from pathlib import Path

import numpy as np

BASE_MS = (1.8, 2.2, 2.6, 3.1)     #: per-device medians measured in a quiet run
#: ``healthy_stream`` parameters for two CPU hogs on the 2-core box: nearly every other request waits
CPU_HOGS = dict(stall_p=0.45, stall_ms=(2.0, 12.0))
TRACE = Path(__file__).with_name("latency_trace_2core.csv")

Report = tuple[float, int, float]       # (t_s, device, latency_s)


def healthy_stream(seed: int, n: int, devices: int = 4, stall_p: float = 0.04,
                   stall_ms: tuple[float, float] = (2.0, 10.0), gap_ms: float = 0.2) -> list[Report]:
    """``n`` reports of ``devices`` healthy devices, each running its requests back to back (``gap_ms``
    between two of one device), in completion order."""
    rng = np.random.default_rng(seed)
    base = [BASE_MS[i % len(BASE_MS)] for i in range(devices)]
    episode_left = [0] * devices
    episode_ms = [0.0] * devices

    def latency(d: int) -> float:
        if episode_left[d] == 0 and rng.random() < 0.02:          # another process takes this device's core
            episode_left[d] = int(rng.integers(9, 25))
            episode_ms[d] = float(rng.uniform(0.5, 1.5))
        ms = base[d] * float(rng.lognormal(0.0, 0.3))
        if rng.random() < stall_p:                                # waits out another process's time slice
            ms += float(rng.uniform(*stall_ms))
        if episode_left[d] > 0:
            ms += episode_ms[d]
            episode_left[d] -= 1
        return ms / 1000.0

    heap = []
    for d in range(devices):
        s = latency(d)
        heap.append((s, d, s))
    heapq.heapify(heap)
    out: list[Report] = []
    while len(out) < n:
        t, d, s = heapq.heappop(heap)
        out.append((t, d, s))
        nxt = latency(d)
        heapq.heappush(heap, (t + gap_ms / 1000.0 + nxt, d, nxt))
    return out


def recorded() -> list[Report]:
    """The recorded trace (see the module docstring)."""
    out: list[Report] = []
    for line in TRACE.read_text().splitlines():
        if line and not line.startswith("#"):
            t, d, s = line.split(",")
            out.append((float(t), int(d), float(s)))
    return out


def windows(reports, window: int = 9, min_samples: int = 8):
    """For every report after which the reporting device has ``min_samples``: (t, device, its recent
    ``window`` latencies, the recent latencies of every peer that has ``min_samples`` too) -- what
    ``DevicePool.report_latency`` hands the rule."""
    recent: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=window))
    count: collections.Counter = collections.Counter()
    for t, d, s in reports:
        recent[d].append(s)
        count[d] += 1
        if count[d] < min_samples:
            continue
        peers = [tuple(recent[q]) for q in recent if q != d and count[q] >= min_samples]
        yield t, d, tuple(recent[d]), peers
