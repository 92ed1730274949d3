"""The architecture as a test: imports point down, never in circles, never at another module's privates.

Every module under ``devices/``, ``driver/`` and ``runtime/`` is parsed with :mod:`ast` (nothing is
imported).  An *import* is any ``import``/``from ... import`` statement anywhere in the file: at module
level, inside functions (lazy imports) and under ``if TYPE_CHECKING:`` alike -- a lazy import is still a
dependency, so cycles are fixed by moving code, not by hiding an import in a function.

Rules:

(a) layers -- :data:`LAYERS` orders the packages from the bottom up; a module may import modules of its
    own layer and of the layers below it, never above.  The runtime core is ordered inside too
    (:data:`CORE_SUBLAYERS`: support, services, the device API, libraries, front ends), by the same rule.
    :data:`FORBIDDEN_EXTERNAL` names third-party packages a layer must not import (the device model runs
    without Ray or gRPC), and :data:`ONLY_IMPORTED_BY` names modules that only some modules may import
    (generated protobuf code).  The one module the core names above it -- the provider of a backend that
    a program asks for by name (``runtime.backend.PROVIDERS``) -- counts as an import, allowed only as
    listed in :data:`DECLARED_UPWARD`, and the provider must register that backend.
(b) no cycles in the module import graph (strongly connected components of size > 1, or a module
    importing itself).
(c) no module imports a private name: no ``from x import _name`` of another module's private name, no
    ``x._name`` of a module ``x`` it imported, and no import of a ``_private`` module from outside the
    package that holds it (``driver._gen`` is ``driver``'s).
(d) Ray is imported only after :func:`runtime.cluster.rayenv.prepare`: in the runtime, every function
    (or module body) that imports ``ray`` calls ``rayenv.prepare()`` before it (Ray reads its
    environment once, when first imported), and no runtime module imports Ray at module level.

A new package slots in by adding its prefix to :data:`LAYERS` (``runtime.serve`` above the cluster, ...)
or, in the core, to :data:`CORE_SUBLAYERS`; a module that matches no layer fails the test, so nothing lands
without a place.
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("devices", "driver", "runtime")

#: the runtime core, bottom to top: (sub-layer name, module prefixes), ordered by the same rule as the layers.
#: ``runtime`` alone is the package ``__init__`` and any top-level module not placed more precisely.
CORE_SUBLAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # need nothing else of the runtime: host buffers, argument checks, the compiler, the metrics store
    ("support", ("runtime", "runtime.hostbuf", "runtime.cliargs", "runtime.atc", "runtime.observe", "runtime.plots")),
    # what the device API is built of: the caching allocator, profiling hooks, the sanitizer
    ("services", ("runtime.memory", "runtime.profiler", "runtime.sanitize")),
    ("device API", ("runtime.backend", "runtime.graph", "runtime.api")),
    # built on the device API: collectives, offline models (compiled by atc)
    ("libraries", ("runtime.hccl", "runtime.offline")),
    # on top: the model jobs (tensor parallel over HCCL) and pyACL (acl.mdl over offline models)
    ("front ends", ("runtime.models", "runtime.acl")),
    # PyTorch's npu device over the device API (tensors in the caching pool, kernels on streams)
    ("frameworks", ("runtime.torch",)),
)

#: bottom to top: (layer name, module prefixes).  A module belongs to the layer of its longest matching
#: prefix; ``runtime`` alone is the package ``__init__`` (and any module not matched more precisely).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("device model", ("devices",)),
    ("driver", ("driver",)),
    ("runtime core", tuple(p for _name, prefixes in CORE_SUBLAYERS for p in prefixes)),
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

#: imports that point up on purpose, each with why: only the provider of a backend that a program asks for
#: by name (``runtime.backend.PROVIDERS``, read as imports of ``runtime.backend``, see :func:`provider_imports`)
DECLARED_UPWARD: dict[tuple[str, str], str] = {
    ("runtime.backend", "runtime.cluster.remote"):
        "VNPU_BACKEND=cluster: a program that only names the cluster backend gets it (remote registers it)",
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


@functools.cache
def tree_of(mod: str) -> ast.Module:
    """``mod``'s syntax tree, parsed once per session (several scans walk every module; none changes a tree)."""
    return ast.parse(MODULES[mod].read_text(), filename=str(MODULES[mod]))


def _is_package(mod: str) -> bool:
    return MODULES.get(mod, Path()).name == "__init__.py"


def _resolve_relative(importer: str, level: int, module: str | None) -> str:
    base = importer.split(".")
    if not _is_package(importer):
        base = base[:-1]                          # a module's package
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


@functools.cache
def _imports_of(mod: str) -> tuple[Import, ...]:
    return tuple(_scan_imports(mod))


def imports_of(mod: str) -> list[Import]:
    return list(_imports_of(mod))


def _scan_imports(mod: str) -> list[Import]:
    tree = tree_of(mod)
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


def _longest(mod: str, table) -> int | None:
    """Index into ``table`` of the entry with ``mod``'s longest matching prefix, None if none matches."""
    best, where = None, None
    for i, (_name, prefixes) in enumerate(table):
        p = _prefix_match(mod, prefixes)
        if p is not None and (best is None or len(p) > len(best)):
            best, where = p, i
    return where


def layer_of(mod: str) -> int | None:
    """Index into LAYERS of ``mod`` (longest prefix wins), None if it matches none."""
    return _longest(mod, LAYERS)


CORE = next(i for i, (name, _p) in enumerate(LAYERS) if name == "runtime core")


def rank_of(mod: str) -> tuple[int, int] | None:
    """(layer, sub-layer) of ``mod``: the sub-layer orders the runtime core (0 elsewhere); None if no layer."""
    layer = layer_of(mod)
    if layer is None:
        return None
    sub = _longest(mod, CORE_SUBLAYERS) if layer == CORE else 0
    return (layer, sub) if sub is not None else None


def rank_name(rank: tuple[int, int]) -> str:
    layer, sub = rank
    return LAYERS[layer][0] + (f": {CORE_SUBLAYERS[sub][0]}" if layer == CORE else "")


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


def layer_violations(imports: dict[str, list[Import]] | None = None) -> list[str]:
    bad = []
    for mod, imps in (ALL_IMPORTS if imports is None else imports).items():
        rank = rank_of(mod)
        mine = None if rank is None else rank[0]
        for imp in imps:
            tgt = internal(imp.target)
            if tgt is not None:
                theirs = rank_of(tgt)
                if (theirs is not None and rank is not None and theirs > rank
                        and DECLARED_UPWARD.get((mod, tgt)) is None):
                    bad.append(f"{mod}:{imp.line} ({rank_name(rank)}) imports {tgt} ({rank_name(theirs)})")
                for guarded, allowed in ONLY_IMPORTED_BY.items():
                    if _prefix_match(tgt, (guarded,)) and not _prefix_match(mod, allowed):
                        bad.append(f"{mod}:{imp.line} imports {tgt}: only {', '.join(allowed)} may")
            elif mine is not None:
                for ext in FORBIDDEN_EXTERNAL.get(LAYERS[mine][0], ()):
                    if _prefix_match(imp.target, (ext,)):
                        bad.append(f"{mod}:{imp.line} ({LAYERS[mine][0]}) imports {imp.target}")
    return bad


def provider_imports() -> list[Import]:
    """``runtime.backend.PROVIDERS`` as the (lazy) imports of ``runtime.backend`` they are: the module that
    registers a backend is imported when a program first asks for the backend by name."""
    from runtime.backend import PROVIDERS
    return [Import("runtime.backend", mod, (), 0, True) for mod in PROVIDERS.values()]


def test_no_module_imports_a_layer_above_it():
    bad = layer_violations({**ALL_IMPORTS, "runtime.backend": ALL_IMPORTS["runtime.backend"] + provider_imports()})
    assert not bad, "imports pointing up:\n" + "\n".join(bad)


def test_layer_check_sees_inside_the_core():
    """The checker itself: an import down the core passes; one up the core (services -> device API,
    libraries -> front ends) is reported with both sub-layers, as is an undeclared backend provider."""
    def planted(mod, target):
        return layer_violations({mod: [Import(mod, target, (), 1, True)]})
    assert planted("runtime.api", "runtime.memory") == []
    assert planted("runtime.acl", "runtime.offline") == []
    assert planted("runtime.memory", "runtime.api") == [
        "runtime.memory:1 (runtime core: services) imports runtime.api (runtime core: device API)"]
    assert planted("runtime.hccl", "runtime.acl.rt") == [
        "runtime.hccl:1 (runtime core: libraries) imports runtime.acl.rt (runtime core: front ends)"]
    assert planted("runtime.backend", "runtime.cluster.remote") == []          # declared
    assert planted("runtime.backend", "runtime.cluster.local") == [
        "runtime.backend:1 (runtime core: device API) imports runtime.cluster.local (runtime cluster)"]


def test_backend_providers_register_their_backend():
    """Each module of ``runtime.backend.PROVIDERS`` registers the backend it provides when imported (a
    module-level ``register_backend(name, ...)``), and every declared upward import is such a provider."""
    from runtime.backend import PROVIDERS
    for name, mod in PROVIDERS.items():
        assert mod in MODULES, f"provider {mod} of backend {name!r} does not exist"
        tree = tree_of(mod)
        calls = [n.value for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        assert any(isinstance(c.func, ast.Name) and c.func.id == "register_backend" and c.args
                   and isinstance(c.args[0], ast.Constant) and c.args[0].value == name for c in calls), \
            f"{mod} does not register backend {name!r} at import"
    assert set(DECLARED_UPWARD) == {("runtime.backend", m) for m in PROVIDERS.values()}


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


def module_aliases(mod: str, tree: ast.AST) -> dict[str, str]:
    """Local name -> project module, for every name ``mod`` binds to a project module by an import
    (``import a.b`` binds ``a``; ``import a.b as c``, ``from a import b`` (a module) bind the module)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve_relative(mod, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                if f"{src}.{a.name}" in MODULES:
                    out[a.asname or a.name] = f"{src}.{a.name}"
    return out


def private_attributes(mod: str, tree: ast.AST) -> list[str]:
    """``x._name`` (or ``x.sub._name``) where ``x`` is another project module that ``mod`` imported."""
    aliases = module_aliases(mod, tree)
    bad: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        chain, v = [], node.value
        while isinstance(v, ast.Attribute):
            chain.append(v.attr)
            v = v.value
        if isinstance(v, ast.Name) and v.id in aliases:
            target = ".".join([aliases[v.id]] + chain[::-1])
            if target in MODULES and target != mod:
                bad.append((node.lineno, f"{mod}:{node.lineno} uses private {node.attr} of {target}"))
    return [msg for _line, msg in sorted(bad)]


def test_no_module_imports_private_names():
    bad = private_imports()
    for mod, path in MODULES.items():
        bad += private_attributes(mod, tree_of(mod))
    assert not bad, "\n".join(bad)


def test_private_name_scan_catches_one():
    """The scan itself: another module's private name through an imported module is reported, one's own
    and a public one are not."""
    tree = ast.parse("from . import session\nimport runtime.api as api\nimport devices.device\n"
                     "session._bad_ranges(1)\napi._runtime\ndevices.device.Device\nsession.Session\n")
    assert private_attributes("runtime.sanitize.handle", tree) == [
        "runtime.sanitize.handle:4 uses private _bad_ranges of runtime.sanitize.session",
        "runtime.sanitize.handle:5 uses private _runtime of runtime.api"]
    assert private_attributes("runtime.api", ast.parse("import runtime.api as me\nme._runtime\n")) == []


#: private attributes that may be reached on another object, with the reason (module, attribute);
#: ``None`` as the module: anywhere
REACH_IN_ALLOWED = {
    (None, "_exit"): "os._exit: the documented way to end a process without cleanup (after fork, on a fatal signal)",
    (None, "_getframe"): "sys._getframe: the documented cheap caller frame (the sanitizer's call sites)",
    (None, "_replace"): "namedtuple._replace: namedtuple's public API (underscored so no field name clashes)",
    ("runtime.cluster.multinode", "_shutdown_at_exit"):
        "Ray's cluster_utils.Cluster takes shutdown_at_exit for all nodes and add_node has no per-node switch",
    (None, "_schema"): "torch's OpOverload._schema: how torch.library and __torch_dispatch__ code reads an "
                       "operator's arguments (torch has no other accessor)",
    ("runtime.torch.tensor", "_make_wrapper_subclass"):
        "torch.Tensor._make_wrapper_subclass: the constructor torch's __torch_dispatch__ docs give for a tensor "
        "subclass that wraps other storage",
    ("runtime.torch.tensor", "_C"): "torch._C._disabled_torch_function_impl: the documented way for a "
                                    "__torch_dispatch__ subclass to turn __torch_function__ off",
    ("runtime.torch.tensor", "_disabled_torch_function_impl"): "see torch._C above",
    ("runtime.torch.resolve", "_C"): "torch._C._dispatch_has_kernel_for_dispatch_key: the only way to ask the "
                                     "dispatcher whether an operator has a CompositeImplicitAutograd kernel",
    ("runtime.torch.resolve", "_dispatch_has_kernel_for_dispatch_key"): "see torch._C above",
    **{(mod, op): f"aten::{op}: an aten operator whose public name starts with _ (torch.ops.aten.{op})"
       for mod, op in (("runtime.torch.ops_core", "_to_copy"), ("runtime.torch.ops_views", "_unsafe_view"),
                       ("runtime.torch.ops_math", "_softmax"), ("runtime.torch.ops_nn", "_local_scalar_dense"),
                       ("runtime.torch.ops_nn", "_log_softmax"), ("runtime.torch.ops_nn", "_log_softmax_backward_data"),
                       ("runtime.torch.ops_nn", "_scaled_dot_product_attention_math"),
                       ("runtime.torch.ops_nn", "_safe_softmax"), ("runtime.torch.ops_core", "_copy_from"),
                       ("runtime.torch.ops_core", "_copy_from_and_resize"))},
    ("runtime.hostmem", "_vnpu_owner"): "our own keep-alive tag on a ctypes array (the numpy view's base)",
    ("runtime.sanitize.session", "_vnpu_sanitized"): "our own report-once tag on an AclError, set and read here",
}


def private_reach_ins(mod: str, tree: ast.AST) -> list[str]:
    """``obj._name`` where ``obj`` is not ``self``/``cls`` (another object's private attribute), unless
    :data:`REACH_IN_ALLOWED` names it.  Imported modules' privates: :func:`private_attributes`."""
    aliases = module_aliases(mod, tree)
    bad: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        v = node.value
        if isinstance(v, ast.Name) and (v.id in ("self", "cls") or v.id in aliases):
            continue
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
            continue
        if (None, node.attr) in REACH_IN_ALLOWED or (mod, node.attr) in REACH_IN_ALLOWED:
            continue
        bad.append((node.lineno, f"{mod}:{node.lineno} reaches into {ast.unparse(node)}: give its owner a "
                                 "public, documented entry point"))
    return [msg for _line, msg in sorted(set(bad))]


def test_no_private_attribute_reach_ins():
    bad = []
    for mod, path in MODULES.items():
        if "._gen" not in mod:
            bad += private_reach_ins(mod, tree_of(mod))
    assert not bad, "\n".join(bad)


def test_reach_in_scan_catches_one():
    """The scan itself: another object's private is reported (through an attribute too); self's, cls's,
    super()'s, an allowed one and a public one are not."""
    tree = ast.parse("self._a\ncls._b\nsuper()._c()\nos._exit(1)\nsession._bad_ranges(1)\n"
                     "self.sched._event(2)\nsession.bad_ranges(1)\n")
    assert private_reach_ins("runtime.sanitize.handle", tree) == [
        "runtime.sanitize.handle:5 reaches into session._bad_ranges: give its owner a public, documented "
        "entry point",
        "runtime.sanitize.handle:6 reaches into self.sched._event: give its owner a public, documented "
        "entry point"]
    assert private_reach_ins("runtime.hostmem", ast.parse("c._vnpu_owner = 1\n")) == []
    assert private_reach_ins("runtime.api", ast.parse("c._vnpu_owner = 1\n")) != []


# ---------------------------------------------------------------------------------------------- Ray
def _is_ray_import(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "ray" or a.name.startswith("ray.") for a in node.names)
    return (isinstance(node, ast.ImportFrom) and node.level == 0
            and (node.module == "ray" or (node.module or "").startswith("ray.")))


def _is_prepare(node: ast.AST, aliases: dict[str, str], prepares: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr in PREPARING and isinstance(f.value, ast.Name):
        return aliases.get(f.value.id) == RAYENV
    return isinstance(f, ast.Name) and f.id in prepares


RAYENV = "runtime.cluster.rayenv"
#: rayenv's functions that prepare first (``ensure_token`` calls ``prepare``)
PREPARING = ("prepare", "ensure_token")


def ray_before_prepare(mod: str, tree: ast.Module) -> list[str]:
    """Ray imports of ``mod`` not preceded by ``rayenv.prepare()`` in their function (statements in source
    order; nested functions and classes are checked on their own); any Ray import at module level."""
    aliases = module_aliases(mod, tree)
    prepares = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == RAYENV for a in n.names if a.name in PREPARING}
    if mod == RAYENV:
        prepares |= set(PREPARING)
    bad = []

    def scan(body: list[ast.stmt], where: str, module_level: bool) -> None:
        prepared = False

        def visit(node: ast.AST) -> None:
            nonlocal prepared
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scan(node.body, node.name, False)
                return
            if isinstance(node, ast.ClassDef):
                for child in node.body:
                    visit(child)
                return
            if _is_ray_import(node) and (module_level or not prepared):
                bad.append(f"{mod}:{node.lineno} ({where}) imports Ray "
                           + ("at module level" if module_level else "before rayenv.prepare()"))
            for child in ast.iter_child_nodes(node):
                visit(child)
            if _is_prepare(node, aliases, prepares):
                prepared = True

        for st in body:
            visit(st)

    scan(tree.body, "module", True)
    return bad


def test_ray_is_imported_only_after_prepare():
    """Every ``import ray`` / ``from ray...`` of the runtime comes after ``rayenv.prepare()`` in its function:
    Ray reads its environment (token auth, loopback) once, when a process first imports it, and the
    sanitizer's exit handler must be in place before Ray's.  (The driver imports Ray only inside functions
    that run in a Ray worker or once the cluster has prepared and started Ray: ``driver.host.remote_class``,
    ``driver.client``'s kernel pickling; it cannot see the runtime.)"""
    bad = []
    for mod, path in MODULES.items():
        tree = tree_of(mod)
        if mod.startswith("runtime"):
            bad += ray_before_prepare(mod, tree)
        else:
            bad += [f"{mod}:{n.lineno} imports Ray at module level" for n in tree.body if _is_ray_import(n)]
    assert not bad, "\n".join(bad)


def test_ray_scan_catches_one():
    """The scan itself: a Ray import before the call, one in a function that never prepares, and one at
    module level are reported; the prepared ones (also a nested function's own) are not."""
    src = ("from runtime.cluster import rayenv\n"
           "def good():\n    rayenv.prepare()\n    import ray\n    from ray import serve\n"
           "def late():\n    import ray\n    rayenv.prepare()\n"
           "class C:\n    def m(self):\n        from ray.util import x\n"
           "    def ok(self):\n        rayenv.prepare()\n        def inner():\n            import ray\n")
    assert ray_before_prepare("runtime.x", ast.parse(src)) == [
        "runtime.x:7 (late) imports Ray before rayenv.prepare()",
        "runtime.x:11 (m) imports Ray before rayenv.prepare()",
        "runtime.x:15 (inner) imports Ray before rayenv.prepare()"]
    assert ray_before_prepare("runtime.x", ast.parse("import ray\n")) == [
        "runtime.x:1 (module) imports Ray at module level"]


@pytest.mark.parametrize("mod,expect", [
    ("runtime", "support"), ("runtime.hostbuf", "support"), ("runtime.atc.compiler", "support"),
    ("runtime.observe.metrics_store", "support"), ("runtime.memory.allocator", "services"),
    ("runtime.sanitize.session", "services"), ("runtime.api", "device API"), ("runtime.graph", "device API"),
    ("runtime.hccl", "libraries"), ("runtime.offline.model", "libraries"), ("runtime.models.bert", "front ends"),
    ("runtime.acl.rt", "front ends"),
])
def test_core_sublayer_table(mod, expect):
    """The core's sub-layers place its packages in the order their imports follow."""
    assert mod in MODULES
    assert CORE_SUBLAYERS[rank_of(mod)[1]][0] == expect


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
def error_code_literals(codes: set[int], mods=None) -> list[str]:
    """Integer literals equal to a CANN code of the error table, anywhere outside ``devices/errors.py``:
    every module names its codes (``ACL_ERROR_RT_...``), so one table says what each number means."""
    bad = []
    for mod in (MODULES if mods is None else mods):
        if mod == "devices.errors" or mod.startswith("driver._gen"):
            continue
        for node in ast.walk(tree_of(mod)):
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
    assert error_code_literals({207001}, ["runtime.x"]) == ["runtime.x:2 writes error code 207001 as a literal"]
