"""``serve.yaml``: what ``vnpu serve`` serves and how (schema-validated; every error names the key and
its line), and model placement (``smollm2@0-2``).

    server:   {host: 127.0.0.1, port: 8000}
    models:
      - model: smollm2@0          # name[@devices]: "0", "0-2", "0,2"; no @: the next free devices
        tp: 1                     # devices of a generation model (tensor parallel when > 1)
        engine: {max_num_seqs: 16, max_num_batched_tokens: 256, block_size: 16, max_model_len: 1024,
                 gpu_memory_utilization: 0.9, num_gpu_blocks_override: null, max_queued_requests: 64,
                 graphs: true, scheduling_policy: fcfs}
      - model: minilm-l6
        batching: {max_batch_size: 32, max_wait_ms: 5, max_queued_requests: 256}
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from devices.errors import InvalidParamError
from runtime.models import DECODER_MODELS, ENCODER_MODELS

from .engine.config import EngineConfig

#: model name -> engine kind (a registry: the server builds engines by kind)
MODEL_KINDS: dict[str, str] = {**{m: "generate" for m in DECODER_MODELS}, **{m: "embed" for m in ENCODER_MODELS}}


class ConfigError(InvalidParamError):
    """A bad ``serve.yaml`` or command-line model spec; the message names the key and the line."""


@dataclass(frozen=True)
class BatchingConfig:
    """Dynamic batching of an embedding model."""
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queued_requests: int = 256


@dataclass(frozen=True)
class ModelSpec:
    name: str
    devices: tuple[int, ...] | None = None      #: visible device ids; None: the next free ones
    tp: int | None = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    @property
    def kind(self) -> str:
        return MODEL_KINDS[self.name]

    @property
    def device_count(self) -> int:
        if self.devices is not None:
            return len(self.devices)
        return (self.tp or 1) if self.kind == "generate" else 1


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    models: tuple[ModelSpec, ...] = ()


# ---------------------------------------------------------------------------------------------- specs
def parse_devices(text: str, where: str = "") -> tuple[int, ...]:
    """``"2"`` -> (2,), ``"0-2"`` -> (0, 1, 2), ``"0,2"`` -> (0, 2)."""
    out: list[int] = []
    try:
        for part in str(text).split(","):
            a, _, b = part.strip().partition("-")
            lo, hi = int(a), int(b) if b else int(a)
            if lo < 0 or hi < lo:
                raise ValueError
            out.extend(range(lo, hi + 1))
    except ValueError:
        raise ConfigError(f"{where}bad device list {text!r} (use 0, 0-2 or 0,2)") from None
    if len(set(out)) != len(out):
        raise ConfigError(f"{where}device list {text!r} names a device twice")
    return tuple(out)


def parse_model_spec(spec: str, where: str = "") -> tuple[str, tuple[int, ...] | None]:
    """``smollm2@0-2`` -> ("smollm2", (0, 1, 2)); ``minilm-l6`` -> ("minilm-l6", None)."""
    name, at, devs = str(spec).partition("@")
    name = name.strip()
    if name not in MODEL_KINDS:
        raise ConfigError(f"{where}unknown model {name!r} (known: {', '.join(sorted(MODEL_KINDS))})")
    return name, (parse_devices(devs, where) if at else None)


def place(models: tuple[ModelSpec, ...], device_count: int) -> tuple[ModelSpec, ...]:
    """Give every model without devices the next free ones (``tp`` of them for a generation model, one
    for an encoder); check that the devices exist and that no two models share one."""
    used: set[int] = set()
    for m in models:
        if m.devices is not None:
            bad = [d for d in m.devices if d >= device_count]
            if bad:
                raise ConfigError(f"model {m.name}: device {bad[0]} does not exist ({device_count} devices)")
            clash = used.intersection(m.devices)
            if clash:
                raise ConfigError(f"model {m.name}: device {min(clash)} is already used by another model")
            used.update(m.devices)
    out = []
    nxt = 0
    for m in models:
        if m.devices is None:
            devs = []
            while len(devs) < m.device_count:
                while nxt in used:
                    nxt += 1
                if nxt >= device_count:
                    raise ConfigError(f"model {m.name}: needs {m.device_count} free device(s), only "
                                      f"{len(devs)} left of {device_count}")
                devs.append(nxt)
                used.add(nxt)
            m = dataclasses.replace(m, devices=tuple(devs))
        out.append(m)
    return tuple(out)


def model_spec(name: str, devices: tuple[int, ...] | None, tp: int | None, engine: EngineConfig | None = None,
               batching: BatchingConfig | None = None, where: str = "") -> ModelSpec:
    kind = MODEL_KINDS[name]
    if kind == "embed" and tp not in (None, 1):
        raise ConfigError(f"{where}tp applies to generation models; {name} is an encoder (data parallel)")
    if kind == "generate" and devices is not None and tp is not None and tp != len(devices):
        raise ConfigError(f"{where}tp={tp} but {len(devices)} device(s) given for {name}")
    if kind == "generate" and devices is not None:
        tp = len(devices)
    return ModelSpec(name, devices, tp if kind == "generate" else None, engine or EngineConfig(),
                     batching or BatchingConfig())


# ---------------------------------------------------------------------------------------------- schema
_INT, _NUM, _STR, _BOOL = "integer", "number", "string", "boolean"

ENGINE_SCHEMA = {"max_num_seqs": (_INT, 1), "max_num_batched_tokens": (_INT, 1), "block_size": (_INT, 1),
                 "max_model_len": (_INT, 2), "gpu_memory_utilization": (_NUM, None),
                 "num_gpu_blocks_override": (_INT, 2, True), "max_queued_requests": (_INT, 1),
                 "graphs": (_BOOL, None), "scheduling_policy": (_STR, None)}
BATCHING_SCHEMA = {"max_batch_size": (_INT, 1), "max_wait_ms": (_NUM, 0), "max_queued_requests": (_INT, 1)}
SERVER_SCHEMA = {"host": (_STR, None), "port": (_INT, 0)}
MODEL_KEYS = {"model", "tp", "engine", "batching"}


def _line(node) -> int:
    return node.start_mark.line + 1


def _scalar(node, kind: str, minimum, nullable: bool, where: str):
    import yaml
    if not isinstance(node, yaml.ScalarNode):
        raise ConfigError(f"{where}: expected a {kind}, got a {'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}")
    v = yaml.safe_load(yaml.serialize(node))
    if v is None and nullable:
        return None
    ok = {_INT: isinstance(v, int) and not isinstance(v, bool),
          _NUM: isinstance(v, (int, float)) and not isinstance(v, bool),
          _STR: isinstance(v, str), _BOOL: isinstance(v, bool)}[kind]
    if not ok:
        raise ConfigError(f"{where}: expected a {kind}, got {v!r}")
    if minimum is not None and v < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {v!r}")
    return v


def _mapping(node, schema: dict, where: str, path: str) -> dict:
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}line {_line(node)}: {path}: expected a mapping")
    out = {}
    for k, v in node.value:
        key = k.value
        if key not in schema:
            raise ConfigError(f"{where}line {_line(k)}: unknown key {path}.{key} (known: {', '.join(schema)})")
        spec = schema[key]
        out[key] = _scalar(v, spec[0], spec[1], len(spec) > 2, f"{where}line {_line(v)}: {path}.{key}")
        out[f"__line_{key}"] = _line(v)
    return out


def _built(cls, values: dict, where: str, path: str, line: int):
    """A frozen config from checked values; its own range checks (InvalidParamError) point at the
    offending key's line."""
    kw = {k: v for k, v in values.items() if not k.startswith("__line_")}
    try:
        return cls(**kw)
    except InvalidParamError as e:
        key = next((k for k in kw if str(e.detail if hasattr(e, "detail") else e).startswith(k)), None)
        ln = values.get(f"__line_{key}", line) if key else line
        raise ConfigError(f"{where}line {ln}: {path}{'.' + key if key else ''}: "
                          f"{getattr(e, 'detail', str(e))}") from None


def load_config(path: str | Path) -> ServeConfig:
    """Read and validate ``serve.yaml``."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    return parse_config(text, str(path))


def parse_config(text: str, name: str = "serve.yaml") -> ServeConfig:
    import yaml
    where = f"{name}: "
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"{where}line {mark.line + 1 if mark else '?'}: not valid YAML: "
                          f"{getattr(e, 'problem', e)}") from None
    if root is None:
        return ServeConfig()
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{where}line {_line(root)}: the file must be a mapping (server:, models:)")
    host, port, models = ServeConfig.host, ServeConfig.port, []
    for k, v in root.value:
        if k.value == "server":
            s = _mapping(v, SERVER_SCHEMA, where, "server")
            host, port = s.get("host", host), s.get("port", port)
            if port > 65535:
                raise ConfigError(f"{where}line {s['__line_port']}: server.port: must be <= 65535, got {port}")
        elif k.value == "models":
            if not isinstance(v, yaml.SequenceNode):
                raise ConfigError(f"{where}line {_line(v)}: models: expected a list of models")
            for i, m in enumerate(v.value):
                models.append(_model(m, where, f"models[{i}]"))
        else:
            raise ConfigError(f"{where}line {_line(k)}: unknown key {k.value} (known: server, models)")
    names = [m.name for m in models]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"{where}model {dup} is listed twice")
    return ServeConfig(host, port, tuple(models))


def _model(node, where: str, path: str) -> ModelSpec:
    import yaml
    if isinstance(node, yaml.ScalarNode):
        name, devs = parse_model_spec(node.value, f"{where}line {_line(node)}: {path}: ")
        return model_spec(name, devs, None)
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}line {_line(node)}: {path}: expected a model (name@devices or a mapping)")
    keys = {k.value: (k, v) for k, v in node.value}
    for key, (k, _) in keys.items():
        if key not in MODEL_KEYS:
            raise ConfigError(f"{where}line {_line(k)}: unknown key {path}.{key} (known: {', '.join(sorted(MODEL_KEYS))})")
    if "model" not in keys:
        raise ConfigError(f"{where}line {_line(node)}: {path}: the key 'model' (name[@devices]) is required")
    mnode = keys["model"][1]
    at = f"{where}line {_line(mnode)}: {path}.model: "
    name, devs = parse_model_spec(_scalar(mnode, _STR, None, False, at[:-2]), at)
    tp = None
    if "tp" in keys:
        tp = _scalar(keys["tp"][1], _INT, 1, False, f"{where}line {_line(keys['tp'][1])}: {path}.tp")
    engine = batching = None
    kind = MODEL_KINDS[name]
    for sect, schema, cls, ok_kind in (("engine", ENGINE_SCHEMA, EngineConfig, "generate"),
                                       ("batching", BATCHING_SCHEMA, BatchingConfig, "embed")):
        if sect in keys:
            k, v = keys[sect]
            if kind != ok_kind:
                raise ConfigError(f"{where}line {_line(k)}: {path}.{sect}: applies to "
                                  f"{'generation' if ok_kind == 'generate' else 'embedding'} models, not {name}")
            built = _built(cls, _mapping(v, schema, where, f"{path}.{sect}"), where, f"{path}.{sect}", _line(v))
            engine, batching = (built, batching) if sect == "engine" else (engine, built)
    return model_spec(name, devs, tp, engine, batching, f"{where}line {_line(node)}: {path}: ")
