"""pyACL's modules hold their API and nothing else: ``dir(acl)``, ``dir(acl.rt)``, ``dir(acl.util)``,
``dir(acl.mdl)``, ``dir(acl.prof)`` and ``dir(acl.media)`` list exactly the names of tests/reference/pyacl_api.txt (each with
where it comes from: pyACL's reference, the C API's snake_case, or a vnpu extension).  A program that
enumerates a module (as the public samples' harnesses do) sees no imported helper (``np``, ``os``,
``dataclass``, ``as_int`` ...), and those are not attributes at all, as in the real (C-extension) pyACL.
In-process, no device: importing the package is all it takes.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from runtime import acl

REF = Path(__file__).resolve().parents[1] / "reference" / "pyacl_api.txt"
NAMESPACES = ("acl", "acl.rt", "acl.util", "acl.mdl", "acl.op", "acl.prof", "acl.media")
LINE = re.compile(r"^(@constants|[a-z][a-z0-9_]*)\s+([PCUV])(\s.*)?$")


def module(ns: str):
    return importlib.import_module("runtime." + ns)


def reference() -> dict[str, dict[str, str]]:
    """Section -> name -> provenance letter, from the reference file ('@constants' expanded)."""
    out: dict[str, dict[str, str]] = {}
    section = None
    for n, raw in enumerate(REF.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            assert section in NAMESPACES and section not in out, f"line {n}: section {line}"
            out[section] = {}
            continue
        m = LINE.match(line)
        assert m and section is not None, f"line {n} is not 'name  P|C|U|V  source': {raw!r}"
        name, kind = m.group(1), m.group(2)
        if name == "@constants":
            consts = vars(importlib.import_module("runtime.acl._constants"))
            for k in consts:
                if k.isupper() and not k.startswith("_"):
                    out[section][k] = kind
            continue
        assert name not in out[section], f"line {n}: {name} listed twice"
        out[section][name] = kind
    assert sorted(out) == sorted(NAMESPACES)
    return out


REFERENCE = reference()


def public(mod) -> set[str]:
    return {n for n in dir(mod) if not n.startswith("_")}


@pytest.mark.parametrize("ns", NAMESPACES)
def test_dir_lists_exactly_the_api(ns):
    names, want = public(module(ns)), set(REFERENCE[ns])
    assert not names - want, f"dir({ns}) shows what is not its API: {sorted(names - want)}"
    assert not want - names, f"{ns} lacks API of the reference list: {sorted(want - names)}"


@pytest.mark.parametrize("ns,helper", [
    ("acl.rt", "np"), ("acl.rt", "os"), ("acl.rt", "time"), ("acl.rt", "threading"), ("acl.rt", "dataclass"),
    ("acl.rt", "as_int"), ("acl.rt", "lookup"), ("acl.rt", "hostmem"), ("acl.rt", "STATE"), ("acl.rt", "api"),
    ("acl.rt", "acl_call"), ("acl.rt", "log"), ("acl.rt", "ACL_MEMCPY_DEFAULT"), ("acl.rt", "get_version"),
    ("acl.util", "np"), ("acl.util", "ctypes"), ("acl.util", "host_view"), ("acl.util", "record_error"),
    ("acl.mdl", "os"), ("acl.mdl", "offline"), ("acl.mdl", "current_context"), ("acl.mdl", "invalid"),
    ("acl.prof", "os"), ("acl.prof", "profiler"), ("acl.prof", "ProfConfig"), ("acl.prof", "teardown"),
    ("acl", "json"), ("acl", "api"), ("acl", "STATE"), ("acl", "AclError"), ("acl", "acl_call"),
    ("acl", "teardown"), ("acl", "state"), ("acl", "calls"), ("acl", "hostmem"), ("acl", "constants"),
    ("acl", "annotations"),
])
def test_imported_helpers_are_not_attributes(ns, helper):
    """Not hidden from dir() only: the attribute does not exist (real pyACL has none of these)."""
    with pytest.raises(AttributeError):
        getattr(module(ns), helper)


@pytest.mark.parametrize("ns", NAMESPACES)
def test_every_api_name_is_a_function_of_that_name_or_a_module(ns):
    mod = module(ns)
    aliases = {("acl.rt", "destroy_stream_force"): "destroy_stream", ("acl.rt", "stream_get_priority"):
               "get_stream_priority"}
    for name in REFERENCE[ns]:
        obj = getattr(mod, name)
        if name.isupper():
            continue
        if ns == "acl" and name in ("rt", "util", "mdl", "op", "prof", "media"):
            assert obj is module(f"acl.{name}")
            continue
        assert callable(obj), f"{ns}.{name}"
        assert obj.__name__ == aliases.get((ns, name), name), f"{ns}.{name} is {obj.__name__}"


def test_star_import_takes_the_api_only():
    for ns in NAMESPACES[1:]:
        scope: dict = {}
        exec(f"from runtime.{ns} import *", scope)
        assert {k for k in scope if k != "__builtins__"} == set(REFERENCE[ns])


def test_the_calls_belong_to_their_public_module():
    """A call's ``__module__`` is where a program finds it (help(), pickling by reference)."""
    assert acl.rt.malloc.__module__ == "runtime.acl.rt" and acl.mdl.execute.__module__ == "runtime.acl.mdl"
    assert acl.prof.start.__module__ == "runtime.acl.prof" and acl.util.start_thread.__module__ == "runtime.acl.util"
    assert acl.init.__module__ == acl.create_data_buffer.__module__ == acl.get_version.__module__ == "runtime.acl"


def test_the_version_is_acl_get_version():
    """pyACL names aclrtGetVersion ``acl.get_version`` (aclpythondevg_01_0007), works before init."""
    assert acl.get_version() == (1, 15, 0, 0)
    assert not hasattr(acl.rt, "get_version")


def test_the_reference_list_says_where_each_name_comes_from():
    kinds = {k for ns in REFERENCE.values() for k in ns.values()}
    assert kinds <= set("PCUV")
    ext = sorted(f"{ns}.{n}" for ns, names in REFERENCE.items() for n, k in names.items()
                 if k == "V" and not n.isupper())
    assert ext == ["acl.prof.last_output", "acl.rt.register_kernel"]


def test_numpy_contiguous_to_ptr_returns_the_pointer_and_the_contiguous_array():
    """pyACL's form (aclpythondevg_01_0053): ``ptr, data_out = acl.util.numpy_contiguous_to_ptr(data_in)``,
    ``data_out`` a C-contiguous copy when ``data_in`` is not contiguous, else ``data_in`` itself."""
    import numpy as np

    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    ptr, out = acl.util.numpy_contiguous_to_ptr(a)
    assert out is a and ptr == a.ctypes.data
    t = a.T                                                     # not C-contiguous
    ptr, out = acl.util.numpy_contiguous_to_ptr(t)
    assert out is not t and out.flags.c_contiguous and ptr == out.ctypes.data
    np.testing.assert_array_equal(out, t)
    assert bytes(acl.util.ptr_to_bytes(ptr, out.nbytes)) == t.tobytes()     # the address is registered
    with pytest.raises(TypeError):
        acl.util.numpy_contiguous_to_ptr([1, 2, 3])
