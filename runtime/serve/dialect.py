"""The seed's dialect of ``serve.yaml``: the ``runtime_config.yaml`` of the CANN runtime article (seed 004),
accepted beside vnpu's own names.  One schema: :func:`translate` rewrites the dialect's YAML nodes into
vnpu's canonical ones *before* the schema checks (:mod:`runtime.serve.config`), keeping every node's line,
so an error in a dialect file still names its file, line and key path; an unknown key still fails (with
a did-you-mean).  ``vnpu serve config --print`` shows the canonical form.

Every alias is in the tables below (and nowhere else); docs/serving/cann-dialect.md
lists them.

========================================================  =================================================
seed                                                      vnpu (canonical)
========================================================  =================================================
``scheduler.mode: adaptive | auto | manual | hybrid``     ``defaults.scheduler.mode``, the same names
                                                          (:mod:`runtime.serve.engine.modes`)
``strategies[dynamic_batching].min_batch``                ``defaults.scheduler.low_latency_batch``
``strategies[dynamic_batching].max_batch``                ``defaults.engine.max_num_seqs`` and
                                                          ``defaults.batching.max_batch_size``
``strategies[dynamic_batching].timeout_ms``               ``defaults.scheduler.max_wait_ms`` and
                                                          ``defaults.batching.max_wait_ms``
``strategies[dynamic_batching].enabled: false``           ``defaults.engine.max_num_seqs: 1`` (no batching)
``strategies[stream_priority].rules[{tag, priority}]``    ``tags: {<tag>: <class>}`` (:data:`PRIORITY_WORDS`) and
                                                          ``defaults.engine.scheduling_policy: priority``
``strategies[fallback_chain].primary``                    ``defaults.placement``
``strategies[fallback_chain].fallbacks``                  ``defaults.fallback`` (:data:`DEVICE_NAMES`)
``strategies[fallback_chain].switch_threshold``           a ``self_healing`` trigger, action ``fallback``
``memory.pool_size: 3GB``                                 ``memory.pool_bytes`` (:func:`parse_bytes`)
``memory.defrag_interval: 3m``                            ``memory.defrag_interval_s``
``memory.strategy``, ``memory.overflow_protection``       same names
``self_healing.triggers[{metric, threshold, ...}]``       ``{name, metric, condition, window, action, params}``
                                                          (:data:`METRICS`, :data:`ACTIONS`, :func:`condition`)
``threshold: "sudden_drop>40% in 1m"``                    ``{condition: "> 0.4", aggregate: drop, window: 60}``
                                                          (:data:`RELATIVE_WORDS`)
``self_healing.recovery.health_check: "/health?..."``     ``health_check: true`` (the deep check)
========================================================  =================================================

What vnpu accepts but does not act on (no such mechanism yet) is kept as a :class:`NotActedOn` -- the
path, the line, what was written and why -- and ``config --print`` reports each as "accepted, not acted
on: <why>"; nothing is ignored silently.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .heal.spec import SpecError, parse_duration, parse_fraction
from .yamlnodes import line as _line
from .yamlnodes import name as _name
from .yamlnodes import unknown_key

#: seed scheduler mode -> (vnpu mode, note; "" when the meaning is the same)
MODES: dict[str, tuple[str, str]] = {
    "adaptive": ("adaptive", ""),
    "auto": ("auto", ""),
    "manual": ("manual", ""),
    "hybrid": ("hybrid", ""),
}
#: seed priority word -> vnpu priority class (vLLM's meaning: lower runs first); integers pass through
PRIORITY_WORDS: dict[str, int] = {"high": 0, "normal": 5, "low": 10}
#: seed device names -> vnpu placements; any other name must be defined in the ``devices:`` section
DEVICE_NAMES: dict[str, str] = {"cpu_fallback": "cpu", "cpu": "cpu"}
#: seed metric -> vnpu metric (runtime.observe.metrics_store.METRICS), or None and why not
METRICS: dict[str, tuple[str | None, str]] = {
    "error_rate": ("error_rate", ""),
    "memory_fragmentation": ("hbm_fragmentation", ""),
    "device_temperature": ("device_temperature_c", ""),
    "qps": ("qps", ""),
    "latency": ("p99_latency_ms", ""),
    "network_latency": ("p99_latency_ms", ""),    # the latency the server sees: end to end, p99
}
#: seed action (its first word) -> (vnpu action, its parameter built from the rest, or None and why not)
ACTIONS: dict[str, tuple[str | None, str]] = {
    "restart_worker": ("restart_engine", ""),
    "trigger_defrag": ("defragment", ""),
    "throttle_requests": ("throttle", ""),
    "throttle_requests_by": ("throttle", "by"),
    "scale_workers": ("scale_out", "replicas"),
    "cache_recent_results": ("cache_results", ""),
}
#: seed relative condition word -> vnpu window aggregate (``sudden_drop>40% in 1m``: drop > 0.4 over 60 s)
RELATIVE_WORDS: dict[str, str] = {"sudden_drop": "drop", "sudden_rise": "rise", "drop": "drop", "rise": "rise"}
#: the seed's strategy entries and their keys
STRATEGY_KEYS: dict[str, tuple[str, ...]] = {
    "dynamic_batching": ("name", "enabled", "min_batch", "max_batch", "timeout_ms"),
    "stream_priority": ("name", "rules"),
    "fallback_chain": ("name", "primary", "fallbacks", "switch_threshold"),
}
SCHEDULER_KEYS = ("mode", "strategies")
MEMORY_KEYS = {"strategy": "strategy", "pool_size": "pool_bytes", "defrag_interval": "defrag_interval_s",
               "overflow_protection": "overflow_protection"}
SEED_TRIGGER_KEYS = ("name", "metric", "threshold", "window", "action", "cooldown", "aggregate", "lead", "model")
#: sizes are binary, as memory tools print them (npu-smi's and nvidia-smi's "MB" are MiB): 3GB = 3 GiB
_BYTE_UNITS = {"": 1, "b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

_T = "tag:yaml.org,2002:"


class DialectError(SpecError):
    """A bad value in the seed's dialect (the message names the file, line and key path)."""


@dataclass(frozen=True)
class NotActedOn:
    """A setting vnpu accepts and keeps but has no mechanism for: where (``path``, ``line``), what was
    written (``value``) and why it has no effect."""
    path: str
    line: int
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.path} = {self.value} (line {self.line}): accepted, not acted on: {self.why}"


# ---------------------------------------------------------------------------------------------- units
def parse_bytes(v, what: str = "size") -> int:
    """``3GB`` / ``3GiB`` (3 * 2^30), ``512MB``, a number of bytes."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b|b)?\s*", str(v), re.I) if isinstance(v, str) else None
    if m is None:
        raise DialectError(f"{what}: expected a size (3GB, 512MiB, bytes), got {v!r}")
    return int(float(m.group(1)) * _BYTE_UNITS[(m.group(2) or "").lower()])


def parse_celsius(v, what: str = "temperature") -> float:
    """``85°C``, ``85C``, ``85``."""
    m = re.fullmatch(r"\s*(-?[0-9]*\.?[0-9]+)\s*(°\s*C|C)?\s*", str(v), re.I) if not isinstance(v, bool) else None
    if m is None:
        raise DialectError(f"{what}: expected a temperature (85°C), got {v!r}")
    return float(m.group(1))


def threshold_value(text, unit: str, what: str) -> float:
    """A threshold in the unit of a vnpu metric (``ratio``: ``5%``; ``C``: ``85°C``; ``ms``: ``500ms``)."""
    if unit == "ratio":
        return parse_fraction(text, what)
    if unit == "C":
        return parse_celsius(text, what)
    if unit == "ms":
        return parse_duration(text, what) * 1000 if isinstance(text, str) else float(text)
    try:
        return float(text)
    except (TypeError, ValueError):
        raise DialectError(f"{what}: expected a number, got {text!r}") from None


def condition(threshold, unit: str, what: str) -> str:
    """The vnpu condition of a seed threshold: ``"5%"`` -> ``"> 0.05"``, ``"< 85°C"`` -> ``"< 85"``."""
    m = re.fullmatch(r"\s*(>=|<=|>|<)?\s*(.+?)\s*", str(threshold))
    if m is None:
        raise DialectError(f"{what}: expected a threshold (5%, 85°C, 500ms), got {threshold!r}")
    value = threshold_value(m.group(2) if isinstance(threshold, str) else threshold, unit, what)
    return f"{m.group(1) or '>'} {value:g}"


# ---------------------------------------------------------------------------------------------- nodes
def _node(v, at):
    """A YAML node for the Python value ``v`` with the marks of node ``at`` (errors keep its line)."""
    import yaml
    s, e = at.start_mark, at.end_mark
    if isinstance(v, yaml.Node):
        return v
    if isinstance(v, dict):
        return yaml.MappingNode(_T + "map", [(_node(k, at), _node(x, at)) for k, x in v.items()], s, e)
    if isinstance(v, (list, tuple)):
        return yaml.SequenceNode(_T + "seq", [_node(x, at) for x in v], s, e)
    if isinstance(v, bool):
        return yaml.ScalarNode(_T + "bool", "true" if v else "false", s, e)
    if v is None:
        return yaml.ScalarNode(_T + "null", "null", s, e)
    if isinstance(v, int):
        return yaml.ScalarNode(_T + "int", str(v), s, e)
    if isinstance(v, float):
        return yaml.ScalarNode(_T + "float", repr(v), s, e)
    return yaml.ScalarNode(_T + "str", str(v), s, e)


def _value(node, where: str, path: str):
    import yaml
    if not isinstance(node, yaml.ScalarNode):
        raise DialectError(f"{where}line {_line(node)}: {path}: expected a single value")
    return yaml.safe_load(yaml.serialize(node))


def _pairs(node, known, where: str, path: str) -> dict:
    """key -> (key node, value node); unknown keys fail with the line and a did-you-mean."""
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise DialectError(f"{where}line {_line(node)}: {path}: expected a mapping ({', '.join(known)})")
    out = {}
    for k, v in node.value:
        key = _name(k, where, path, DialectError)
        if key not in known:
            raise DialectError(unknown_key(key, tuple(known), where, _line(k), path))
        out[key] = (k, v)
    return out


def _checked(fn, node, where: str, path: str):
    try:
        return fn()
    except SpecError as e:
        raise DialectError(f"{where}line {_line(node)}: {path}: {getattr(e, 'detail', e)}") from None


# ---------------------------------------------------------------------------------------------- translate
def translate(root, where: str) -> tuple[object, tuple[NotActedOn, ...]]:
    """The canonical root node of a ``serve.yaml`` root node that may use the seed's dialect, and what it
    accepted without acting on it.  A canonical file comes back as it was."""
    import yaml
    notes: list[NotActedOn] = []
    out: list = []
    extra_triggers: list = []
    defaults: dict = {}
    tags: dict = {}
    for k, v in root.value:
        key = _name(k, where, "", DialectError)
        if key == "scheduler":
            _scheduler(v, where, defaults, tags, extra_triggers, notes)
        elif key == "memory":
            out.append((k, _memory(v, where)))
        elif key == "self_healing" and isinstance(v, yaml.MappingNode):
            out.append((k, v))
        else:
            out.append((k, v))
    for sect, value in (("defaults", defaults), ("tags", tags)):
        if value:
            i = next((i for i, (k, _) in enumerate(out) if getattr(k, "value", None) == sect), None)
            if i is None:
                out.append((_node(sect, root), _node(value, root)))
            else:                                  # vnpu's own section too (e.g. a --set over the file): it wins
                out[i] = (out[i][0], _merged(_node(value, root), out[i][1]))
    sh = next((i for i, (k, _) in enumerate(out) if getattr(k, "value", None) == "self_healing"), None)
    if sh is not None or extra_triggers:
        k, v = out[sh] if sh is not None else (_node("self_healing", root), _node({}, root))
        v = _self_healing(v, where, extra_triggers, notes)
        if sh is None:
            out.append((k, v))
        else:
            out[sh] = (k, v)
    return yaml.MappingNode(root.tag, out, root.start_mark, root.end_mark), tuple(notes)


def _merged(dialect, own):
    """Mapping node ``own`` over mapping node ``dialect``, key by key (nested mappings merged the same way)."""
    import yaml
    if not (isinstance(dialect, yaml.MappingNode) and isinstance(own, yaml.MappingNode)):
        return own
    mine = {getattr(k, "value", None): (k, v) for k, v in own.value}
    pairs = [(k, _merged(v, mine[k.value][1]) if k.value in mine else v) for k, v in dialect.value]
    given = {k.value for k, _ in dialect.value}
    pairs += [(k, v) for k, v in own.value if getattr(k, "value", None) not in given]
    return yaml.MappingNode(own.tag, pairs, own.start_mark, own.end_mark)


def _scheduler(node, where: str, defaults: dict, tags: dict, triggers: list, notes: list) -> None:
    import yaml
    d = _pairs(node, SCHEDULER_KEYS, where, "scheduler")
    sched: dict = {}
    engine: dict = {}
    batching: dict = {}
    if "mode" in d:
        vn = d["mode"][1]
        word = _value(vn, where, "scheduler.mode")
        if word not in MODES:
            raise DialectError(f"{where}line {_line(vn)}: scheduler.mode: unknown mode {word!r} "
                               f"(known: {', '.join(MODES)})")
        mode, why = MODES[word]
        sched["mode"] = _node(mode, vn)
        if why:
            notes.append(NotActedOn("scheduler.mode", _line(vn), word, why))
    if "strategies" in d:
        sn = d["strategies"][1]
        if not isinstance(sn, yaml.SequenceNode):
            raise DialectError(f"{where}line {_line(sn)}: scheduler.strategies: expected a list of strategies")
        seen = set()
        for i, s in enumerate(sn.value):
            at = f"scheduler.strategies[{i}]"
            if not isinstance(s, yaml.MappingNode):
                raise DialectError(f"{where}line {_line(s)}: {at}: expected a strategy (a mapping with a name)")
            nn = next((v for k, v in s.value if getattr(k, "value", None) == "name"), None)
            if nn is None:
                raise DialectError(f"{where}line {_line(s)}: {at}: the key 'name' is required "
                                   f"({', '.join(STRATEGY_KEYS)})")
            name = _value(nn, where, f"{at}.name")
            if name not in STRATEGY_KEYS:
                import difflib
                near = difflib.get_close_matches(str(name), list(STRATEGY_KEYS), n=1, cutoff=0.6)
                raise DialectError(f"{where}line {_line(nn)}: {at}.name: unknown strategy {name!r} "
                                   f"({'did you mean ' + near[0] + '? ' if near else ''}known: "
                                   f"{', '.join(STRATEGY_KEYS)})")
            if name in seen:
                raise DialectError(f"{where}line {_line(nn)}: {at}.name: strategy {name} is listed twice")
            seen.add(name)
            p = _pairs(s, STRATEGY_KEYS[name], where, at)
            if name == "dynamic_batching":
                _batching(p, where, at, sched, engine, batching)
            elif name == "stream_priority":
                _rules(p, where, at, tags)
            else:
                _fallback_chain(p, where, at, defaults, triggers)
        if tags:                                   # stream priorities need the priority scheduling policy
            engine.setdefault("scheduling_policy", _node("priority", sn))
    for sect, value in (("scheduler", sched), ("engine", engine), ("batching", batching)):
        if value:
            defaults[sect] = value


def _batching(p: dict, where: str, at: str, sched: dict, engine: dict, batching: dict) -> None:
    vals = {k: (_value(v, where, f"{at}.{k}"), v) for k, (_, v) in p.items() if k != "name"}
    if "enabled" in vals and not isinstance(vals["enabled"][0], bool):
        raise DialectError(f"{where}line {_line(vals['enabled'][1])}: {at}.enabled: expected true or false")
    if vals.get("enabled", (True,))[0] is False:
        engine["max_num_seqs"] = _node(1, vals["enabled"][1])
        batching["max_batch_size"] = _node(1, vals["enabled"][1])
        return
    if "min_batch" in vals:
        sched["low_latency_batch"] = vals["min_batch"][1]
    if "max_batch" in vals:
        engine["max_num_seqs"] = batching["max_batch_size"] = vals["max_batch"][1]
    if "timeout_ms" in vals:
        sched["max_wait_ms"] = batching["max_wait_ms"] = vals["timeout_ms"][1]


def _rules(p: dict, where: str, at: str, tags: dict) -> None:
    import yaml
    if "rules" not in p:
        return
    rn = p["rules"][1]
    if not isinstance(rn, yaml.SequenceNode):
        raise DialectError(f"{where}line {_line(rn)}: {at}.rules: expected a list of {{tag, priority}}")
    for j, r in enumerate(rn.value):
        rat = f"{at}.rules[{j}]"
        rp = _pairs(r, ("tag", "priority"), where, rat)
        for req in ("tag", "priority"):
            if req not in rp:
                raise DialectError(f"{where}line {_line(r)}: {rat}: the key '{req}' is required")
        tag = _value(rp["tag"][1], where, f"{rat}.tag")
        pn = rp["priority"][1]
        prio = _value(pn, where, f"{rat}.priority")
        if isinstance(prio, str):
            if prio not in PRIORITY_WORDS:
                raise DialectError(f"{where}line {_line(pn)}: {rat}.priority: unknown priority {prio!r} "
                                   f"(known: {', '.join(PRIORITY_WORDS)}, or a class number)")
            prio = PRIORITY_WORDS[prio]
        if str(tag) in tags:
            raise DialectError(f"{where}line {_line(rp['tag'][1])}: {rat}.tag: {tag} has two rules")
        tags[str(tag)] = _node(prio, pn)


def _device(node, where: str, path: str):
    v = _value(node, where, path)
    return _node(DEVICE_NAMES.get(str(v), v), node)


def _fallback_chain(p: dict, where: str, at: str, defaults: dict, triggers: list) -> None:
    import yaml
    if "primary" in p:
        defaults["placement"] = _device(p["primary"][1], where, f"{at}.primary")
    if "fallbacks" in p:
        fn = p["fallbacks"][1]
        if not isinstance(fn, yaml.SequenceNode):
            raise DialectError(f"{where}line {_line(fn)}: {at}.fallbacks: expected a list of devices")
        defaults["fallback"] = _node([_device(x, where, f"{at}.fallbacks[{i}]") for i, x in enumerate(fn.value)], fn)
    if "switch_threshold" in p:
        tn = p["switch_threshold"][1]
        text = _value(tn, where, f"{at}.switch_threshold")
        m = re.fullmatch(r"\s*([a-z_]+)\s*(>=|<=|>|<)\s*(\S+)\s*(?:for\s+(\S+))?\s*", str(text))
        if m is None or m.group(1) not in METRICS or METRICS[m.group(1)][0] is None:
            raise DialectError(f"{where}line {_line(tn)}: {at}.switch_threshold: expected '<metric><op><value> "
                               f"for <window>' (e.g. error_rate>5% for 30s; metrics: "
                               f"{', '.join(k for k, (v, _) in METRICS.items() if v)}), got {text!r}")
        metric = METRICS[m.group(1)][0]
        trig = {"name": "fallback_chain", "metric": metric,
                "condition": _checked(lambda: condition(m.group(2) + m.group(3), _unit(metric), "threshold"), tn,
                                      where, f"{at}.switch_threshold"),
                "action": "fallback"}
        if m.group(4):
            trig["window"] = m.group(4)
        triggers.append(_node(trig, tn))


def _unit(metric: str) -> str:
    from runtime.observe.forecast import FORECAST_METRICS
    from runtime.observe.metrics_store import METRICS as STORE
    return STORE[FORECAST_METRICS.get(metric, metric)][0]


def _memory(node, where: str):
    """``memory:`` with the seed's names and units -> vnpu's (a canonical ``memory:`` passes as it is)."""
    import yaml
    if not isinstance(node, yaml.MappingNode):
        return node
    out = []
    known = tuple(dict.fromkeys([*MEMORY_KEYS, *MEMORY_KEYS.values()]))
    for k, v in node.value:
        key = _name(k, where, "memory", DialectError)
        if key not in known:
            raise DialectError(unknown_key(key, known, where, _line(k), "memory"))
        if key == "pool_size":
            n = _checked(lambda: parse_bytes(_value(v, where, "memory.pool_size"), "pool_size"), v, where,
                         "memory.pool_size")
            out.append((_node("pool_bytes", k), _node(n, v)))
        elif key == "defrag_interval":
            s = _checked(lambda: parse_duration(_value(v, where, "memory.defrag_interval"), "defrag_interval"), v,
                         where, "memory.defrag_interval")
            out.append((_node("defrag_interval_s", k), _node(s, v)))
        else:
            out.append((k, v))
    return yaml.MappingNode(node.tag, out, node.start_mark, node.end_mark)


def _self_healing(node, where: str, extra: list, notes: list):
    import yaml
    if not isinstance(node, yaml.MappingNode):
        return node
    out = []
    has_triggers = False
    for k, v in node.value:
        key = getattr(k, "value", None)
        if key == "triggers" and isinstance(v, yaml.SequenceNode):
            has_triggers = True
            v = _triggers(v, where, notes, extra)
        elif key == "recovery" and isinstance(v, yaml.MappingNode):
            v = _recovery(v, where, notes)
        out.append((k, v))
    if not has_triggers and extra:
        out.append((_node("triggers", node), _triggers(_node([], node), where, notes, extra)))
    return yaml.MappingNode(node.tag, out, node.start_mark, node.end_mark)


def _recovery(node, where: str, notes: list):
    import yaml
    out = []
    for k, v in node.value:
        if getattr(k, "value", None) == "health_check" and isinstance(v, yaml.ScalarNode) and v.tag.endswith(":str"):
            text = _value(v, where, "self_healing.recovery.health_check")
            if not str(text).startswith("/health"):
                raise DialectError(f"{where}line {_line(v)}: self_healing.recovery.health_check: expected true, "
                                   f"false or a /health URL path, got {text!r}")
            # the recovery checks are the deep check /health?deep=true serves (runtime.serve.heal.deep)
            v = _node(True, v)
        out.append((k, v))
    return yaml.MappingNode(node.tag, out, node.start_mark, node.end_mark)


def _triggers(node, where: str, notes: list, extra: list):
    import yaml
    out = []
    names: list[str] = []
    for i, t in enumerate(node.value):
        at = f"self_healing.triggers[{i}]"
        if not (isinstance(t, yaml.MappingNode) and not any(getattr(k, "value", None) == "condition" for k, _ in t.value)):
            out.append(t)
            names += [str(v.value) for k, v in getattr(t, "value", []) if getattr(k, "value", None) == "name"]
            continue
        canon = _seed_trigger(t, where, at, names, notes)
        if canon is not None:
            out.append(canon)
    for t in extra:
        out.append(t)
    return yaml.SequenceNode(node.tag, out, node.start_mark, node.end_mark)


def _relative(threshold, node, where: str, path: str) -> tuple[str, str, float] | None:
    """A relative threshold ``sudden_drop>40% in 1m`` as (aggregate, condition, window seconds); None for an
    absolute one (``5%``, ``> 85°C``)."""
    if not isinstance(threshold, str) or re.match(r"\s*[a-z_]+\s*(>=|<=|>|<)", threshold) is None:
        return None
    m = re.fullmatch(r"\s*([a-z_]+)\s*(>=|<=|>|<)\s*(\S+)\s+in\s+(\S+)\s*", threshold)
    if m is None or m.group(1) not in RELATIVE_WORDS:
        raise DialectError(f"{where}line {_line(node)}: {path}: expected a relative threshold '<change><op><percent> "
                           f"in <window>' (change: {', '.join(RELATIVE_WORDS)}; e.g. sudden_drop>40% in 1m), "
                           f"got {threshold!r}")
    frac = _checked(lambda: parse_fraction(m.group(3), "threshold"), node, where, path)
    secs = _checked(lambda: parse_duration(m.group(4), "window"), node, where, path)
    if secs <= 0:
        raise DialectError(f"{where}line {_line(node)}: {path}: the window of a relative threshold must be > 0")
    return RELATIVE_WORDS[m.group(1)], f"{m.group(2)} {frac:g}", secs


def _seed_trigger(t, where: str, at: str, names: list, notes: list):
    """A seed trigger ``{metric, threshold, window, action}`` as vnpu's, or None (kept as a NotActedOn)
    when vnpu has no such metric, condition or action."""
    p = _pairs(t, SEED_TRIGGER_KEYS, where, at)
    for req in ("metric", "threshold", "action"):
        if req not in p:
            raise DialectError(f"{where}line {_line(t)}: {at}: the key '{req}' is required"
                               + (" (or vnpu's condition)" if req == "threshold" else ""))
    mn, tn, an = p["metric"][1], p["threshold"][1], p["action"][1]
    seed_metric = str(_value(mn, where, f"{at}.metric"))
    threshold = _value(tn, where, f"{at}.threshold")
    action_text = str(_value(an, where, f"{at}.action")).strip()
    from runtime.observe.forecast import FORECAST_METRICS
    from runtime.observe.metrics_store import METRICS as STORE
    from .heal.actions import ACTIONS as VNPU_ACTIONS
    if seed_metric in METRICS:
        metric, why_metric = METRICS[seed_metric]
    elif seed_metric in STORE or seed_metric in FORECAST_METRICS:      # vnpu's names, a forecast's too
        metric, why_metric = seed_metric, ""
    else:
        import difflib
        known = list(METRICS) + [m for m in STORE if m not in METRICS]
        near = difflib.get_close_matches(seed_metric, known, n=1, cutoff=0.6)
        raise DialectError(f"{where}line {_line(mn)}: {at}.metric: unknown metric {seed_metric!r} "
                           f"({'did you mean ' + near[0] + '? ' if near else ''}known: {', '.join(known)})")
    word, _, rest = action_text.partition(" ")
    if word in ACTIONS:
        action, param = ACTIONS[word]
        why_action = param if action is None else ""
        param = None if action is None else param
    elif word in VNPU_ACTIONS:
        action, param, why_action = word, "", ""
    else:
        import difflib
        known = list(ACTIONS) + list(VNPU_ACTIONS)
        near = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
        raise DialectError(f"{where}line {_line(an)}: {at}.action: unknown action {word!r} "
                           f"({'did you mean ' + near[0] + '? ' if near else ''}known: {', '.join(known)})")
    params = {}
    if param and rest.strip():
        params[param] = rest.strip()
    elif param:
        raise DialectError(f"{where}line {_line(an)}: {at}.action: {word} needs a value "
                           f"(e.g. {'throttle_requests_by 20%' if param == 'by' else 'scale_workers +2'})")
    elif rest.strip():
        raise DialectError(f"{where}line {_line(an)}: {at}.action: {word} takes no value, got {rest.strip()!r}")
    relative = _relative(threshold, tn, where, f"{at}.threshold")
    if relative is not None and "window" in p:
        raise DialectError(f"{where}line {_line(p['window'][1])}: {at}.window: a relative threshold gives its own "
                           f"window ('in 1m'); drop one of them")
    why = why_metric or why_action
    text = f"{{metric: {seed_metric}, threshold: {threshold}, action: {action_text}}}"
    if why:
        notes.append(NotActedOn(at, _line(t), text, why))
        return None
    name = str(_value(p["name"][1], where, f"{at}.name")) if "name" in p else f"{seed_metric}_{word}"
    base, n = name, 2
    while name in names:
        name, n = f"{base}_{n}", n + 1
    names.append(name)
    if relative is not None:
        cond = relative[1]
    else:
        cond = _checked(lambda: condition(threshold, _unit(metric), "threshold"), tn, where, f"{at}.threshold")
    canon = [("name", _node(name, t)), ("metric", _node(metric, mn)), ("condition", _node(cond, tn)),
             ("action", _node(action, an))]
    if relative is not None:
        canon += [("aggregate", _node(relative[0], tn)), ("window", _node(relative[2], tn))]
    if params:
        canon.append(("params", _node(params, an)))
    for key in ("window", "cooldown", "aggregate", "lead", "model"):
        if key in p:
            canon.append((key, p[key][1]))
    import yaml
    return yaml.MappingNode(t.tag, [(_node(k, t), v) for k, v in canon], t.start_mark, t.end_mark)


__all__ = ["ACTIONS", "DEVICE_NAMES", "DialectError", "METRICS", "MODES", "NotActedOn", "PRIORITY_WORDS",
           "condition", "parse_bytes", "parse_celsius", "translate"]
