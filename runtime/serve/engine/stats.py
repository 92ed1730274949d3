"""What an engine reports per step and per finished request, to any number of stat loggers (the
Prometheus one is :class:`runtime.serve.metrics.PrometheusStatLogger`).  vLLM's IterationStats shape."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class FinishedRequest:
    finish_reason: str
    e2e_s: float
    queue_s: float
    prompt_tokens: int
    generation_tokens: int
    max_tokens: int


@dataclass
class StepStats:
    """One engine step (generation) or one batch (embeddings)."""
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    prompt_tokens: int = 0            #: prompt tokens computed in this step (recomputation excluded)
    generation_tokens: int = 0
    num_preemptions: int = 0
    batch_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished: list[FinishedRequest] = field(default_factory=list)


class StatLogger(Protocol):
    def record(self, model: str, stats: StepStats) -> None: ...
