"""``vnpu kernels install | list | remove``: the kernel packages installed on this node (the admin's).

A kernel package is a Python file defining ``KERNELS = {name: fn(ctx, *tensors, **attrs)}``
(:mod:`devices.kernel_packages`).  ``install FILE`` checks that it imports and that its names are free (no
built-in's, no other package's), copies it into the node's package directory (``$VNPU_HOME/kernels``, mode
0600 in a 0700 directory), and has every running device load the directory again (the admin-only DMS
``ReloadKernels``: devices read the files on their node, no code travels); devices started later load it
when they start.  Every tenant then launches its kernels by name.  ``remove NAME`` takes a package out the
same way; ``list`` shows what is installed.

The cluster's admin installs packages: a process that presents a tenant credential (``$VNPU_TENANT_TOKEN``,
or a tenant credential in ``$VNPU_TOKEN``) is refused (exit 2), and so is a tenant's ``ReloadKernels``
(ACL_ERROR_RT_NO_PERMISSION).  A bad package is exit 2 with one line, and nothing is copied; so is a kernel
directory this process cannot write, found before the package's code runs (or a package is removed).  Loading a
package runs its module code in this process (the admin's own code).
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from runtime.cliargs import check_output_dir, fail

#: how a refused kernel directory is named in the one line (``vnpu kernels install | remove`` write there)
_KERNEL_DIR = "VNPU_HOME/kernels (the node's kernel packages)"


def register(sub) -> None:
    k = sub.add_parser("kernels", help="kernel packages installed on this node (custom kernels; admin)",
                       example=("vnpu kernels install my_kernels.py", "vnpu kernels list"))
    ksub = k.add_subparsers(dest="kernels_cmd", required=True)
    i = ksub.add_parser("install", help="install a kernel package file (KERNELS = {name: fn}) on this node",
                        example="vnpu kernels install my_kernels.py --replace")
    i.add_argument("file", metavar="FILE", help="a Python file whose KERNELS dict maps kernel names to functions")
    i.add_argument("--replace", action="store_true", help="replace an installed package of the same name")
    i.set_defaults(fn=_cmd_install)
    ls = ksub.add_parser("list", help="the kernel packages installed on this node and their kernels",
                         example="vnpu kernels list")
    ls.set_defaults(fn=_cmd_list)
    r = ksub.add_parser("remove", help="remove an installed kernel package", example="vnpu kernels remove my_kernels")
    r.add_argument("name", metavar="NAME", help="the package's name, as vnpu kernels list shows it")
    r.set_defaults(fn=_cmd_remove)


def _admin_only(cmd: str) -> None:
    from runtime.cluster.discovery import tenant_credential
    if tenant_credential():
        fail("kernel packages are installed by the cluster's admin, and this process presents a tenant "
             "credential ($VNPU_TENANT_TOKEN / $VNPU_TOKEN)", f"vnpu kernels {cmd}")


def _cmd_install(a) -> int:
    from devices.errors import InvalidParamError
    from devices.kernel_packages import check_conflicts, load_all, load_package
    from runtime.cluster.discovery import kernel_dir
    _admin_only("install")
    prog = "vnpu kernels install"
    src = Path(a.file).expanduser()
    if not src.is_file():
        fail(f"argument FILE: {a.file}: no such file", prog)
    check_output_dir(kernel_dir(), _KERNEL_DIR, prog)      # before the package's code runs
    try:
        pkg = load_package(src)
        dest = kernel_dir() / f"{pkg.name}.py"
        if dest.exists() and not a.replace:
            fail(f"a package named {pkg.name!r} is installed already (--replace replaces it)", prog)
        installed, _ = load_all([kernel_dir()])
        check_conflicts(pkg, [o for o in installed if o.name != pkg.name])
    except InvalidParamError as e:
        fail(e.detail, prog)
    try:
        _write_private(dest, src.read_bytes())
    except OSError as e:                          # changed since the check (or the source became unreadable)
        fail(f"{_KERNEL_DIR}: cannot write {dest}: {e.strerror or e}", prog)
    print(f"installed kernel package {pkg.name} ({', '.join(sorted(pkg.kernels))}) in {dest}")
    return _reload(pkg.name)


def _cmd_list(a) -> int:
    from devices.kernel_packages import load_all
    from runtime.cluster.discovery import kernel_dir
    _admin_only("list")
    packages, errors = load_all([kernel_dir()])
    for p in packages:
        print(f"{p.name}  {p.path}  kernels: {', '.join(sorted(p.kernels))}")
    for path, line in errors.items():
        print(f"{Path(path).stem}  {path}  NOT LOADABLE: {line}")
    if not packages and not errors:
        print(f"no kernel packages installed in {kernel_dir()}")
    return 0


def _cmd_remove(a) -> int:
    from runtime.cluster.discovery import kernel_dir
    _admin_only("remove")
    prog = "vnpu kernels remove"
    path = kernel_dir() / f"{a.name}.py"
    check_output_dir(kernel_dir(), _KERNEL_DIR, prog)
    if not a.name.isidentifier() or not path.is_file():
        fail(f"argument NAME: no kernel package {a.name!r} is installed in {kernel_dir()}", prog)
    try:
        path.unlink()
    except OSError as e:
        fail(f"{_KERNEL_DIR}: cannot remove {path}: {e.strerror or e}", prog)
    print(f"removed kernel package {a.name} ({path})")
    return _reload(None)


def _write_private(dest: Path, data: bytes) -> None:
    """Write ``data`` to ``dest`` at once (a temporary file renamed over it), mode 0600 in a 0700 directory."""
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _reload(name: str | None) -> int:
    """Have every running device load the node's packages again; 1 if one was not reached or could not
    load package ``name``."""
    from runtime.cluster.discovery import admin_token, push, running_devices
    where = running_devices()
    if not where:
        print("no running devices: devices load the node's packages when they start")
        return 0
    reports: dict[int, dict] = {}
    failed = push(where, admin_token(), "vnpu-kernels",
                  lambda d: reports.__setitem__(d.id, d.reload_kernels()))
    for w, e in failed:
        print(f"vnpu: npu{w['device_id']} at {w['address']}: not reached ({e.detail}); it loads the packages "
              f"when it restarts", file=sys.stderr)
    bad = 0
    for dev, rep in sorted(reports.items()):
        for path, line in rep.get("errors", {}).items():
            if name is not None and Path(path).stem == name:
                bad += 1
                print(f"vnpu: npu{dev}: package {name} not loaded: {line}", file=sys.stderr)
    print(f"loaded by {len(reports) - bad} of {len(where)} running device(s)")
    return 1 if failed or bad else 0
