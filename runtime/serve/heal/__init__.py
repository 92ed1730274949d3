"""Self-healing: a policy engine that watches the server's samples and acts on configured triggers.

:class:`SelfHealing` wires it into a server: the policy engine listens to the sampler's ticks and acts on
the service (and the runtime's devices); see :mod:`.policy` for how triggers fire and release, :mod:`.actions`
for what they do, :mod:`.alerts` for where they say so, :mod:`.spec` for the config's grammar.
"""
from __future__ import annotations

import time
from typing import Callable

from .actions import ACTIONS, Context
from .alerts import SINKS
from .policy import PolicyEngine
from .spec import SelfHealingSpec

__all__ = ["ACTIONS", "SINKS", "PolicyEngine", "SelfHealing", "SelfHealingSpec"]


class SelfHealing:
    """The policy engine of ``service`` on ``sampler``'s ticks (``spec``: the config's ``self_healing``)."""

    def __init__(self, service, spec: SelfHealingSpec, history, sampler, rt=None, reconfigurer=None,
                 server: str = "", adjust: Callable[[SelfHealingSpec], SelfHealingSpec] | None = None):
        """``adjust``: what the command line adds to every spec this policy takes later (``reconfigure``):
        guardian mode, alert channels (:func:`runtime.cli.serve.healing_of`); ``spec`` has it already."""
        self.adjust = adjust
        self.ctx = Context(service, rt, spec.recovery.warmup_requests, reconfigurer,
                           clock=getattr(sampler, "clock", time.time))
        self.engine = PolicyEngine(spec, self.ctx, history, server)
        self.sampler = sampler
        sampler.listen(self.engine.on_tick)
        service.healing = self

    def state(self) -> dict:
        """For ``/admin/state``: enabled, the triggers, the actions in effect, the spare devices."""
        spec = self.engine.spec
        return {"enabled": spec.enabled, "triggers": [t.name for t in spec.triggers], "active": self.active(),
                "spares": sorted(self.ctx.spares)}

    def update(self, spec: SelfHealingSpec) -> None:
        self.engine.update(self.adjust(spec) if self.adjust is not None else spec)

    def active(self) -> dict[str, str]:
        return self.engine.active()

    def close(self) -> None:
        """Stop listening to the sampler (active actions stay as they are)."""
        self.sampler.unlisten(self.engine.on_tick)
        if getattr(self.ctx.service, "healing", None) is self:
            self.ctx.service.healing = None
