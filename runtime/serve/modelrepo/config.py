"""``DIR/<name>/config.yaml``: one model's configuration, Triton's ``config.pbtxt`` fields in YAML (see
:mod:`.spec` for what each means).  Every key is optional; what is left out is completed from the
``.om`` (:func:`runtime.serve.modelrepo.omfile.complete`, Triton's auto-complete)::

    name: resnet                      # if given, the directory's name
    platform: vnpu_om                 # the only platform
    max_batch_size: 8                 # 0: no batch axis (dims are the full shape)
    version_policy: latest            # latest | all | {latest: {num_versions: 2}} | {specific: {versions: [1, 3]}}
    input:
      - {name: x, data_type: TYPE_FP32, dims: [3, 32, 32]}     # TYPE_FP32, FP32 or float32; -1: any size
    output:
      - {name: probs, data_type: TYPE_FP32, dims: [10]}
    dynamic_batching:                 # false: one request per execution; absent: Triton's defaults
      preferred_batch_size: [4, 8]
      max_queue_delay_microseconds: 2000          # or timeout_ms: 2 (the seed's name)
      min_batch: 2                                # vnpu: smaller batches wait for the delay
      max_batch: 8                                # the seed's name for max_batch_size (one of the two)
      priority_levels: 2
      default_priority_level: 2
      default_queue_policy: {timeout_action: REJECT, default_timeout_microseconds: 0,
                             allow_timeout_override: true, max_queue_size: 64}
      priority_queue_policy:
        1: {timeout_action: DELAY, default_timeout_microseconds: 50000, max_queue_size: 16}
    instance_group:
      - {count: 2, kind: KIND_NPU, devices: [0, 1]}      # KIND_GPU and gpus: are read as KIND_NPU / devices
      - {count: 1, kind: KIND_CPU}
    fallback: [2, cpu]                # the chain an instance moves down (default [cpu]; cpu last)

Every mistake is a :class:`~.spec.ModelConfigError` ``<file>: line N: <key path>: <what is wrong>``.
Reading blocks on the file; parsing is host-only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from devices.errors import InvalidParamError

from ..engine.placement import Placement, device_list, parse_placement
from ..yamlnodes import boolean, integer, items, keyed, line, number, one_of, text, value
from .datatypes import v2_datatype
from .spec import (INSTANCE_KINDS, PLATFORM, TIMEOUT_ACTIONS, DynamicBatching, InstanceGroup, ModelConfig,
                   ModelConfigError, QueuePolicy, TensorSpec, VersionPolicy)

CONFIG_FILE = "config.yaml"
E = ModelConfigError
MODEL_KEYS = ("name", "platform", "max_batch_size", "version_policy", "input", "output", "dynamic_batching",
              "instance_group", "fallback")
TENSOR_KEYS = ("name", "data_type", "dims")
BATCHING_KEYS = ("preferred_batch_size", "max_queue_delay_microseconds", "timeout_ms", "min_batch", "max_batch",
                 "priority_levels", "default_priority_level", "default_queue_policy", "priority_queue_policy")
QUEUE_KEYS = ("timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size")
GROUP_KEYS = ("name", "count", "kind", "devices", "gpus")
#: ModelConfig field -> the YAML key it is read from (where they differ)
FIELD_KEYS = {"inputs": "input", "outputs": "output"}


@dataclass(frozen=True)
class ParsedConfig:
    """What a ``config.yaml`` gives: ``values`` (ModelConfig field -> value, only the keys given) and the
    line of each key path (``lines``), so that a later check against the ``.om`` can name the line."""
    name: str
    file: str = ""
    values: tuple[tuple[str, object], ...] = ()
    lines: tuple[tuple[str, int], ...] = ()

    def given(self, field: str) -> bool:
        return any(k == field for k, _ in self.values)

    def get(self, field: str, default=None):
        return dict(self.values).get(field, default)

    def at(self, path: str) -> str:
        """``<file>: line N: <path>: `` for a key path (``input[0].dims``), or the file alone (or nothing,
        for a config derived from the .om) when the path was not in the file."""
        ln = dict(self.lines).get(path)
        where = f"{self.file}: " if self.file else ""
        return f"{where}line {ln}: {path}: " if ln else (f"{where}{path}: " if where else f"{path}: ")

    def build(self, **fields) -> ModelConfig:
        """The :class:`ModelConfig` of the given values with ``fields`` filled in (the given ones win); a
        value the config refuses is reported at its key's line."""
        kw = dict(fields, **dict(self.values), name=self.name)
        try:
            return ModelConfig(**kw)
        except ModelConfigError as e:
            key, _, msg = e.detail.partition(": ")
            raise E(f"{self.at(key)}{msg}") from None


def load_model_config(path: str | Path, name: str) -> ParsedConfig:
    """Read ``config.yaml`` of model ``name`` (the directory's name).  Blocks on the file."""
    try:
        data = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise E(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    return parse_model_config(data, name, str(path))


def parse_model_config(data: str, name: str, file: str = CONFIG_FILE) -> ParsedConfig:
    import yaml
    where = f"{file}: "
    try:
        root = yaml.compose(data)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise E(f"{where}line {mark.line + 1 if mark else '?'}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if root is None:
        return ParsedConfig(name, file)
    keys = keyed(root, MODEL_KEYS, where, "", E, f"a mapping ({', '.join(MODEL_KEYS)})")
    vals: dict[str, object] = {}
    lines = {k: line(v) for k, (_, v) in keys.items()}
    if "name" in keys:
        given = value(keys["name"][1], where, "name", E, text)
        if given != name:
            raise E(f"{where}line {lines['name']}: name: {given!r} differs from the model's directory {name!r}")
    if "platform" in keys:
        value(keys["platform"][1], where, "platform", E, one_of((PLATFORM,)))
    if "max_batch_size" in keys:
        vals["max_batch_size"] = value(keys["max_batch_size"][1], where, "max_batch_size", E, integer(0))
    for key, field in (("input", "inputs"), ("output", "outputs")):
        if key in keys:
            vals[field] = tuple(items(keys[key][1], where, key, lambda n, at: _tensor(n, where, at, lines), E,
                                      "tensors (name, data_type, dims)"))
    if "dynamic_batching" in keys:
        vals["dynamic_batching"] = _dynamic_batching(keys["dynamic_batching"][1], where, vals, lines)
    if "instance_group" in keys:
        vals["instance_group"] = tuple(items(keys["instance_group"][1], where, "instance_group",
                                             lambda n, at: _group(n, where, at), E, "instance groups"))
    if "fallback" in keys:
        vals["fallback"] = _fallback(keys["fallback"][1], where)
    if "version_policy" in keys:
        vals["version_policy"] = _version_policy(keys["version_policy"][1], where)
    return ParsedConfig(name, file, tuple(vals.items()), tuple(lines.items()))


def _built(cls, kw: dict, where: str, path: str, node, knodes: dict):
    """``cls(**kw)``; its own check's error (``key: why``) at the key's line (the node's if not given)."""
    try:
        return cls(**kw)
    except ModelConfigError as e:
        key, _, msg = e.detail.partition(": ")
        at = line(knodes[key][1]) if key in knodes else line(node)
        raise E(f"{where}line {at}: {path}.{key}: {msg}") from None


def _dims(v) -> tuple[int, ...]:
    if not isinstance(v, list) or any(not isinstance(d, int) or isinstance(d, bool) for d in v):
        raise ValueError(f"expected a list of sizes (-1: any), got {v!r}")
    return tuple(v)


def _tensor(node, where: str, path: str, lines: dict) -> TensorSpec:
    keys = keyed(node, TENSOR_KEYS, where, path, E, "a tensor (name, data_type, dims)")
    for req in TENSOR_KEYS:
        if req not in keys:
            raise E(f"{where}line {line(node)}: {path}: the key '{req}' is required")
    lines.update({f"{path}.{k}": line(v) for k, (_, v) in keys.items()})
    kw = {"name": value(keys["name"][1], where, f"{path}.name", E, text),
          "datatype": value(keys["data_type"][1], where, f"{path}.data_type", E, v2_datatype),
          "dims": value(keys["dims"][1], where, f"{path}.dims", E, _dims)}
    return _built(TensorSpec, kw, where, path, node, keys)


def _queue_policy(node, where: str, path: str) -> QueuePolicy:
    keys = keyed(node, QUEUE_KEYS, where, path, E, f"a queue policy ({', '.join(QUEUE_KEYS)})")
    read = {"timeout_action": one_of(TIMEOUT_ACTIONS), "default_timeout_microseconds": integer(0),
            "allow_timeout_override": boolean, "max_queue_size": integer(0)}
    kw = {k: value(v, where, f"{path}.{k}", E, read[k]) for k, (_, v) in keys.items()}
    return _built(QueuePolicy, kw, where, path, node, keys)


def _level_policies(node, where: str, path: str) -> tuple[tuple[int, QueuePolicy], ...]:
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise E(f"{where}line {line(node)}: {path}: expected a mapping of priority level -> queue policy")
    out = []
    for k, v in node.value:
        level = value(k, where, path, E, integer(1))
        out.append((level, _queue_policy(v, where, f"{path}.{level}")))
    return tuple(out)


def _delay_us(ms) -> int:
    v = number(0)(ms)
    if math.isinf(v):
        raise ValueError(f"expected a finite number of milliseconds, got {ms!r}")
    return int(round(v * 1000))


def _dynamic_batching(node, where: str, vals: dict, lines: dict) -> DynamicBatching | None:
    """The section (``false``: none; ``true`` or ``{}``: Triton's defaults); the seed's ``max_batch`` sets
    ``max_batch_size`` (into ``vals``), ``timeout_ms`` sets ``max_queue_delay_microseconds``."""
    import yaml
    path = "dynamic_batching"
    if isinstance(node, yaml.ScalarNode):
        return DynamicBatching() if value(node, where, path, E, boolean) else None
    keys = keyed(node, BATCHING_KEYS, where, path, E, f"a mapping ({', '.join(BATCHING_KEYS)}) or false")
    lines.update({f"{path}.{k}": line(v) for k, (_, v) in keys.items()})
    ints = {"max_queue_delay_microseconds": 0, "min_batch": 1, "priority_levels": 0, "default_priority_level": 0}
    kw: dict[str, object] = {k: value(keys[k][1], where, f"{path}.{k}", E, integer(lo))
                             for k, lo in ints.items() if k in keys}
    if "preferred_batch_size" in keys:
        kw["preferred_batch_size"] = tuple(items(keys["preferred_batch_size"][1], where, f"{path}.preferred_batch_size",
                                                 lambda n, at: value(n, where, at, E, integer(1)), E, "sizes"))
    _alias(keys, "timeout_ms", "max_queue_delay_microseconds", kw, _delay_us, where)
    if "max_batch" in keys:
        mb = value(keys["max_batch"][1], where, f"{path}.max_batch", E, integer(1))
        if vals.get("max_batch_size", mb) != mb:
            raise E(f"{where}line {lines[f'{path}.max_batch']}: {path}.max_batch: {mb} differs from max_batch_size "
                    f"{vals['max_batch_size']} (max_batch is the seed's name for it: give one)")
        vals["max_batch_size"] = mb
        lines.setdefault("max_batch_size", lines[f"{path}.max_batch"])
    if "default_queue_policy" in keys:
        kw["default_queue_policy"] = _queue_policy(keys["default_queue_policy"][1], where,
                                                   f"{path}.default_queue_policy")
    if "priority_queue_policy" in keys:
        kw["priority_queue_policy"] = _level_policies(keys["priority_queue_policy"][1], where,
                                                      f"{path}.priority_queue_policy")
    return _built(DynamicBatching, kw, where, path, node, keys)


def _alias(keys: dict, alias: str, key: str, kw: dict, read, where: str) -> None:
    """``alias`` (the seed's name) read into ``kw[key]``; both given must agree."""
    if alias not in keys:
        return
    path = f"dynamic_batching.{alias}"
    v = value(keys[alias][1], where, path, E, read)
    if key in kw and kw[key] != v:
        raise E(f"{where}line {line(keys[alias][1])}: {path}: gives {v} for {key}, which is {kw[key]} (give one)")
    kw[key] = v


def _group(node, where: str, path: str) -> InstanceGroup:
    keys = keyed(node, GROUP_KEYS, where, path, E, f"an instance group ({', '.join(GROUP_KEYS)})")
    if "devices" in keys and "gpus" in keys:
        raise E(f"{where}line {line(keys['gpus'][0])}: {path}.gpus: gpus is Triton's name for devices (give one)")
    kw: dict[str, object] = {}
    if "name" in keys:
        kw["name"] = value(keys["name"][1], where, f"{path}.name", E, text)
    if "count" in keys:
        kw["count"] = value(keys["count"][1], where, f"{path}.count", E, integer(1))
    if "kind" in keys:
        kind = value(keys["kind"][1], where, f"{path}.kind", E, one_of(INSTANCE_KINDS + ("KIND_GPU",)))
        kw["kind"] = "KIND_NPU" if kind == "KIND_GPU" else kind
    for key in ("devices", "gpus"):
        if key in keys:
            kw["devices"] = value(keys[key][1], where, f"{path}.{key}", E, _device_ids)
            keys["devices"] = keys[key]
    return _built(InstanceGroup, kw, where, path, node, keys)


def _device_ids(v) -> tuple[int, ...]:
    """``[0, 1]``, ``0`` or a device list string (``"0-2"``, ``"0,2"``)."""
    if isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in v):
        return tuple(v)
    try:
        return device_list(v)
    except ValueError:
        raise ValueError(f"expected device ids ([0, 1], 0-2 or 0,2), got {v!r}") from None


def _fallback(node, where: str) -> tuple[Placement, ...]:
    def one(n, at):
        try:
            return parse_placement(value(n, where, at, E, lambda v: v))
        except InvalidParamError as e:
            raise E(f"{where}line {line(n)}: {at}: {e.detail}") from None
    return tuple(items(node, where, "fallback", one, E, "placements (3, 4-5 or cpu)"))


def _version_policy(node, where: str) -> VersionPolicy:
    """``latest`` | ``all`` | ``{latest: {num_versions: N}}`` (or ``{latest: N}``) | ``{all: {}}`` |
    ``{specific: {versions: [..]}}`` (or ``{specific: [..]}``)."""
    import yaml
    path = "version_policy"
    if isinstance(node, yaml.ScalarNode):
        return VersionPolicy(value(node, where, path, E, one_of(("latest", "all"))))
    keys = keyed(node, ("latest", "all", "specific"), where, path, E, "latest, all or specific")
    if len(keys) != 1:
        raise E(f"{where}line {line(node)}: {path}: give one of latest, all, specific")
    (kind, (_, v)), = keys.items()
    at = f"{path}.{kind}"
    if kind == "all":
        value(v, where, at, E, _no_settings)
        return VersionPolicy("all")
    inner = "num_versions" if kind == "latest" else "versions"
    if isinstance(v, yaml.MappingNode):
        sub = keyed(v, (inner,), where, at, E, f"a mapping ({inner})")
        if inner not in sub:
            raise E(f"{where}line {line(v)}: {at}: the key '{inner}' is required")
        v, at = sub[inner][1], f"{at}.{inner}"
    if kind == "latest":
        return VersionPolicy("latest", num_versions=value(v, where, at, E, integer(1)))
    versions = items(v, where, at, lambda n, a: value(n, where, a, E, integer(1)), E, "versions")
    try:
        return VersionPolicy("specific", versions=tuple(versions))
    except ModelConfigError as e:
        raise E(f"{where}line {line(v)}: {at}: {e.detail.partition(': ')[2]}") from None


def _no_settings(v):
    if v not in (None, {}):
        raise ValueError(f"takes no settings, got {v!r}")
    return v


__all__ = ["CONFIG_FILE", "ParsedConfig", "load_model_config", "parse_model_config"]
