"""Scheduling policies by name (vLLM's ``--scheduling-policy``): the order in which waiting requests are
admitted, which running request is preempted when the KV cache runs out, and whether a waiting request
may take a running one's place in a full batch.

- ``fcfs``: first come, first served.  Waiting requests keep their queue order (a preempted request goes
  back to the head); the preemption victim is the most recently arrived running request; nothing is
  displaced.  Every request is treated as priority 0 (vLLM refuses non-zero priorities under fcfs; the
  API layer does the same).
- ``priority``: vLLM's meaning -- a LOWER value runs first; ties by arrival.  Waiting requests are taken
  by *aged* priority: ``priority - waited / aging_s`` (every ``aging_s`` seconds of waiting make a request
  one class more urgent), so a low class never starves behind a steady stream of high-class traffic.
  The preemption victim is ``max(running, key=(priority, arrival))`` (the base priority, as vLLM).  A
  waiting request whose aged priority is strictly better than the victim's aged priority displaces it
  when the batch is full (the victim is preempted and recomputed later); because the victim's own age
  keeps growing, it cannot be displaced forever either.

Pure host-side logic on the scheduler's clock (no device, no thread): tested symbolically.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from .request import Request


def _newest(running: list[Request]) -> Request:
    return max(running, key=lambda r: (r.priority, r.arrival, r.seq))


@dataclass(frozen=True)
class FcfsPolicy:
    name: str = "fcfs"
    uses_priority: bool = False

    def order(self, waiting: deque, now: float) -> deque:
        return waiting

    def victim(self, running: list[Request], now: float) -> Request:
        """vLLM: the newest running request (priority 0 for all under fcfs)."""
        return _newest(running)

    def displaces(self, cand: Request, victim: Request, now: float) -> bool:
        return False


@dataclass(frozen=True)
class PriorityPolicy:
    """``aging_s``: seconds of waiting that make a request one priority class more urgent (inf: no aging)."""
    aging_s: float = 10.0
    name: str = "priority"
    uses_priority: bool = True

    def aged(self, r: Request, now: float) -> float:
        if math.isinf(self.aging_s):
            return float(r.priority)
        return r.priority - max(0.0, now - r.arrival) / self.aging_s

    def order(self, waiting: deque, now: float) -> deque:
        return deque(sorted(waiting, key=lambda r: (self.aged(r, now), r.arrival, r.seq)))

    def victim(self, running: list[Request], now: float) -> Request:
        """vLLM: ``max(running, key=(priority, arrival))``."""
        return _newest(running)

    def displaces(self, cand: Request, victim: Request, now: float) -> bool:
        return self.aged(cand, now) < self.aged(victim, now)


#: scheduling policy name -> factory(aging_s) (a registry: the engine config names one)
POLICIES: dict[str, Callable[[float], object]] = {
    "fcfs": lambda aging_s: FcfsPolicy(),
    "priority": lambda aging_s: PriorityPolicy(aging_s),
}


def make_policy(name: str, aging_s: float = 10.0):
    return POLICIES[name](aging_s)
