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
        share_prefix_cache: false             # true: KV blocks shared with other sharing tenants
    models:
      - model: smollm2@0-2        # name[@devices]: "0", "0-2", "0,2"; no @: the next free devices
        tp: 3                     # devices of a generation model (tensor parallel when > 1)
        fallback: [3, cpu]        # the rest of the chain: device lists ("3", "4-5") or cpu
        engine: {max_num_seqs: 16, max_num_batched_tokens: 256, block_size: 16, max_model_len: 1024,
                 gpu_memory_utilization: 0.9, num_gpu_blocks_override: null, max_queued_requests: 64,
                 graphs: true, scheduling_policy: priority, priority_aging_s: 10, enable_prefix_caching: true,
                 quantization: none,       # gguf: the GGUF's quantized blocks stay in HBM
                 async_scheduling: true}
        scheduler: {mode: adaptive, low_latency_batch: 2, max_wait_ms: 20}
      - model: minilm-l6@4        # an encoder: data parallel over its devices
        fallback: [5, cpu]        # encoders have a chain too (device lists or cpu)
        batching: {max_batch_size: 32, max_wait_ms: 5, max_queued_requests: 256}

    devices:  {accelerator_v3: 0, accelerator_v2: 1}   # names for placements (defaults and fallback may use them)
    defaults: {placement: accelerator_v3, fallback: [accelerator_v2, cpu], scheduler: {...}, engine: {...},
               batching: {...}}                      # what every model without its own setting gets
    tags:     {premium_user: 0, batch_job: 10}       # request tag -> priority class (runtime.serve.tags)
    memory:   {strategy: fragmentation_aware, pool_bytes: 3221225472, defrag_interval_s: 180,
               overflow_protection: true}            # kept and reported; not acted on yet

The seed's dialect (the CANN runtime article's ``runtime_config.yaml``) is rewritten into these names first
(:mod:`runtime.serve.dialect`).

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
from .yamlnodes import items, keyed, unknown_key
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
class MemorySpec:
    """``memory:``: the device caching pool as the seed describes it (``strategy``, ``pool_bytes``,
    ``defrag_interval_s``, ``overflow_protection``), applied by :mod:`runtime.serve.memory_pool`."""
    strategy: str | None = None
    pool_bytes: int | None = None
    defrag_interval_s: float | None = None
    overflow_protection: bool | None = None

    def __post_init__(self):
        from .memory_pool import STRATEGIES
        if self.strategy is not None and self.strategy not in STRATEGIES:
            raise InvalidParamError(f"strategy {self.strategy!r} is unknown "
                                    f"(known: {', '.join(STRATEGIES)})")
        if self.pool_bytes is not None and self.pool_bytes <= 0:
            raise InvalidParamError(f"pool_bytes must be > 0, got {self.pool_bytes!r}")
        if self.defrag_interval_s is not None and not self.defrag_interval_s > 0:
            raise InvalidParamError(f"defrag_interval_s must be > 0, got {self.defrag_interval_s!r}")


@dataclass(frozen=True)
class Defaults:
    """``defaults:``: what every model without its own setting gets -- ``placement`` and ``fallback``
    (device lists, cpu, or names from ``devices:``), ``scheduler``, ``engine`` and ``batching`` values (key
    by key under the model's own)."""
    placement: str | None = None
    fallback: tuple[str, ...] = ()
    scheduler: tuple[tuple[str, object], ...] = ()
    engine: tuple[tuple[str, object], ...] = ()
    batching: tuple[tuple[str, object], ...] = ()


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
    defaults: Defaults = field(default_factory=Defaults)
    devices: tuple[tuple[str, str], ...] = ()       #: ``devices:`` names -> placements (as written)
    memory: MemorySpec = field(default_factory=MemorySpec)
    tags: tuple[tuple[str, int], ...] = ()          #: request tag -> priority class (``tags:``)
    #: what the file set that serve keeps but has no mechanism for (``config --print`` reports each)
    not_acted_on: tuple = field(default=(), compare=False)

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
                 "graphs": (_BOOL, None), "scheduling_policy": (_STR, None), "priority_aging_s": (_NUM, None),
                 "enable_prefix_caching": (_BOOL, None), "quantization": (_STR, None),
                 "async_scheduling": (_BOOL, None)}
SCHEDULER_SCHEMA = {"mode": (_STR, None), "low_latency_batch": (_INT, 1), "max_wait_ms": (_NUM, 0)}
BATCHING_SCHEMA = {"max_batch_size": (_INT, 1), "max_wait_ms": (_NUM, 0), "max_queued_requests": (_INT, 1)}
SERVER_SCHEMA = {"host": (_STR, None), "port": (_INT, 0), "allow_unauthenticated": (_BOOL, None),
                 "replicas": (_INT, 1)}
HTTP_SCHEMA = {"max_body_bytes": (_INT, 1), "max_header_bytes": (_INT, 1), "header_timeout_s": (_NUM, None),
               "body_timeout_s": (_NUM, None), "max_connections_per_client": (_INT, 1), "max_connections": (_INT, 1),
               "tokenizer_threads": (_INT, 1)}
SLO_SCHEMA = {"target_p99_ms": (_NUM, None), "availability": (_STR, None)}
QUOTA_SCHEMA = {"concurrent_requests": (_INT, 1), "tokens_per_minute": (_INT, 1), "retry_after_s": (_NUM, None),
                "hbm_bytes": (_INT, 1)}
TENANT_KEYS = ("name", "api_keys", "priority", "quota", "models", "admin", "hbm_quota", "circuit_breaker", "share_prefix_cache")
BREAKER_KEYS = ("error_rate", "window", "open_for", "min_requests")
MODEL_KEYS = {"model", "tp", "engine", "batching", "fallback", "scheduler"}
MEMORY_SCHEMA = {"strategy": (_STR, None), "pool_bytes": (_INT, 0), "defrag_interval_s": (_NUM, 0),
                 "overflow_protection": (_BOOL, None)}
DEFAULTS_KEYS = ("placement", "fallback", "scheduler", "engine", "batching")
ROOT_KEYS = ("server", "http", "slo", "tenants", "models", "self_healing", "defaults", "devices", "memory", "tags")

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
            raise ConfigError(unknown_key(key, list(schema), where, _line(k), path))
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
    from .dialect import NotActedOn, translate
    from .heal.spec import SpecError
    try:
        root, notes = translate(root, where)
    except SpecError as e:
        raise ConfigError(getattr(e, "detail", str(e))) from None
    nodes = {}
    for k, v in root.value:
        key = _name(k, where, "", ConfigError)
        if key not in ROOT_KEYS:
            raise ConfigError(unknown_key(key, ROOT_KEYS, where, _line(k), ""))
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
    if "devices" in nodes:
        cfg = dataclasses.replace(cfg, devices=_device_names(nodes["devices"][1], where))
    dflt = {}
    if "defaults" in nodes:
        dflt = keyed(nodes["defaults"][1], DEFAULTS_KEYS, where, "defaults", ConfigError,
                     f"a mapping ({', '.join(DEFAULTS_KEYS)})")
        cfg = dataclasses.replace(cfg, defaults=_defaults(dflt, where))
        names = dict(cfg.devices)
        unnamed = [n for n in (cfg.defaults.placement, *cfg.defaults.fallback)
                   if n is not None and n not in names and not _is_placement(n)]
        if unnamed:
            at = dflt["placement" if "placement" in dflt else "fallback"][1]
            notes += (NotActedOn("defaults", _line(at), ", ".join(unnamed),
                                 f"no devices: entry names {', '.join(unnamed)} (a model that takes these defaults "
                                 f"is refused until devices: {{{unnamed[0]}: 0, ...}} says which devices they are)"),)
    if "memory" in nodes:
        mv = _mapping(nodes["memory"][1], MEMORY_SCHEMA, where, "memory")
        cfg = dataclasses.replace(cfg, memory=_built(MemorySpec, mv, where, "memory", _line(nodes["memory"][1])))
    if "tags" in nodes:
        cfg = dataclasses.replace(cfg, tags=_tags(nodes["tags"][1], where))
    models: list[ModelSpec] = []
    if "models" in nodes:
        models = items(nodes["models"][1], where, "models",
                       lambda m, at: _model(m, where, at, cfg.slo, dflt, dict(cfg.devices)), ConfigError, "models")
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
    tag_classes = {c for _, c in cfg.tags} - {0}
    fcfs = [m.name for m in models if m.kind == "generate" and m.engine.scheduling_policy == "fcfs"]
    if tag_classes and fcfs:
        raise ConfigError(f"{where}line {_line(nodes['tags'][1])}: tags: tags give priority classes "
                          f"{sorted(tag_classes)} but model {fcfs[0]} schedules fcfs (which refuses priorities); set "
                          f"its engine.scheduling_policy: priority")
    if "self_healing" in nodes:
        from .heal.config import parse_self_healing
        try:
            cfg = dataclasses.replace(cfg, self_healing=parse_self_healing(nodes["self_healing"][1], where, cfg.slo))
        except SpecError as e:
            raise ConfigError(getattr(e, "detail", str(e))) from None
    return dataclasses.replace(cfg, models=tuple(models), tenants=tuple(tenants), not_acted_on=tuple(notes))


def _device_names(node, where: str) -> tuple[tuple[str, str], ...]:
    """``devices: {accelerator_v3: 0, accelerator_v2: 1-2}``: names for placements (what ``defaults`` and a
    model's ``fallback`` may name)."""
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}line {_line(node)}: devices: expected a mapping (name: placement)")
    out = []
    for k, v in node.value:
        key = _name(k, where, "devices", ConfigError)
        if not isinstance(v, yaml.ScalarNode):
            raise ConfigError(f"{where}line {_line(v)}: devices.{key}: expected a placement (3, 4-5, cpu)")
        if _is_placement(key):
            raise ConfigError(f"{where}line {_line(k)}: devices.{key}: a name must not read as a placement")
        try:
            parse_placement(str(v.value))
        except InvalidParamError as e:
            raise ConfigError(f"{where}line {_line(v)}: devices.{key}: {getattr(e, 'detail', e)}") from None
        out.append((key, str(v.value)))
    return tuple(out)


def _is_placement(text: str) -> bool:
    try:
        parse_placement(text)
        return True
    except InvalidParamError:
        return False


def _defaults(keys: dict, where: str) -> Defaults:
    """The ``defaults:`` section as written (checked again where a model takes it)."""
    def values(sect, schema):
        if sect not in keys:
            return ()
        vals = _mapping(keys[sect][1], schema, where, f"defaults.{sect}")
        return tuple((k, v) for k, v in vals.items() if not k.startswith("__line_"))
    placement = None
    if "placement" in keys:
        pn = keys["placement"][1]
        placement = str(pn.value) if hasattr(pn, "value") and not isinstance(pn.value, list) else None
        if placement is None:
            raise ConfigError(f"{where}line {_line(pn)}: defaults.placement: expected a placement or a device name")
    fallback: tuple[str, ...] = ()
    if "fallback" in keys:
        fallback = tuple(_str_list_any(keys["fallback"][1], where, "defaults.fallback"))
    return Defaults(placement, fallback, values("scheduler", SCHEDULER_SCHEMA), values("engine", ENGINE_SCHEMA),
                    values("batching", BATCHING_SCHEMA))


def _str_list_any(node, where: str, path: str) -> list[str]:
    import yaml
    if not isinstance(node, yaml.SequenceNode):
        raise ConfigError(f"{where}line {_line(node)}: {path}: expected a list of placements (3, 4-5, cpu) or names")
    out = []
    for i, x in enumerate(node.value):
        if not isinstance(x, yaml.ScalarNode):
            raise ConfigError(f"{where}line {_line(x)}: {path}[{i}]: expected a placement (3, 4-5, cpu) or a name")
        out.append(str(x.value))
    return out


def _tags(node, where: str) -> tuple[tuple[str, int], ...]:
    """``tags: {premium_user: 0, batch_job: 10}``: request tag -> priority class."""
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{where}line {_line(node)}: tags: expected a mapping (tag: priority class)")
    out = []
    for k, v in node.value:
        key = _name(k, where, "tags", ConfigError)
        if key in dict(out):
            raise ConfigError(f"{where}line {_line(k)}: tags.{key}: listed twice")
        out.append((key, _scalar(v, _INT, None, False, f"{where}line {_line(v)}: tags.{key}")))
    return tuple(out)


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
            raise ConfigError(unknown_key(key, ("target_p99_ms", "availability"), where, _line(k), "slo"))
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
    share = False
    if "share_prefix_cache" in keys:
        sn = keys["share_prefix_cache"][1]
        share = _scalar(sn, _BOOL, None, False, f"{where}line {_line(sn)}: {path}.share_prefix_cache")
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
    if "hbm_quota" in keys:                         # the seed's spelling: hbm_quota: "1GB" -> quota.hbm_bytes
        from .dialect import parse_bytes
        hn = keys["hbm_quota"][1]
        try:
            hbm = parse_bytes(_scalar_any(hn, f"{where}line {_line(hn)}: {path}.hbm_quota"), "hbm_quota")
            quota = dataclasses.replace(quota, hbm_bytes=hbm)
        except InvalidParamError as e:
            raise ConfigError(f"{where}line {_line(hn)}: {path}.hbm_quota: {getattr(e, 'detail', e)}") from None
    breaker = _breaker(keys["circuit_breaker"][1], where, f"{path}.circuit_breaker") if "circuit_breaker" in keys else None
    try:
        return Tenant(name, tuple(digests), prio, quota, admin, allowed, breaker, share)
    except InvalidParamError as e:
        raise ConfigError(f"{where}line {_line(node)}: {path}: {getattr(e, 'detail', e)}") from None


def _breaker(node, where: str, path: str):
    """``circuit_breaker: {error_rate: 50%, window: 30s, open_for: 60s, min_requests: 5}``."""
    from .circuit import BreakerSpec
    from .heal.spec import parse_duration, parse_fraction
    keys = keyed(node, BREAKER_KEYS, where, path, ConfigError, "a circuit breaker (a mapping)")
    parse = {"error_rate": ("error_rate", parse_fraction), "window": ("window_s", parse_duration),
             "open_for": ("open_for_s", parse_duration), "min_requests": ("min_requests", None)}
    kw = {}
    for key, (_, vn) in keys.items():
        field, fn = parse[key]
        at = f"{where}line {_line(vn)}: {path}.{key}"
        try:
            kw[field] = _scalar(vn, _INT, None, False, at) if fn is None else fn(_scalar_any(vn, at), key)
        except ConfigError:
            raise
        except InvalidParamError as e:
            msg = str(getattr(e, "detail", e))
            raise ConfigError(f"{at}: {msg.removeprefix(key + ': ')}") from None
    try:
        return BreakerSpec(**kw)
    except InvalidParamError as e:
        raise ConfigError(f"{where}line {_line(node)}: {path}: {getattr(e, 'detail', e)}") from None


def _scalar_any(node, where: str):
    import yaml
    if not isinstance(node, yaml.ScalarNode):
        raise ConfigError(f"{where}: expected a single value")
    return yaml.safe_load(yaml.serialize(node))


def _resolve(text: str, names: dict, where: str, path: str, line: int) -> Placement:
    """A placement (``3``, ``4-5``, ``cpu``) or a name from ``devices:``."""
    try:
        return parse_placement(names.get(text, text))
    except InvalidParamError:
        raise ConfigError(f"{where}line {line}: {path}: {text!r} is neither a placement (3, 4-5, cpu) nor a "
                          f"name in devices: (known: {', '.join(names) or 'none'}; add devices: {{{text}: 0}})") from None


def _model(node, where: str, path: str, slo: SloConfig = SloConfig(), dflt: dict | None = None,
           names: dict | None = None) -> ModelSpec:
    """One model; ``dflt``: the ``defaults:`` keys (key -> (key node, value node)), taken where the model
    has no setting of its own; ``names``: the ``devices:`` names."""
    import yaml
    dflt, names = dflt or {}, names or {}
    if isinstance(node, yaml.ScalarNode):
        node = yaml.MappingNode("tag:yaml.org,2002:map", [(yaml.ScalarNode("tag:yaml.org,2002:str", "model",
                                                                            node.start_mark, node.end_mark), node)],
                                node.start_mark, node.end_mark)
    keys = keyed(node, sorted(MODEL_KEYS), where, path, ConfigError, "a model (name@devices or a mapping)")
    if "model" not in keys:
        raise ConfigError(f"{where}line {_line(node)}: {path}: the key 'model' (name[@devices]) is required")
    mnode = keys["model"][1]
    at = f"{where}line {_line(mnode)}: {path}.model: "
    name, devs = parse_model_spec(_scalar(mnode, _STR, None, False, at[:-2]), at)
    if devs is None and "placement" in dflt:
        pn = dflt["placement"][1]
        pl = _resolve(str(pn.value), names, where, "defaults.placement", _line(pn))
        if pl.cpu:
            raise ConfigError(f"{where}line {_line(pn)}: defaults.placement: a first placement needs devices, not cpu")
        devs = pl.devices
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
    def merged(sect: str, schema: dict) -> tuple[dict, int, str]:
        """The section's values over the defaults' (and the line and path errors name)."""
        vals, line, at = {}, _line(node), f"{path}.{sect}"
        if sect in dflt:
            d = dflt[sect][1]
            vals, line, at = _mapping(d, schema, where, f"defaults.{sect}"), _line(d), f"defaults.{sect}"
        if sect in keys:
            v = keys[sect][1]
            vals, line, at = {**vals, **_mapping(v, schema, where, f"{path}.{sect}")}, _line(v), f"{path}.{sect}"
        return vals, line, at
    if kind == "generate" and ("engine" in keys or "engine" in dflt):
        vals, line, at = merged("engine", ENGINE_SCHEMA)
        engine = _built(EngineConfig, vals, where, at, line)
    if kind == "embed" and ("batching" in keys or "batching" in dflt):
        vals, line, at = merged("batching", BATCHING_SCHEMA)
        batching = _built(BatchingConfig, vals, where, at, line)
    if kind == "generate":
        mode_vals, line, spath = merged("scheduler", SCHEDULER_SCHEMA)
        if mode_vals.get("mode") == "adaptive" and slo.target_p99_ms is None:
            raise ConfigError(f"{where}line {mode_vals['__line_mode']}: {spath}.mode: adaptive sizes "
                              f"batches against slo.target_p99_ms; add slo: {{target_p99_ms: ...}}")
        mode = _built(ModeConfig, dict(mode_vals, target_p99_ms=slo.target_p99_ms), where, spath, line)
        engine = dataclasses.replace(engine or EngineConfig(), mode=mode)
    fallback: list[Placement] = []
    fsrc = keys if "fallback" in keys else dflt
    fpath = f"{path}.fallback" if "fallback" in keys else "defaults.fallback"
    if "fallback" in fsrc:
        fnode = fsrc["fallback"][1]
        if not isinstance(fnode, yaml.SequenceNode):
            raise ConfigError(f"{where}line {_line(fnode)}: {path}.fallback: expected a list of placements "
                              f"(device lists like 3 or 4-5, or cpu)")
        for i, x in enumerate(fnode.value):
            if not isinstance(x, yaml.ScalarNode):
                raise ConfigError(f"{where}line {_line(x)}: {fpath}[{i}]: expected a placement (3, 4-5, cpu)")
            if x.value in names:
                pl = _resolve(x.value, names, where, f"{fpath}[{i}]", _line(x))
            else:
                try:
                    pl = parse_placement(x.value)
                except InvalidParamError as e:
                    raise ConfigError(f"{where}line {_line(x)}: {fpath}[{i}]: {getattr(e, 'detail', e)}"
                                      f"{' (or a name in devices:)' if not names else ''}") from None
            if pl in fallback:
                raise ConfigError(f"{where}line {_line(x)}: {fpath}[{i}]: {pl} is listed twice")
            fallback.append(pl)
    return model_spec(name, devs, tp, engine, batching, f"{where}line {_line(node)}: {path}: ", tuple(fallback))
