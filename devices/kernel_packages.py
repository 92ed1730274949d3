"""Kernel packages: the custom kernels a node's operator installs, loaded by the devices of that node.

This is how code reaches a device (as CANN's custom operator packages do: built and installed on the node
by its operator, under ``opp/vendors`` or ``ASCEND_CUSTOM_OPP_PATH``, and found by name at run time).  A
client never ships code: tenants launch installed kernels by name.

A package is one Python file whose module defines ``KERNELS``, a mapping of kernel names to per-block
functions ``fn(ctx, *tensors, **attrs)`` (the user-kernel form of :mod:`devices.kernel`)::

    # my_kernels.py
    import numpy as np

    def axpy(ctx, x, y, alpha=1.0):
        r = ctx.split(x.size)
        y[r.start:r.stop] = y[r.start:r.stop] + np.float32(alpha) * x[r.start:r.stop]

    KERNELS = {"my_axpy": axpy}

The package is named after its file (``my_kernels``: letters, digits and ``_``).  Kernel names follow the
user-kernel rule (1..256 characters, never a built-in's), and one kernel name belongs to one package of a
node.  A device loads the packages its :class:`driver.policy.DevicePolicy` names (files, or directories
whose ``*.py`` files are packages) when it starts and again when the admin asks it to (``ReloadKernels``).

:func:`load_package` raises :class:`InvalidParamError` (ACL_ERROR_RT_PARAM_INVALID) with one line saying
what is wrong; :func:`load_all` collects such errors per file instead, so that one broken package does not
keep a device from starting.  Loading imports the file: it runs the package's module code in this process
(host-blocking for as long as that takes), which is why only the node's operator installs packages.
"""
from __future__ import annotations

import importlib.util
import os
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable

from .errors import InvalidParamError
from .kernel import check_kernel_name

#: a package's name: its file's stem
_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: where loaded package modules are registered in ``sys.modules`` (a private prefix: never importable by name)
MODULE_PREFIX = "_vnpu_kernel_package_"


@dataclass(frozen=True)
class Package:
    """A loaded kernel package: its name, the file it came from and its kernels (name -> function)."""
    name: str
    path: str
    kernels: Mapping[str, Callable[..., None]]

    def describe(self) -> dict:
        return {"path": self.path, "kernels": sorted(self.kernels)}


def package_name(path: str | Path) -> str:
    """The package name of file ``path`` (InvalidParamError unless it is a ``.py`` file with a valid stem)."""
    p = Path(path)
    if p.suffix != ".py" or not _PACKAGE_NAME.fullmatch(p.stem):
        raise InvalidParamError(f"{p}: a kernel package is a .py file named like a Python module "
                                f"(letters, digits, _; at most 64 characters)"[:300])
    return p.stem


def load_package(path: str | Path) -> Package:
    """Import package file ``path`` and check its ``KERNELS`` (host-blocking: runs the module's code).

    InvalidParamError, one line, when the file cannot be read or imported, others could change it or its
    directory (:func:`check_trusted`: checked before any of its code runs), it defines no ``KERNELS``
    mapping, or names a kernel badly (a built-in's name, not a string, not a function)."""
    p = Path(path).expanduser().resolve()
    name = package_name(p)
    if not p.is_file():
        raise InvalidParamError(f"{p}: no such kernel package file")
    check_trusted(p)
    mod_name = MODULE_PREFIX + name
    try:
        spec = importlib.util.spec_from_file_location(mod_name, p)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module           # dataclasses and pickling look their module up there
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:         # noqa: BLE001 - whatever the package's code raised
        sys.modules.pop(mod_name, None)
        raise InvalidParamError(f"{p}: the package does not import: {type(e).__name__}: "
                                f"{' '.join(str(e).split())}"[:300]) from None
    kernels = getattr(module, "KERNELS", None)
    if not isinstance(kernels, Mapping) or not kernels:
        raise InvalidParamError(f"{p}: a kernel package defines KERNELS, a non-empty mapping of kernel "
                                f"names to functions fn(ctx, *tensors, **attrs)")
    for k, fn in kernels.items():
        try:
            check_kernel_name(k)                 # a built-in's name, not a string ...
        except InvalidParamError as e:
            raise InvalidParamError(f"{p}: {e.detail}"[:300]) from None
        if not callable(fn):
            raise InvalidParamError(f"{p}: KERNELS[{k!r}] is not a function")
    return Package(name, str(p), MappingProxyType(dict(kernels)))


def check_trusted(path: Path) -> None:
    """InvalidParamError unless only this user (or root) can change the package file ``path`` (resolved):
    the file and its directory are owned by this process's user or by root and are not writable by group
    or others -- sshd's StrictModes rule.  Otherwise any local user who can write there would run code
    in every device that loads the package."""
    me = os.geteuid()
    for what, p in (("the file", path), (f"its directory {path.parent}", path.parent)):
        try:
            st = os.stat(p)
        except OSError as e:
            raise InvalidParamError(f"{path}: cannot stat {what}: {e.strerror or e}"[:300]) from None
        if st.st_uid not in (me, 0):
            why = f"{what} is owned by uid {st.st_uid}, not by this user (uid {me}) or root"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        else:
            continue
        raise InvalidParamError(f"{path}: refused: {why}; a kernel package runs in the devices: only its owner "
                                f"may change it"[:300])


def package_files(paths) -> list[Path]:
    """The package files ``paths`` name, in load order: each file as given, each directory's ``*.py``
    files sorted by name; a missing directory contributes nothing (no package installed there yet)."""
    out: list[Path] = []
    for entry in paths:
        p = Path(entry).expanduser()
        if p.is_dir():
            out.extend(sorted(f for f in p.glob("*.py") if f.is_file()))
        elif p.exists() or p.suffix == ".py":
            out.append(p)
    unique: dict[Path, Path] = {}
    for f in out:
        unique.setdefault(f.resolve(), f)
    return list(unique.values())


def check_conflicts(pkg: Package, others) -> None:
    """InvalidParamError when ``pkg`` has the name of, or a kernel name of, one of ``others``."""
    for o in others:
        if o.name == pkg.name and o.path != pkg.path:
            raise InvalidParamError(f"{pkg.path}: another package is named {pkg.name!r} ({o.path})")
        clash = sorted(set(pkg.kernels) & set(o.kernels))
        if clash and o.name != pkg.name:
            raise InvalidParamError(f"{pkg.path}: kernel {clash[0]!r} is package {o.name!r}'s ({o.path})")


def load_all(paths) -> tuple[list[Package], dict[str, str]]:
    """Load every package ``paths`` name (see :func:`package_files`): the packages that loaded, and one
    error line per file that did not (a package that clashes with one loaded before it is refused)."""
    packages: list[Package] = []
    errors: dict[str, str] = {}
    for f in package_files(paths):
        try:
            pkg = load_package(f)
            check_conflicts(pkg, packages)
        except InvalidParamError as e:
            errors[str(f)] = e.detail
            continue
        packages.append(pkg)
    return packages, errors


__all__ = ["Package", "MODULE_PREFIX", "package_name", "load_package", "package_files", "check_conflicts",
           "load_all"]
