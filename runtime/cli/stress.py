"""``vnpu stress-test`` (placeholder registered below; see runtime.stress)."""
from __future__ import annotations


def register(sub) -> None:
    pass
