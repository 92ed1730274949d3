"""``serve.yaml``: what ``vnpu serve`` serves and how (schema-validated; every error names the key and
its line), and model placement (``smollm2@0-2``).

    server:   {host: 127.0.0.1, port: 8000, allow_unauthenticated: false, replicas: 1}
    http:     {max_body_bytes: 2097152, max_header_bytes: 65536, header_timeout_s: 10, body_timeout_s: 30,
               max_connections_per_client: 128, max_connections: 1024,
               tokenizer_threads: 4}                                 # see runtime.serve.limits
    slo:      {target_p99_ms: 800, availability: 99.5%}
    tenants:
      - name: premium
        api_keys: [sk-premium-0123456789, "sha256:<64 hex digits>"]
        priority: 0                           # class: lower runs first
        quota: {concurrent_requests: 8, tokens_per_minute: 20000}
        models: [smollm2]                     # default: every model
        admin: false                          # admin keys reach /metrics and /admin/*
    models:
      - model: smollm2@0-2        # name[@devices]: "0", "0-2", "0,2"; no @: the next free devices
        tp: 3                     # devices of a generation model (tensor parallel when > 1)
        fallback: [3, cpu]        # the rest of the chain: device lists ("3", "4-5") or cpu
        engine: {max_num_seqs: 16, max_num_batched_tokens: 256, block_size: 16, max_model_len: 1024,
                 gpu_memory_utilization: 0.9, num_gpu_blocks_override: null, max_queued_requests: 64,
                 graphs: true, scheduling_policy: priority, priority_aging_s: 10}
        scheduler: {mode: adaptive, low_latency_batch: 2, max_wait_ms: 20}
      - model: minilm-l6@4        # an encoder: data parallel over its devices
        fallback: [5, cpu]        # encoders have a chain too (device lists or cpu)
        batching: {max_batch_size: 32, max_wait_ms: 5, max_queued_requests: 256}

Cross-checks: tenants with different priority classes need every generation model on the ``priority``
scheduling policy (under ``fcfs`` vLLM refuses priorities); ``adaptive`` needs ``slo.target_p99_ms``; a
tenant's ``models`` must be served; a fallback entry must not overlap its own first placement.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from devices.errors import InvalidParamError
from runtime.models import DECODER_MODELS, ENCODER_MODELS

from .engine.config import EngineConfig
from .engine.modes import ModeConfig
from .engine.placement import DeviceNamedTwice, Placement, device_list, parse_placement
from .heal.spec import SelfHealingSpec
from .limits import HttpLimits
from .tenants import Quota, Tenant, TenantRegistry, parse_key
from .yamlnodes import items, keyed
from .yamlnodes import name as _name
from .yamlnodes import line as _line

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
    fallback: tuple[Placement, ...] = ()        #: the rest of the chain after ``devices``
    #: where the spec was given (``serve.yaml: line 12: models[0]``, ``--model smollm2@0-2``): errors found
    #: later -- a device the cluster does not have -- name it
    origin: str = field(default="", compare=False)

    @property
    def kind(self) -> str:
        return MODEL_KINDS[self.name]

    @property
    def chain_devices(self) -> tuple[int, ...]:
        """Every device id the model's chain names (first placement and fallbacks)."""
        out = list(self.devices or ())
        for p in self.fallback:
            out += [d for d in p.devices if d not in out]
        return tuple(out)

    @property
    def device_count(self) -> int:
        if self.devices is not None:
            return len(self.devices)
        return (self.tp or 1) if self.kind == "generate" else 1


@dataclass(frozen=True)
class SloConfig:
    """``target_p99_ms``: end-to-end request latency target (adaptive mode, self-healing triggers);
    ``availability``: the share of requests that must succeed (0-1)."""
    target_p99_ms: float | None = None
    availability: float | None = None


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    models: tuple[ModelSpec, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    slo: SloConfig = field(default_factory=SloConfig)
    allow_unauthenticated: bool = False
    replicas: int = 1
    self_healing: SelfHealingSpec = field(default_factory=SelfHealingSpec)
    http: HttpLimits = field(default_factory=HttpLimits)

    def registry(self) -> TenantRegistry:
        return TenantRegistry(self.tenants)


# ---------------------------------------------------------------------------------------------- specs
def parse_devices(text: str, where: str = "") -> tuple[int, ...]:
    """``"2"`` -> (2,), ``"0-2"`` -> (0, 1, 2), ``"0,2"`` -> (0, 2)."""
    try:
        return device_list(text)
    except DeviceNamedTwice:
        raise ConfigError(f"{where}device list {text!r} names a device twice") from None
    except ValueError:
        raise ConfigError(f"{where}bad device list {text!r} (use 0, 0-2 or 0,2)") from None


def parse_model_spec(spec: str, where: str = "") -> tuple[str, tuple[int, ...] | None]:
    """``smollm2@0-2`` -> ("smollm2", (0, 1, 2)); ``minilm-l6`` -> ("minilm-l6", None)."""
    name, at, devs = str(spec).partition("@")
    name = name.strip()
    if name not in MODEL_KINDS:
        raise ConfigError(f"{where}unknown model {name!r} (known: {', '.join(sorted(MODEL_KINDS))})")
    return name, (parse_devices(devs, where) if at else None)


def place(models: tuple[ModelSpec, ...], device_count: int, reserved=()) -> tuple[ModelSpec, ...]:
    """Give every model without devices the next free ones (``tp`` of them for a generation model, one
    for an encoder; never a device some chain names as a fallback, nor one of ``reserved`` -- the devices
    compiled models name); check that the devices exist, that no two models share one, and that no
    fallback entry overlaps its own first placement.  An error names where the model was given
    (:attr:`ModelSpec.origin`: the file and line)."""
    def at(m: ModelSpec) -> str:
        return f"{m.origin}: model {m.name}" if m.origin else f"model {m.name}"
    used: set[int] = set()
    spares: set[int] = set()
    for m in models:
        for p in m.fallback:
            bad = [d for d in p.devices if d >= device_count]
            if bad:
                raise ConfigError(f"{at(m)}: fallback device {bad[0]} does not exist ({device_count} devices)")
            spares.update(p.devices)
    for m in models:
        if m.devices is not None:
            bad = [d for d in m.devices if d >= device_count]
            if bad:
                raise ConfigError(f"{at(m)}: device {bad[0]} does not exist ({device_count} devices)")
            own = set(m.devices).intersection(d for p in m.fallback for d in p.devices)
            if own:
                raise ConfigError(f"{at(m)}: device {min(own)} is both in its first placement and in its "
                                  f"fallback chain")
            clash = used.intersection(m.devices)
            if clash:
                raise ConfigError(f"{at(m)}: device {min(clash)} is already used by another model")
            used.update(m.devices)
    out = []
    taken = used | spares | set(reserved)
    for m in models:
        if m.devices is None:
            m = dataclasses.replace(m, devices=take_free(m.device_count, taken, device_count, at(m)))
        out.append(m)
    return tuple(out)


def take_free(n: int, taken: set[int], device_count: int, who: str) -> tuple[int, ...]:
    """The next ``n`` free devices (the lowest ids not in ``taken``; added to it) -- how every model without
    devices is placed; ConfigError naming ``who`` when fewer are left."""
    devs = [d for d in range(device_count) if d not in taken][:n]
    if len(devs) < n:
        raise ConfigError(f"{who}: needs {n} free device(s), only {len(devs)} left of {device_count}")
    taken.update(devs)
    return tuple(devs)


def devices_needed(models: tuple[ModelSpec, ...], explicit_extra=(), auto_extra: int = 0) -> int:
    """Devices a set of models needs: each model's first placement (the next free ones when none is given)
    plus every device a chain names explicitly; ``explicit_extra`` / ``auto_extra``: the devices other
    models (compiled ones) name, and how many they take from the free ones."""
    explicit = {d for m in models for d in m.chain_devices} | set(explicit_extra)
    auto = sum(m.device_count for m in models if m.devices is None) + auto_extra
    return max([len(explicit) + auto] + [d + 1 for d in explicit])


def model_spec(name: str, devices: tuple[int, ...] | None, tp: int | None, engine: EngineConfig | None = None,
               batching: BatchingConfig | None = None, where: str = "",
               fallback: tuple[Placement, ...] = ()) -> ModelSpec:
    kind = MODEL_KINDS[name]
    if kind == "embed" and tp not in (None, 1):
        raise ConfigError(f"{where}tp applies to generation models; {name} is an encoder (data parallel)")
    if kind == "generate" and devices is not None and tp is not None and tp != len(devices):
        raise ConfigError(f"{where}tp={tp} but {len(devices)} device(s) given for {name}")
    if kind == "generate" and devices is not None:
        tp = len(devices)
    return ModelSpec(name, devices, tp if kind == "generate" else None, engine or EngineConfig(),
                     batching or BatchingConfig(), tuple(fallback), origin=where.strip().rstrip(":"))


# ---------------------------------------------------------------------------------------------- schema
_INT, _NUM, _STR, _BOOL = "integer", "number", "string", "boolean"

ENGINE_SCHEMA = {"max_num_seqs": (_INT, 1), "max_num_batched_tokens": (_INT, 1), "block_size": (_INT, 1),
                 "max_model_len": (_INT, 2), "gpu_memory_utilization": (_NUM, None),
                 "num_gpu_blocks_override": (_INT, 2, True), "max_queued_requests": (_INT, 1),
                 "graphs": (_BOOL, None), "scheduling_policy": (_STR, None), "priority_aging_s": (_NUM, None)}
SCHEDULER_SCHEMA = {"mode": (_STR, None), "low_latency_batch": (_INT, 1), "max_wait_ms": (_NUM, 0)}
BATCHING_SCHEMA = {"max_batch_size": (_INT, 1), "max_wait_ms": (_NUM, 0), "max_queued_requests": (_INT, 1)}
SERVER_SCHEMA = {"host": (_STR, None), "port": (_INT, 0), "allow_unauthenticated": (_BOOL, None),
                 "replicas": (_INT, 1)}
HTTP_SCHEMA = {"max_body_bytes": (_INT, 1), "max_header_bytes": (_INT, 1), "header_timeout_s": (_NUM, None),
               "body_timeout_s": (_NUM, None), "max_connections_per_client": (_INT, 1), "max_connections": (_INT, 1),
               "tokenizer_threads": (_INT, 1)}
SLO_SCHEMA = {"target_p99_ms": (_NUM, None), "availability": (_STR, None)}
QUOTA_SCHEMA = {"concurrent_requests": (_INT, 1), "tokens_per_minute": (_INT, 1), "retry_after_s": (_NUM, None)}
TENANT_KEYS = ("name", "api_keys", "priority", "quota", "models", "admin")
MODEL_KEYS = {"model", "tp", "engine", "batching", "fallback", "scheduler"}
ROOT_KEYS = ("server", "http", "slo", "tenants", "models", "self_healing")


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
        key = _name(k, where, path, ConfigError)
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


def load_config(path: str | Path, served: tuple[str, ...] = ()) -> ServeConfig:
    """Read and validate ``serve.yaml``; ``served``: the other models the server serves (compiled models),
    which tenants may name too."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    return parse_config(text, str(path), served)


def parse_config(text: str, name: str = "serve.yaml", served: tuple[str, ...] = ()) -> ServeConfig:
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
        raise ConfigError(f"{where}line {_line(root)}: the file must be a mapping ({', '.join(ROOT_KEYS)})")
    nodes = {}
    for k, v in root.value:
        key = _name(k, where, "", ConfigError)
        if key not in ROOT_KEYS:
            raise ConfigError(f"{where}line {_line(k)}: unknown key {key} (known: {', '.join(ROOT_KEYS)})")
        nodes[key] = (k, v)
    cfg = ServeConfig()
    if "server" in nodes:
        s = _mapping(nodes["server"][1], SERVER_SCHEMA, where, "server")
        port = s.get("port", cfg.port)
        if port > 65535:
            raise ConfigError(f"{where}line {s['__line_port']}: server.port: must be <= 65535, got {port}")
        cfg = dataclasses.replace(cfg, host=s.get("host", cfg.host), port=port,
                                  allow_unauthenticated=s.get("allow_unauthenticated", False),
                                  replicas=s.get("replicas", 1))
    if "http" in nodes:
        v = nodes["http"][1]
        cfg = dataclasses.replace(cfg, http=_built(HttpLimits, _mapping(v, HTTP_SCHEMA, where, "http"), where, "http",
                                                   _line(v)))
    if "slo" in nodes:
        cfg = dataclasses.replace(cfg, slo=_slo(nodes["slo"][1], where))
    models: list[ModelSpec] = []
    if "models" in nodes:
        models = items(nodes["models"][1], where, "models", lambda m, at: _model(m, where, at, cfg.slo),
                       ConfigError, "models")
    names = [m.name for m in models]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ConfigError(f"{where}model {dup} is listed twice")
    tenants: list[Tenant] = []
    if "tenants" in nodes:
        v = nodes["tenants"][1]
        tenants = items(v, where, "tenants", lambda t, at: _tenant(t, where, at, names + list(served)), ConfigError,
                        "tenants")
        try:
            TenantRegistry(tuple(tenants))
        except InvalidParamError as e:
            raise ConfigError(f"{where}line {_line(v)}: tenants: {getattr(e, 'detail', e)}") from None
        classes = {t.priority for t in tenants}
        fcfs = [m.name for m in models if m.kind == "generate" and m.engine.scheduling_policy == "fcfs"]
        if fcfs and (len(classes) > 1 or classes != {0}):
            raise ConfigError(f"{where}line {_line(v)}: tenants: tenants have priority classes {sorted(classes)} but "
                              f"model {fcfs[0]} schedules fcfs (which refuses priorities); set its "
                              f"engine.scheduling_policy: priority")
    if "self_healing" in nodes:
        from .heal.config import parse_self_healing
        from .heal.spec import SpecError
        try:
            cfg = dataclasses.replace(cfg, self_healing=parse_self_healing(nodes["self_healing"][1], where, cfg.slo))
        except SpecError as e:
            raise ConfigError(getattr(e, "detail", str(e))) from None
    return dataclasses.replace(cfg, models=tuple(models), tenants=tuple(tenants))


def _slo(node, where: str) -> SloConfig:
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}line {_line(node)}: slo: expected a mapping (target_p99_ms, availability)")
    target = avail = None
    for k, v in node.value:
        key = _name(k, where, "slo", ConfigError)
        at = f"{where}line {_line(v)}: slo.{key}"
        if key == "target_p99_ms":
            target = _scalar(v, _NUM, None, False, at)
            if not target > 0:
                raise ConfigError(f"{at}: must be > 0, got {target!r}")
        elif key == "availability":
            raw = yaml.safe_load(yaml.serialize(v)) if isinstance(v, yaml.ScalarNode) else None
            try:
                avail = float(raw[:-1]) / 100 if isinstance(raw, str) and raw.endswith("%") else float(raw)
                if isinstance(raw, bool) or isinstance(raw, (int, float)) and raw > 1:
                    raise ValueError
            except (TypeError, ValueError):
                raise ConfigError(f"{at}: expected a percentage (99.5%) or a fraction (0.995), got {raw!r}") from None
            if not 0 < avail <= 1:
                raise ConfigError(f"{at}: must be in (0%, 100%], got {raw!r}")
        else:
            raise ConfigError(f"{where}line {_line(k)}: unknown key slo.{key} (known: target_p99_ms, availability)")
    return SloConfig(target, avail)


def _str_list(node, where: str, path: str) -> list[str]:
    return items(node, where, path, lambda x, at: str(_scalar(x, _STR, None, False, f"{where}line {_line(x)}: {at}")),
                 ConfigError)


def _tenant(node, where: str, path: str, models: list[str]) -> Tenant:
    keys = keyed(node, TENANT_KEYS, where, path, ConfigError, "a tenant (a mapping)")
    for req in ("name", "api_keys"):
        if req not in keys:
            raise ConfigError(f"{where}line {_line(node)}: {path}: the key '{req}' is required")
    nnode = keys["name"][1]
    name = _scalar(nnode, _STR, None, False, f"{where}line {_line(nnode)}: {path}.name")
    knode = keys["api_keys"][1]
    digests = []
    for i, (kv, text) in enumerate(zip(getattr(knode, "value", []) or [], _str_list(knode, where, f"{path}.api_keys"))):
        try:
            digests.append(parse_key(text))
        except InvalidParamError as e:
            raise ConfigError(f"{where}line {_line(kv)}: {path}.api_keys[{i}]: {getattr(e, 'detail', e)}") from None
    if not digests:
        raise ConfigError(f"{where}line {_line(knode)}: {path}.api_keys: a tenant needs at least one key")
    prio = 0
    if "priority" in keys:
        pn = keys["priority"][1]
        prio = _scalar(pn, _INT, None, False, f"{where}line {_line(pn)}: {path}.priority")
    admin = False
    if "admin" in keys:
        an = keys["admin"][1]
        admin = _scalar(an, _BOOL, None, False, f"{where}line {_line(an)}: {path}.admin")
    allowed = None
    if "models" in keys:
        mn = keys["models"][1]
        allowed = tuple(_str_list(mn, where, f"{path}.models"))
        unknown = [m for m in allowed if m not in models]
        if unknown:
            raise ConfigError(f"{where}line {_line(mn)}: {path}.models: {unknown[0]} is not served here "
                              f"(served: {', '.join(models) or 'none'})")
    quota = Quota()
    if "quota" in keys:
        qn = keys["quota"][1]
        quota = _built(Quota, _mapping(qn, QUOTA_SCHEMA, where, f"{path}.quota"), where, f"{path}.quota", _line(qn))
    try:
        return Tenant(name, tuple(digests), prio, quota, admin, allowed)
    except InvalidParamError as e:
        raise ConfigError(f"{where}line {_line(node)}: {path}: {getattr(e, 'detail', e)}") from None


def _model(node, where: str, path: str, slo: SloConfig = SloConfig()) -> ModelSpec:
    import yaml
    if isinstance(node, yaml.ScalarNode):
        at = f"{where}line {_line(node)}: {path}: "
        name, devs = parse_model_spec(node.value, at)
        return model_spec(name, devs, None, where=at)
    keys = keyed(node, sorted(MODEL_KEYS), where, path, ConfigError, "a model (name@devices or a mapping)")
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
    for sect, ok_kind in (("engine", "generate"), ("batching", "embed"), ("scheduler", "generate")):
        if sect in keys and kind != ok_kind:
            k = keys[sect][0]
            raise ConfigError(f"{where}line {_line(k)}: {path}.{sect}: applies to "
                              f"{'generation' if ok_kind == 'generate' else 'embedding'} models, not {name}")
    if "engine" in keys:
        v = keys["engine"][1]
        engine = _built(EngineConfig, _mapping(v, ENGINE_SCHEMA, where, f"{path}.engine"), where, f"{path}.engine",
                        _line(v))
    if "batching" in keys:
        v = keys["batching"][1]
        batching = _built(BatchingConfig, _mapping(v, BATCHING_SCHEMA, where, f"{path}.batching"), where,
                          f"{path}.batching", _line(v))
    if kind == "generate":
        mode_vals = {}
        line = _line(node)
        if "scheduler" in keys:
            v = keys["scheduler"][1]
            mode_vals, line = _mapping(v, SCHEDULER_SCHEMA, where, f"{path}.scheduler"), _line(v)
        if mode_vals.get("mode") == "adaptive" and slo.target_p99_ms is None:
            raise ConfigError(f"{where}line {mode_vals['__line_mode']}: {path}.scheduler.mode: adaptive sizes "
                              f"batches against slo.target_p99_ms; add slo: {{target_p99_ms: ...}}")
        mode = _built(ModeConfig, dict(mode_vals, target_p99_ms=slo.target_p99_ms), where, f"{path}.scheduler", line)
        engine = dataclasses.replace(engine or EngineConfig(), mode=mode)
    fallback: list[Placement] = []
    if "fallback" in keys:
        fnode = keys["fallback"][1]
        if not isinstance(fnode, yaml.SequenceNode):
            raise ConfigError(f"{where}line {_line(fnode)}: {path}.fallback: expected a list of placements "
                              f"(device lists like 3 or 4-5, or cpu)")
        for i, x in enumerate(fnode.value):
            if not isinstance(x, yaml.ScalarNode):
                raise ConfigError(f"{where}line {_line(x)}: {path}.fallback[{i}]: expected a placement (3, 4-5, cpu)")
            try:
                pl = parse_placement(x.value)
            except InvalidParamError as e:
                raise ConfigError(f"{where}line {_line(x)}: {path}.fallback[{i}]: {getattr(e, 'detail', e)}") from None
            if pl in fallback:
                raise ConfigError(f"{where}line {_line(x)}: {path}.fallback[{i}]: {pl} is listed twice")
            fallback.append(pl)
    return model_spec(name, devs, tp, engine, batching, f"{where}line {_line(node)}: {path}: ", tuple(fallback))
