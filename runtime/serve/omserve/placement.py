"""Where the instances of compiled models run: Triton's ``instance_group`` on vnpu's devices.

Each group puts ``count`` instances on each of its ``devices``, or on the CPU (``KIND_CPU``: the host run,
no chain), or -- a group without devices -- on the next free device, picked as every other model's
devices are (:func:`runtime.serve.config.take_free`: the lowest id that no model uses and no fallback
chain names).  Every NPU instance's chain is its device, then the model's ``fallback`` (default
``[cpu]``).  Compiled models may share devices with each other (as Triton's models share a GPU), never
with a generation or embedding model (those size their caches to the device's HBM): such a device, in a
group or a chain, is refused naming the model that holds it.  Pure and host-only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..config import ConfigError, ModelSpec, take_free
from ..engine.placement import Placement
from ..modelrepo import ModelConfig, RepoModel


@dataclass(frozen=True)
class InstancePlacement:
    """One instance: where it starts and the rest of its chain."""
    first: Placement
    fallback: tuple[Placement, ...] = ()

    def __str__(self) -> str:
        return " -> ".join(str(p) for p in (self.first, *self.fallback))


def auto_groups(config: ModelConfig) -> int:
    """How many of ``config``'s groups take the next free device."""
    return sum(1 for g in config.instance_group if not g.on_cpu and g.devices is None)


def explicit_devices(config: ModelConfig) -> set[int]:
    """Every device ``config`` names: in its groups and in its fallback chain."""
    return ({d for g in config.instance_group for d in (g.devices or ())}
            | {d for p in config.fallback for d in p.devices})


def instances(config: ModelConfig, auto: Sequence[int]) -> tuple[InstancePlacement, ...]:
    """The instances of ``config``'s groups, in order; ``auto``: the device of each group without
    devices, in order."""
    out: list[InstancePlacement] = []
    picked = iter(auto)
    for g in config.instance_group:
        if g.on_cpu:
            out += [InstancePlacement(Placement(cpu=True))] * g.count
            continue
        for d in g.devices if g.devices is not None else (next(picked),):
            out += [InstancePlacement(Placement((d,)), tuple(config.fallback))] * g.count
    return tuple(out)


def place_compiled(models: Iterable[RepoModel], specs: Sequence[ModelSpec], device_count: int,
                   taken: Iterable[int] = ()) -> dict[str, tuple[InstancePlacement, ...]]:
    """The instances of every model with a configuration, by name, on ``device_count`` devices beside
    ``specs`` (the generation and embedding models, already placed); ``taken``: devices already given to
    compiled models (a model loaded later takes the next one after them).  ConfigError naming the model for
    a device that does not exist, that another kind of model holds, or when no free device is left."""
    models = [m for m in models if m.config is not None]
    holder = {d: s.name for s in specs for d in s.chain_devices}
    named: set[int] = set()
    for m in models:
        for d in sorted(explicit_devices(m.config)):
            if d >= device_count:
                raise ConfigError(f"model {m.name}: device {d} does not exist ({device_count} devices)")
            if d in holder:
                raise ConfigError(f"model {m.name}: device {d} is used by model {holder[d]}")
            named.add(d)
    free = set(holder) | named | set(taken)
    return {m.name: instances(m.config, take_free(auto_groups(m.config), free, device_count, f"model {m.name}"))
            for m in models}


def compiled_needs(models: Iterable[RepoModel]) -> tuple[set[int], int]:
    """What compiled models ask of a cluster: the devices they name, and how many free ones they take."""
    named: set[int] = set()
    auto = 0
    for m in models:
        if m.config is not None:
            named |= explicit_devices(m.config)
            auto += auto_groups(m.config)
    return named, auto


__all__ = ["InstancePlacement", "auto_groups", "compiled_needs", "explicit_devices", "instances", "place_compiled"]
