"""The docs site documents what vnpu has (issue 30): every ``vnpu`` command and subcommand of the real argparse
parser is named in the docs, every key of serve.yaml's schema (the tables runtime.serve.config, its dialect and
the self-healing section check a file against) has its row in docs/serving/configuration.md or the dialect's
page, every self-healing action and parameter and every metric a trigger may watch is listed, and every page
under docs/ is in mkdocs.yml's navigation.  No cluster; the strict link check is ``mkdocs build --strict``
in scripts/test.sh.  Each check is a function of (what the code has, the docs' text), and a test shows that
it names what a page leaves out.
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import yaml

ROOT = Path(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = ROOT / "docs"


def _docs_text(*pages: str) -> str:
    paths = [DOCS / p for p in pages] if pages else sorted(DOCS.rglob("*.md"))
    return "\n".join(p.read_text() for p in paths)


# ---------------------------------------------------------------------------------------------- commands
def _commands(p, path=("vnpu",)):
    """Every command path below ``p`` (aliases once)."""
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            seen = set()
            for name, sp in a.choices.items():
                if id(sp) not in seen:
                    seen.add(id(sp))
                    yield path + (name,)
                    yield from _commands(sp, path + (name,))


def command_paths() -> list[str]:
    from runtime.cli import build_parser
    return [" ".join(c) for c in _commands(build_parser())]


def undocumented_commands(commands, text: str) -> list[str]:
    """The commands ``text`` never names as ``vnpu <command> <subcommand>`` (a word boundary after it)."""
    return [c for c in commands if not re.search(re.escape(c) + r"(?![\w-])", text)]


def test_the_walk_sees_every_command():
    cmds = command_paths()
    assert {"vnpu up", "vnpu serve reconfigure", "vnpu bench overhead", "vnpu chaos check",
            "vnpu kernels remove", "vnpu stress-test"} <= set(cmds)
    assert len(cmds) > 30


def test_every_vnpu_command_is_documented():
    missing = undocumented_commands(command_paths(), _docs_text())
    assert not missing, f"commands named nowhere under docs/: {missing}"


def test_the_command_reference_names_every_command():
    missing = undocumented_commands(command_paths(), _docs_text("cli.md"))
    assert not missing, f"commands missing from docs/cli.md: {missing}"


def unknown_commands(commands, text: str) -> list[str]:
    """``vnpu <word>`` where ``<word>`` is no command, and ``vnpu <group> <word>`` where ``<group>`` has
    subcommands and ``<word>`` is none of them: commands the docs name (in code) that the parser does not have."""
    groups: dict[str, set[str]] = {}
    for c in commands:
        head, _, last = c.rpartition(" ")
        groups.setdefault(head, set()).add(last)
    out = []
    for m in re.finditer(r"^vnpu ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", text, re.M):
        first, second = f"vnpu {m.group(1)}", m.group(2)
        if m.group(1) not in groups["vnpu"]:
            out.append(first)
        elif second and first in groups and second not in groups[first]:
            out.append(f"{first} {second}")
    return sorted(set(out))


def test_the_docs_name_no_command_the_parser_lacks():
    """Where the docs show a command: a code span, or a line of a code block (after an optional ``$`` prompt);
    docs/cli-flags.md is the parser's own help, so it is left out."""
    pages = [p for p in sorted(DOCS.rglob("*.md")) if p.name != "cli-flags.md"]
    code = []
    for md in (p.read_text() for p in pages):
        for i, part in enumerate(re.split(r"^```.*$", md, flags=re.M)):
            code += [ln.removeprefix("$ ") for ln in part.splitlines()] if i % 2 else re.findall(r"`([^`\n]+)`", part)
    assert len(code) > 1000
    assert unknown_commands(command_paths(), "\n".join(code)) == []
    assert unknown_commands(command_paths(), "vnpu bench teleport\nvnpu serve --port 0\nvnpu chaos check r.json") == \
        ["vnpu bench teleport"]


def test_a_command_left_out_is_named():
    text = _docs_text("cli.md")
    assert "vnpu chaos check" in text
    cut = text.replace("vnpu chaos check", "vnpu chaos")
    assert undocumented_commands(command_paths(), cut) == ["vnpu chaos check"]
    assert undocumented_commands(["vnpu bench serve"], "`vnpu bench serve-om`") == ["vnpu bench serve"]


def _sections(md: str) -> dict[str, str]:
    """``## `vnpu ...` `` heading -> the text below it, of docs/cli-flags.md."""
    parts = re.split(r"^## `([^`]+)`$", md, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def undocumented_flags(parser, md: str, docs: str = "") -> list[str]:
    """``vnpu <command> <flag>`` for every option string of the parser its command's section of ``md`` does not
    show; a flag hidden from ``--help`` (``vnpu atc``'s ATC flags that fail with E10001) must be named somewhere
    in ``docs`` instead."""
    sections = _sections(md)
    out = []
    for path, p in _walk(parser):
        sec = sections.get(" ".join(path), "")
        for a in p._actions:
            where = docs if a.help == argparse.SUPPRESS else sec
            out += [f"{' '.join(path)} {o}" for o in a.option_strings
                    if not re.search(re.escape(o) + r"(?![\w-])", where)]
    return out


def _walk(p, path=("vnpu",)):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            seen = set()
            for name, sp in a.choices.items():
                if id(sp) not in seen:
                    seen.add(id(sp))
                    yield from _walk(sp, path + (name,))


def test_every_flag_of_every_command_is_documented():
    """docs/cli-flags.md (``scripts/cli_reference.py`` writes it from the parser) shows every flag under its
    command; a flag added without re-running the script fails here."""
    from runtime.cli import build_parser
    missing = undocumented_flags(build_parser(), _docs_text("cli-flags.md"), _docs_text())
    assert not missing, f"flags missing from docs/cli-flags.md (run scripts/cli_reference.py): {missing}"


def test_a_flag_left_out_is_named():
    from runtime.cli import build_parser
    md = _docs_text("cli-flags.md")
    sec = _sections(md)["vnpu smi"]
    assert "--loop" in sec
    cut = md.replace(sec, sec.replace("--loop", "--lo"))
    assert undocumented_flags(build_parser(), cut, _docs_text()) == ["vnpu smi --loop"]
    docs = _docs_text()
    assert "`--keep_dtype`" in docs
    hidden = undocumented_flags(build_parser(), md, docs.replace("`--keep_dtype`", ""))
    assert hidden == ["vnpu atc --keep_dtype"]


# ---------------------------------------------------------------------------------------------- serve.yaml
def serve_yaml_keys() -> list[str]:
    """Every key path serve.yaml accepts, from the schemas the loader checks a file against."""
    from runtime.serve import config as c
    from runtime.serve import dialect as d
    from runtime.serve.heal import config as h
    keys = list(c.ROOT_KEYS)
    keys += [f"server.{k}" for k in c.SERVER_SCHEMA] + [f"http.{k}" for k in c.HTTP_SCHEMA]
    keys += [f"slo.{k}" for k in c.SLO_SCHEMA] + [f"memory.{k}" for k in c.MEMORY_SCHEMA]
    keys += [f"tenants[].{k}" for k in c.TENANT_KEYS] + [f"tenants[].quota.{k}" for k in c.QUOTA_SCHEMA]
    keys += [f"tenants[].circuit_breaker.{k}" for k in c.BREAKER_KEYS]
    keys += [f"models[].{k}" for k in sorted(c.MODEL_KEYS)]
    keys += [f"models[].engine.{k}" for k in c.ENGINE_SCHEMA] + [f"models[].scheduler.{k}" for k in c.SCHEDULER_SCHEMA]
    keys += [f"models[].batching.{k}" for k in c.BATCHING_SCHEMA] + [f"defaults.{k}" for k in c.DEFAULTS_KEYS]
    keys += [f"self_healing.{k}" for k in h.ROOT_KEYS] + [f"self_healing.triggers[].{k}" for k in h.TRIGGER_KEYS]
    keys += [f"self_healing.recovery.{k}" for k in h.RECOVERY_KEYS]
    keys += [f"self_healing.flapping.{k}" for k in h.FLAPPING_KEYS]
    keys += [f"self_healing.alerts[].{k}" for k in h.ALERT_KEYS]
    # the CANN runtime article's dialect (runtime.serve.dialect), rewritten at load
    keys += [f"scheduler.{k}" for k in d.SCHEDULER_KEYS] + [f"memory.{k}" for k in d.MEMORY_KEYS]
    keys += [f"scheduler.strategies[{s}].{k}" for s, ks in d.STRATEGY_KEYS.items() for k in ks]
    keys += [f"self_healing.triggers[].{k}" for k in d.SEED_TRIGGER_KEYS]
    return list(dict.fromkeys(keys))


def undocumented_keys(keys, text: str) -> list[str]:
    """The key paths ``text`` does not show as `` `path` `` (a table row or the prose of a page)."""
    return [k for k in keys if f"`{k}`" not in text]


def _serve_docs() -> str:
    return _docs_text("serving/configuration.md", "serving/cann-dialect.md")


def test_the_schema_walk_sees_every_section():
    keys = serve_yaml_keys()
    for k in ("server.port", "http.max_body_bytes", "tenants[].quota.tokens_per_minute",
              "models[].engine.max_num_seqs", "self_healing.flapping.hold",
              "scheduler.strategies[fallback_chain].primary"):
        assert k in keys
    assert len(keys) > 100


def test_every_serve_yaml_key_is_documented():
    missing = undocumented_keys(serve_yaml_keys(), _serve_docs())
    assert not missing, f"serve.yaml keys without a row in docs/serving/: {missing}"


def test_a_key_left_out_is_named():
    text = _serve_docs()
    row = next(ln for ln in text.splitlines() if ln.startswith("| `http.tokenizer_threads` |"))
    assert undocumented_keys(serve_yaml_keys(), text.replace(row, "")) == ["http.tokenizer_threads"]


def test_the_shipped_serve_yaml_uses_documented_keys_only():
    """Every key path of the shipped example is a documented key (so the example teaches nothing the
    reference does not have)."""
    def paths(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                p = f"{prefix}{k}"
                yield p
                yield from paths(v, p + ".")
        elif isinstance(node, list):
            for v in node:
                yield from paths(v, prefix[:-1] + "[].")
    shipped = yaml.safe_load((ROOT / "serve.yaml").read_text())
    text = _serve_docs()
    seen = [p for p in paths(shipped)]
    assert "models[].engine.max_num_seqs" in seen and "tenants[].quota.concurrent_requests" in seen
    assert undocumented_keys(seen, text) == []


def test_every_self_healing_action_param_and_metric_is_documented():
    from runtime.observe.metrics_store import METRICS
    from runtime.serve.heal.actions import ACTIONS
    text = _docs_text("serving/configuration.md")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", text, re.M)}
    missing = [a for a in ACTIONS if a not in rows]
    missing += [f"{a}.{p}" for a, act in ACTIONS.items() if a in rows for p in act.params if f"`{p}`" not in rows[a]]
    missing += [m for m in METRICS if f"`{m}`" not in text]
    assert not missing, f"self-healing actions, parameters or metrics missing from docs/serving/configuration.md: " \
                        f"{missing}"


# ---------------------------------------------------------------------------------------------- the site
def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for v in (item.values() if isinstance(item, dict) else [item]):
            out += _nav_pages(v) if isinstance(v, list) else [v]
    return out


def test_every_page_is_in_the_navigation():
    class _Loader(yaml.SafeLoader):
        pass
    _Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)
    cfg = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    nav = set(_nav_pages(cfg["nav"]))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == nav, (sorted(pages - nav), sorted(nav - pages))


def test_the_readme_is_a_front_door():
    """The README stays short and links into the site; every page it links to exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 15 and all((ROOT / p).is_file() for p in links), [p for p in links if not (ROOT / p).is_file()]
