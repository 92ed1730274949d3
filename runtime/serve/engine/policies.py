"""Scheduling policies by name: each picks the preemption victim among the running requests."""
from __future__ import annotations

from typing import Callable

from .request import Request


def _fcfs_victim(running: list[Request]) -> Request:
    """vLLM: the newest running request (by (priority, arrival); priority 0 for all under fcfs)."""
    return max(running, key=lambda r: (r.priority, r.arrival, r.seq))


#: scheduling policies by name: the preemption victim among the running requests
POLICIES: dict[str, Callable[[list[Request]], Request]] = {"fcfs": _fcfs_victim}
