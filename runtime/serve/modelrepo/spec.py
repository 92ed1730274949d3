"""A served compiled model's configuration, as Triton's model configuration has it (``config.pbtxt``'s
fields, read from ``config.yaml`` by :mod:`.config` or derived from an ``.om`` by :mod:`.omfile`), plus
vnpu's keys (``min_batch``, the ``fallback`` chain).  Frozen dataclasses that check themselves: a bad
value raises :class:`ModelConfigError` whose message starts with the field's name (the YAML reader puts
the file and the key's line in front of it).

Semantics follow Triton's where Triton has the field:

- ``max_batch_size`` > 0: the model batches on a first axis that ``dims`` leave out; 0: ``dims`` are the
  full shape and requests are not batched;
- ``dynamic_batching`` (only with ``max_batch_size`` > 0): ``preferred_batch_size``,
  ``max_queue_delay_microseconds``, ``priority_levels`` (1 is the highest level; a request's priority 0
  means ``default_priority_level``), ``default_queue_policy`` / ``priority_queue_policy``
  (``timeout_action`` REJECT or DELAY, ``default_timeout_microseconds`` with 0 = none,
  ``allow_timeout_override``: a request may only shorten its level's timeout, ``max_queue_size`` with
  0 = unbounded); ``min_batch`` (vnpu, the seed's): a batch smaller than this waits for the queue delay;
- ``instance_group``: ``count`` instances on each listed device (KIND_NPU; Triton's KIND_GPU is read as
  the same), on the CPU fallback device (KIND_CPU), or on the next free device (no ``devices``);
- ``version_policy``: ``latest`` (``num_versions``), ``all`` or ``specific`` (``versions``);
- ``fallback`` (vnpu): the chain an instance moves down when its device is lost; default ``[cpu]``.

Pure data, host-only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from devices.errors import InvalidParamError

from ..engine.placement import Placement
from .datatypes import V2_TO_NUMPY, triton_data_type

PLATFORM = "vnpu_om"
TIMEOUT_ACTIONS = ("REJECT", "DELAY")
#: instance kinds; KIND_GPU (Triton's accelerator kind) is accepted as KIND_NPU by the reader
INSTANCE_KINDS = ("KIND_AUTO", "KIND_NPU", "KIND_CPU")
VERSION_POLICIES = ("latest", "all", "specific")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class ModelConfigError(InvalidParamError):
    """A model configuration or repository entry that cannot be served; the message names the file, the
    line and the key where there is one."""


def _fail(key: str, msg: str) -> None:
    raise ModelConfigError(f"{key}: {msg}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(key: str, v, lo: int) -> None:
    if not _is_int(v) or v < lo:
        _fail(key, f"expected an integer >= {lo}, got {v!r}")


@dataclass(frozen=True)
class TensorSpec:
    """An input or output: its name, v2 ``datatype`` (``FP32``) and ``dims`` (-1: any size on that axis;
    without the batch axis when the model's ``max_batch_size`` > 0)."""
    name: str
    datatype: str
    dims: tuple[int, ...]

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            _fail("name", f"expected a non-empty string, got {self.name!r}")
        if self.datatype not in V2_TO_NUMPY:
            _fail("data_type", f"unknown datatype {self.datatype!r}")
        if not isinstance(self.dims, tuple) or any(not _is_int(d) or d == 0 or d < -1 for d in self.dims):
            _fail("dims", f"expected a list of sizes >= 1 or -1, got {list(self.dims)!r}")

    @property
    def dtype(self) -> str:
        """numpy's name of the type (``float32``)."""
        return V2_TO_NUMPY[self.datatype]

    def accepts(self, shape) -> bool:
        """Whether a tensor of ``shape`` (without the batch axis where the model batches) fits ``dims``."""
        shape = tuple(shape)
        return len(shape) == len(self.dims) and all(d in (-1, s) for d, s in zip(self.dims, shape))

    def triton_json(self) -> dict:
        return {"name": self.name, "data_type": triton_data_type(self.datatype), "dims": list(self.dims)}


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy`` for one priority level."""
    timeout_action: str = "REJECT"
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self):
        if self.timeout_action not in TIMEOUT_ACTIONS:
            _fail("timeout_action", f"expected one of {', '.join(TIMEOUT_ACTIONS)}, got {self.timeout_action!r}")
        _check_int("default_timeout_microseconds", self.default_timeout_microseconds, 0)
        if not isinstance(self.allow_timeout_override, bool):
            _fail("allow_timeout_override", f"expected true or false, got {self.allow_timeout_override!r}")
        _check_int("max_queue_size", self.max_queue_size, 0)

    def timeout_us(self, requested: int = 0) -> int:
        """A request's timeout in microseconds (0: none): the level's default, or the request's own
        ``requested`` when overrides are allowed and it is shorter (any timeout is shorter than none)."""
        d = self.default_timeout_microseconds
        if self.allow_timeout_override and requested > 0 and (d == 0 or requested < d):
            return requested
        return d

    def triton_json(self) -> dict:
        return {"timeout_action": self.timeout_action, "default_timeout_microseconds": self.default_timeout_microseconds,
                "allow_timeout_override": self.allow_timeout_override, "max_queue_size": self.max_queue_size}


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's ``dynamic_batching`` plus the seed's ``min_batch``; ``preferred_batch_size`` is kept
    sorted."""
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    min_batch: int = 1
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_queue_policy: tuple[tuple[int, QueuePolicy], ...] = ()

    def __post_init__(self):
        pref = self.preferred_batch_size
        if not isinstance(pref, tuple) or any(not _is_int(b) or b < 1 for b in pref) or len(set(pref)) != len(pref):
            _fail("preferred_batch_size", f"expected distinct sizes >= 1, got {list(pref)!r}")
        pref = tuple(sorted(pref))
        object.__setattr__(self, "preferred_batch_size", pref)
        _check_int("max_queue_delay_microseconds", self.max_queue_delay_microseconds, 0)
        _check_int("min_batch", self.min_batch, 1)
        if self.min_batch > 1 and self.max_queue_delay_microseconds == 0:
            _fail("min_batch", f"{self.min_batch} needs a queue delay to wait for (max_queue_delay_microseconds or "
                               "timeout_ms > 0)")
        if pref and self.min_batch > pref[-1]:
            _fail("min_batch", f"{self.min_batch} is larger than the largest preferred batch size {pref[-1]}")
        _check_int("priority_levels", self.priority_levels, 0)
        self._check_levels()

    def _check_levels(self) -> None:
        n, default = self.priority_levels, self.default_priority_level
        if n == 0 and default != 0:
            _fail("default_priority_level", f"must be 0 without priority_levels, got {default!r}")
        if n > 0 and (not _is_int(default) or not 1 <= default <= n):
            _fail("default_priority_level", f"expected a level in 1..{n} (priority_levels), got {default!r}")
        seen = set()
        for level, policy in self.priority_queue_policy:
            if not _is_int(level) or not 1 <= level <= n or level in seen:
                _fail("priority_queue_policy", f"level {level!r} is not one of 1..{n} (priority_levels) or is "
                                               "given twice")
            if not isinstance(policy, QueuePolicy):
                _fail("priority_queue_policy", f"level {level}: expected a queue policy")
            seen.add(level)

    @property
    def levels(self) -> tuple[int, ...]:
        """The priority levels, highest first: (0,) without priority levels, else 1..priority_levels."""
        return (0,) if self.priority_levels == 0 else tuple(range(1, self.priority_levels + 1))

    def queue_policy(self, level: int) -> QueuePolicy:
        return dict(self.priority_queue_policy).get(level, self.default_queue_policy)

    def triton_json(self) -> dict:
        return {"preferred_batch_size": list(self.preferred_batch_size),
                "max_queue_delay_microseconds": self.max_queue_delay_microseconds, "preserve_ordering": False,
                "priority_levels": self.priority_levels, "default_priority_level": self.default_priority_level,
                "default_queue_policy": self.default_queue_policy.triton_json(),
                "priority_queue_policy": {str(k): p.triton_json() for k, p in self.priority_queue_policy}}


@dataclass(frozen=True)
class InstanceGroup:
    """``count`` instances on each of ``devices`` (None: placed on the next free device), or on the CPU
    fallback device (``kind`` KIND_CPU)."""
    count: int = 1
    kind: str = "KIND_AUTO"
    devices: tuple[int, ...] | None = None
    name: str = ""

    def __post_init__(self):
        _check_int("count", self.count, 1)
        if self.kind not in INSTANCE_KINDS:
            _fail("kind", f"expected one of {', '.join(INSTANCE_KINDS)}, got {self.kind!r}")
        if self.devices is not None:
            if self.kind == "KIND_CPU":
                _fail("devices", "a KIND_CPU group runs on the CPU fallback device; it takes no devices")
            if not self.devices or any(not _is_int(d) or d < 0 for d in self.devices) \
                    or len(set(self.devices)) != len(self.devices):
                _fail("devices", f"expected distinct device ids >= 0, got {self.devices!r}")

    @property
    def on_cpu(self) -> bool:
        return self.kind == "KIND_CPU"

    def triton_json(self, index: int, model: str) -> dict:
        out = {"name": self.name or f"{model}_{index}", "kind": "KIND_CPU" if self.on_cpu else "KIND_GPU",
               "count": self.count}
        return dict(out, gpus=list(self.devices)) if self.devices else out


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of the repository's are served."""
    policy: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def __post_init__(self):
        if self.policy not in VERSION_POLICIES:
            _fail("version_policy", f"expected one of {', '.join(VERSION_POLICIES)}, got {self.policy!r}")
        _check_int("version_policy", self.num_versions, 1)
        if self.policy == "specific" and (not self.versions or any(not _is_int(v) or v < 1 for v in self.versions)
                                          or len(set(self.versions)) != len(self.versions)):
            _fail("version_policy", f"specific needs distinct versions >= 1, got {list(self.versions)!r}")

    def select(self, available) -> tuple[int, ...]:
        """The versions of ``available`` this policy serves, ascending."""
        have = sorted(set(available))
        if self.policy == "all":
            return tuple(have)
        if self.policy == "latest":
            return tuple(have[-self.num_versions:])
        return tuple(v for v in have if v in self.versions)

    def triton_json(self) -> dict:
        if self.policy == "latest":
            return {"latest": {"num_versions": self.num_versions}}
        return {"all": {}} if self.policy == "all" else {"specific": {"versions": list(self.versions)}}


def fallback_text(chain) -> str:
    """A chain as one string: placements separated by ';', a placement's devices by ',' (``3;4,5;cpu``)."""
    return ";".join("cpu" if p.cpu else ",".join(map(str, p.devices)) for p in chain)


def _check_tensors(key: str, tensors) -> None:
    names = [t.name for t in tensors]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        _fail(key, f"{dup} is listed twice")


def _check_fallback(fallback, groups) -> None:
    for i, p in enumerate(fallback):
        if p.cpu and i != len(fallback) - 1:
            _fail("fallback", "cpu must be the last entry of the chain")
        if p in fallback[:i]:
            _fail("fallback", f"{p} is listed twice")
    first = {d for g in groups for d in (g.devices or ())}
    own = first.intersection(d for p in fallback for d in p.devices)
    if own:
        _fail("fallback", f"device {min(own)} is both in an instance group and in the fallback chain")


@dataclass(frozen=True)
class ModelConfig:
    """One model of the repository (Triton's ``ModelConfig`` for platform ``vnpu_om``)."""
    name: str
    max_batch_size: int = 0
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    instance_group: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    fallback: tuple[Placement, ...] = (Placement(cpu=True),)
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    platform: str = PLATFORM

    def __post_init__(self):
        if not isinstance(self.name, str) or not NAME_RE.fullmatch(self.name):
            _fail("name", f"expected letters, digits, '_', '.' or '-' (up to 128, not starting with '.', '_' "
                          f"or '-'), got {self.name!r}")
        if self.platform != PLATFORM:
            _fail("platform", f"vnpu serves {PLATFORM} models (compiled by `vnpu atc`), got {self.platform!r}")
        _check_int("max_batch_size", self.max_batch_size, 0)
        db = self.dynamic_batching
        if db is not None and self.max_batch_size == 0:
            _fail("dynamic_batching", "needs max_batch_size > 0 (a model that batches)")
        if db is not None and db.preferred_batch_size and db.preferred_batch_size[-1] > self.max_batch_size:
            _fail("dynamic_batching", f"preferred_batch_size {db.preferred_batch_size[-1]} is larger than "
                                      f"max_batch_size {self.max_batch_size}")
        if db is not None and db.min_batch > self.max_batch_size:
            _fail("dynamic_batching", f"min_batch {db.min_batch} is larger than max_batch_size {self.max_batch_size}")
        _check_tensors("input", self.inputs)
        _check_tensors("output", self.outputs)
        if not self.instance_group:
            _fail("instance_group", "needs at least one group")
        _check_fallback(self.fallback, self.instance_group)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    def triton_json(self) -> dict:
        """The configuration in Triton's JSON shape (``GET /v2/models/{m}/config``); vnpu's own keys
        (``min_batch``, ``fallback``) ride in ``parameters`` as string values, as Triton carries backend
        parameters."""
        out = {"name": self.name, "platform": self.platform, "backend": "",
               "version_policy": self.version_policy.triton_json(), "max_batch_size": self.max_batch_size,
               "input": [t.triton_json() for t in self.inputs], "output": [t.triton_json() for t in self.outputs],
               "instance_group": [g.triton_json(i, self.name) for i, g in enumerate(self.instance_group)],
               "parameters": {"fallback": {"string_value": fallback_text(self.fallback)}}}
        if self.dynamic_batching is not None:
            out["dynamic_batching"] = self.dynamic_batching.triton_json()
            out["parameters"]["min_batch"] = {"string_value": str(self.dynamic_batching.min_batch)}
        return out


__all__ = ["DynamicBatching", "INSTANCE_KINDS", "InstanceGroup", "ModelConfig", "ModelConfigError", "PLATFORM",
           "QueuePolicy", "TIMEOUT_ACTIONS", "TensorSpec", "VERSION_POLICIES", "VersionPolicy", "fallback_text"]
