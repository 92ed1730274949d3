"""Device health as data: levels, conditions (what is wrong), and the report that combines them.

Levels are npu-smi's ``Health`` column, DCMI health 0..3 (reference/cann_api.md 4.1-4.2).  A device's
health is the level of its worst active condition ("if several alarms, the most severe is the health").
Each condition also carries its human text; :attr:`HealthReport.reasons` lists those texts, which is what
``npu-smi``-style displays show.  Programs (failover, schedulers) read :attr:`HealthReport.conditions`,
never the text.

Nothing here blocks or orders anything: these are values.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

#: DCMI health 0..3 as npu-smi prints them (index = DCMI value)
HEALTH = ("OK", "Warning", "Alarm", "Critical")
_LEVEL = {name: i for i, name in enumerate(HEALTH)}


class Condition(str, enum.Enum):
    """What can be wrong with a device (the ``kind`` of a :class:`HealthCondition`)."""
    ECC = "ecc"                        #: uncorrectable HBM ECC error in a range (accesses fail: HBM_MULTI_BIT_ECC)
    LINK_DOWN = "link-down"            #: the link to device ``peer`` is down (collectives: HCCL_E_NETWORK)
    OVERHEAT = "overheat"              #: die temperature at or above an alarm threshold (``value`` = C)
    HANG = "hang"                      #: the cores run nothing and heartbeats stop
    SLOW = "slow"                      #: tasks take ``value`` x their time
    TASK_FAILURES = "task-failures"    #: the next ``value`` tasks fail (AICORE_EXCEPTION)
    CANARY = "canary"                  #: HBM guard bytes overwritten (an out-of-bounds write happened)


@dataclass(frozen=True)
class HealthCondition:
    """One active condition: its kind, its own level, the human text, and its figures."""
    kind: Condition
    level: str                         #: one of :data:`HEALTH`
    detail: str                        #: human text (also in :attr:`HealthReport.reasons`)
    peer: int = -1                     #: LINK_DOWN: the peer device id
    value: float = 0.0                 #: SLOW: factor; TASK_FAILURES: tasks left; OVERHEAT: C; ECC: bytes


def level_value(name: str) -> int:
    """DCMI value of a level name (0..3); unknown names count as Critical."""
    return _LEVEL.get(name, len(HEALTH) - 1)


@dataclass(frozen=True)
class HealthReport:
    """A device's health: the worst level of its conditions, and the conditions."""
    level: str = "OK"
    conditions: tuple[HealthCondition, ...] = ()

    @classmethod
    def of(cls, conditions) -> "HealthReport":
        conds = tuple(conditions)
        worst = max((level_value(c.level) for c in conds), default=0)
        return cls(HEALTH[worst], conds)

    @property
    def reasons(self) -> list[str]:
        return [c.detail for c in self.conditions]

    def has(self, kind: Condition, peer: int | None = None) -> bool:
        """Whether a condition of ``kind`` (about ``peer``, when given) is active."""
        return any(c.kind is kind and (peer is None or c.peer == peer) for c in self.conditions)

    def as_tuple(self) -> tuple[str, list[str]]:
        """``(level, reasons)``: the shape ``Device.health()`` returns."""
        return self.level, self.reasons


__all__ = ["HEALTH", "Condition", "HealthCondition", "HealthReport", "level_value"]
