"""The architecture as a test: imports point down, never in circles, never at another module's privates.

Every module under ``devices/``, ``driver/`` and ``runtime/`` is parsed with :mod:`ast` (nothing is
imported).  An *import* is any ``import``/``from ... import`` statement anywhere in the file: at module
level, inside functions (lazy imports) and under ``if TYPE_CHECKING:`` alike -- a lazy import is still a
dependency, so cycles are fixed by moving code, not by hiding an import in a function.

Rules:

(a) layers -- :data:`LAYERS` orders the packages from the bottom up; a module may import modules of its
    own layer and of the layers below it, never above.  :data:`FORBIDDEN_EXTERNAL` names third-party
    packages a layer must not import (the device model runs without Ray or gRPC), and
    :data:`ONLY_IMPORTED_BY` names modules that only some modules may import (generated protobuf code).
(b) no cycles in the module import graph (strongly connected components of size > 1, or a module
    importing itself).
(c) no ``from x import _name`` of another module's private name, and no import of a ``_private`` module
    from outside the package that holds it (``driver._gen`` is ``driver``'s).

A new package slots in by adding its prefix to :data:`LAYERS` (``runtime.serve`` above the cluster,
``runtime.memory`` / ``runtime.profiler`` in the core, ...); a module that matches no layer fails the
test, so nothing lands without a place.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("devices", "driver", "runtime")

#: bottom to top: (layer name, module prefixes).  A module belongs to the layer of its longest matching
#: prefix; ``runtime`` alone is the package ``__init__`` (and any module not matched more precisely).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("device model", ("devices",)),
    ("driver", ("driver",)),
    ("runtime core", ("runtime", "runtime.api", "runtime.backend", "runtime.graph", "runtime.hccl",
                      "runtime.acl", "runtime.memory", "runtime.profiler", "runtime.models", "runtime.atc",
                      "runtime.offline", "runtime.sanitize", "runtime.observe")),
    ("runtime cluster", ("runtime.cluster",)),
    ("serving", ("runtime.serve",)),
    ("operations", ("runtime.stress",)),
    ("benchmarks", ("runtime.bench",)),
    ("command line", ("runtime.cli",)),
)

#: layer -> third-party top-level packages it must not import
FORBIDDEN_EXTERNAL: dict[str, tuple[str, ...]] = {
    "device model": ("ray", "grpc", "google.protobuf"),
    "runtime core": ("ray", "grpc", "google.protobuf"),
}

#: module prefix -> the only module prefixes that may import it
ONLY_IMPORTED_BY: dict[str, tuple[str, ...]] = {
    "driver._gen": ("driver.wire", "driver._gen", "driver.protogen"),
}


# ---------------------------------------------------------------------------------------------- the scan
@dataclass(frozen=True)
class Import:
    importer: str          #: module doing the import
    target: str            #: module imported (a submodule when ``from pkg import sub`` names one)
    names: tuple[str, ...]  #: names taken with ``from ... import`` (empty for ``import x``)
    line: int
    lazy: bool             #: inside a function or class body / under ``if``


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(p)] = p
    return out


MODULES = all_modules()


def _is_package(mod: str) -> bool:
    return MODULES.get(mod, Path()).name == "__init__.py"


def _resolve_relative(importer: str, level: int, module: str | None) -> str:
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]                          # a module's package
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def imports_of(mod: str) -> list[Import]:
    tree = ast.parse(MODULES[mod].read_text(), filename=str(MODULES[mod]))
    out: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_lazy = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If,
                                                    ast.Try, ast.With))
            if isinstance(child, ast.Import):
                for a in child.names:
                    out.append(Import(mod, a.name, (), child.lineno, lazy))
            elif isinstance(child, ast.ImportFrom):
                src = _resolve_relative(mod, child.level, child.module) if child.level else (child.module or "")
                if src == "__future__":
                    continue
                names = tuple(a.name for a in child.names)
                subs = [n for n in names if f"{src}.{n}" in MODULES]
                for n in subs:                    # ``from pkg import submodule``: depends on the submodule
                    out.append(Import(mod, f"{src}.{n}", (), child.lineno, lazy))
                rest = tuple(n for n in names if n not in subs)
                if rest or not subs:
                    out.append(Import(mod, src, rest, child.lineno, lazy))
            visit(child, child_lazy)

    visit(tree, False)
    return out


ALL_IMPORTS = {m: imports_of(m) for m in MODULES}


def _prefix_match(mod: str, prefixes) -> str | None:
    best = None
    for p in prefixes:
        if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > len(best)):
            best = p
    return best


def layer_of(mod: str) -> int | None:
    """Index into LAYERS of ``mod`` (longest prefix wins), None if it matches none."""
    best, where = None, None
    for i, (_name, prefixes) in enumerate(LAYERS):
        p = _prefix_match(mod, prefixes)
        if p is not None and (best is None or len(p) > len(best)):
            best, where = p, i
    return where


def internal(target: str) -> str | None:
    """The project module an import names (None for the standard library and third parties)."""
    if target.split(".")[0] not in PACKAGES:
        return None
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


# ---------------------------------------------------------------------------------------------- the rules
def test_every_module_has_a_layer():
    assert MODULES, "no modules found"
    lost = sorted(m for m in MODULES if layer_of(m) is None)
    assert not lost, f"modules in no layer (add their package to LAYERS): {lost}"


def layer_violations() -> list[str]:
    bad = []
    for mod, imps in ALL_IMPORTS.items():
        mine = layer_of(mod)
        for imp in imps:
            tgt = internal(imp.target)
            if tgt is not None:
                theirs = layer_of(tgt)
                if theirs is not None and mine is not None and theirs > mine:
                    bad.append(f"{mod}:{imp.line} ({LAYERS[mine][0]}) imports {tgt} ({LAYERS[theirs][0]})")
                for guarded, allowed in ONLY_IMPORTED_BY.items():
                    if _prefix_match(tgt, (guarded,)) and not _prefix_match(mod, allowed):
                        bad.append(f"{mod}:{imp.line} imports {tgt}: only {', '.join(allowed)} may")
            elif mine is not None:
                for ext in FORBIDDEN_EXTERNAL.get(LAYERS[mine][0], ()):
                    if _prefix_match(imp.target, (ext,)):
                        bad.append(f"{mod}:{imp.line} ({LAYERS[mine][0]}) imports {imp.target}")
    return bad


def test_no_module_imports_a_layer_above_it():
    bad = layer_violations()
    assert not bad, "imports pointing up:\n" + "\n".join(bad)


def import_graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, imps in ALL_IMPORTS.items():
        for imp in imps:
            tgt = internal(imp.target)
            if tgt is not None:
                g[mod].add(tgt)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with a cycle (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in g[v]:
                        out.append(sorted(comp))
    return out


def test_cycle_finder_finds_cycles():
    """The checker itself: a planted circle and a self-import are found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    detail = []
    for comp in found:
        members = set(comp)
        for m in comp:
            for imp in ALL_IMPORTS[m]:
                t = internal(imp.target)
                if t in members:
                    detail.append(f"  {m}:{imp.line} -> {t}{' (lazy)' if imp.lazy else ''}")
    assert not found, "import cycles:\n" + "\n".join(f"{c}" for c in found) + "\n" + "\n".join(detail)


def _private_part(target: str) -> int | None:
    """Index of the first ``_private`` component of a module path (None when there is none)."""
    for i, part in enumerate(target.split(".")):
        if part.startswith("_") and not part.startswith("__"):
            return i
    return None


def private_imports() -> list[str]:
    bad = []
    for mod, imps in ALL_IMPORTS.items():
        for imp in imps:
            tgt = internal(imp.target)
            if tgt is None:
                continue
            names = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
            if names and tgt != mod:
                bad.append(f"{mod}:{imp.line} imports private {', '.join(names)} from {tgt}")
            i = _private_part(imp.target)
            if i is not None:
                owner = ".".join(imp.target.split(".")[:i])        # a private module is its package's
                if not (mod == owner or mod.startswith(owner + ".")):
                    bad.append(f"{mod}:{imp.line} imports private module {imp.target}")
    return bad


def test_no_module_imports_private_names():
    bad = private_imports()
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("mod,expect", [
    ("devices.device", "device model"), ("driver.host", "driver"), ("runtime", "runtime core"),
    ("runtime.acl.rt", "runtime core"), ("runtime.cluster.failover", "runtime cluster"),
    ("runtime.cli.smi", "command line"), ("runtime.bench.hccl", "benchmarks"),
])
def test_layer_table(mod, expect):
    """The table places the packages where the architecture says (and the scan finds the modules)."""
    assert mod in MODULES
    assert LAYERS[layer_of(mod)][0] == expect


def test_scan_sees_lazy_and_relative_imports():
    """The scanner resolves relative imports and sees imports inside functions."""
    imps = ALL_IMPORTS["runtime.cli"]
    assert any(i.target == "devices.errors" for i in imps)
    lazy = [i for m in MODULES for i in ALL_IMPORTS[m] if i.lazy]
    assert lazy, "no lazy import seen anywhere: the scanner misses function bodies"
    assert _resolve_relative("runtime.acl.rt", 1, "calls") == "runtime.acl.calls"
    assert _resolve_relative("runtime.acl", 1, "rt") == "runtime.acl.rt"
    assert _resolve_relative("runtime.cluster.remote", 2, "api") == "runtime.api"


# ---------------------------------------------------------------------------------------------- error table
def error_code_literals(codes: set[int]) -> list[str]:
    """Integer literals equal to a CANN code of the error table, anywhere outside ``devices/errors.py``:
    every module names its codes (``ACL_ERROR_RT_...``), so one table says what each number means."""
    bad = []
    for mod, path in MODULES.items():
        if mod == "devices.errors" or mod.startswith("driver._gen"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in codes:
                bad.append(f"{mod}:{node.lineno} writes error code {node.value} as a literal")
    return bad


def _table_codes() -> set[int]:
    import devices.errors as errors
    return {v for k, v in vars(errors).items() if k.isupper() and type(v) is int and v >= 100000}


def test_one_error_table():
    codes = _table_codes()
    assert len(codes) > 50, "the scan did not find the error table"
    bad = error_code_literals(codes)
    assert not bad, "\n".join(bad)


def test_error_literal_scan_catches_one(tmp_path, monkeypatch):
    """The scan itself: a module that writes 207001 is reported."""
    p = tmp_path / "x.py"
    p.write_text("def f():\n    raise RuntimeError(207001)\n")
    monkeypatch.setitem(MODULES, "runtime.x", p)
    assert error_code_literals({207001}) == ["runtime.x:2 writes error code 207001 as a literal"]
