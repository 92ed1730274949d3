"""Item 3 (and issue 25 item 2): no tenant runs code in a device.  Custom kernels are packages installed on
the node by its operator, launched by name by every tenant; a tenant's code upload is refused before the
request is even parsed -- so before a byte of it is unpickled -- on every cluster, and the admin's only
where the cluster was started to accept it.  Built-ins are immutable; a registered kernel is its tenant's
only and released with its client; only the admin reloads the node's packages."""
from __future__ import annotations

import os
import pickle

import grpc
import numpy as np
import pytest

from devices.errors import AclError
from devices.kernel import TensorDesc
from devices.tasks import Launch
from devices.tenancy import Owner
from driver.credentials import ADMIN_TENANT
from driver.policy import DevicePolicy

from .conftest import SECRET

pytestmark = pytest.mark.security

N = 64
X = np.linspace(-1, 1, N, dtype=np.float32)

#: a kernel package as the node's operator writes it
SCALE_PKG = """
import numpy as np


def scale(ctx, x, y, k=3.0):
    y[0:y.size] = x[0:x.size] * np.float32(k)


KERNELS = {"pkg_scale": scale}
"""


def _evil_relu(ctx, x, y):
    """Bob's 'relu': writes 42 whatever the input."""
    y[0:y.size] = np.full(y.size, 42.0, np.float32)


def _admin_x2(ctx, x, y):
    y[0:y.size] = x[0:x.size] * np.float32(2)


def _launch(c, s, x, y, name):
    c.submit([Launch(s, name, (TensorDesc(x, (N,)),), (TensorDesc(y, (N,)),))])
    c.synchronize_stream(s, 10_000)
    return c.memcpy_d2h(y, 4 * N).view(np.float32)


def _buffers(c):
    x, y = c.malloc(4 * N), c.malloc(4 * N)
    c.memcpy_h2d(x, X)
    return x, y, c.create_stream()


class _Marker:
    """A payload that creates a file when it is unpickled (what an attacker's pickle would do first)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _refused(e) -> None:
    assert e.value.code == 207006
    assert e.value.grpc_status == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("pickled", [False, True], ids=["default", "allow-pickled-kernels"])
def test_a_tenants_code_upload_is_refused_before_unpickling(site, tmp_path, pickled):
    srv = site.device(policy=DevicePolicy(pickled_kernels=pickled))
    marker = tmp_path / "unpickled"
    bob = site.client(srv, site.tenant("bob"))
    with pytest.raises(AclError) as e:
        bob.register_kernel_payload("innocent", pickle.dumps(_Marker(marker)))
    _refused(e)
    assert not marker.exists()
    with pytest.raises(AclError) as e:                   # the client's own path: refused the same way
        bob.register_kernel("bob_x2", _admin_x2)
    _refused(e)
    ch = grpc.insecure_channel(srv.address)              # not even parsed: garbage is refused, not malformed
    try:
        with pytest.raises(grpc.RpcError) as raw:
            ch.unary_unary("/vnpu.v1.ResourceManagement/RegisterKernel")(
                b"\xff\xff\xff\xff\x0f", metadata=(("authorization", f"Bearer {site.tenant('bob')}"),), timeout=10)
        assert raw.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        ch.close()
    listed = bob.list_kernels()
    assert (listed["installed"], listed["registered"], listed["upload"]) == ({}, [], False)
    admin = site.client(srv, SECRET)
    if not pickled:                                      # nobody uploads code to a default cluster
        with pytest.raises(AclError) as e:
            admin.register_kernel_payload("innocent", pickle.dumps(_Marker(marker)))
        _refused(e)
        assert not marker.exists()
    else:                                                # the admin's upload is unpickled: the marker works
        with pytest.raises(AclError) as e:
            admin.register_kernel_payload("innocent", pickle.dumps(_Marker(marker)))
        assert e.value.code == 107000 and "not a function" in e.value.detail
        assert marker.exists()
    assert admin.list_kernels()["upload"] is pickled


def test_an_installed_packages_kernels_work_for_every_tenant(site, tmp_path):
    pkg = tmp_path / "scalepkg.py"
    pkg.write_text(SCALE_PKG)
    srv = site.device(policy=DevicePolicy(kernels=(str(pkg),)))
    assert srv.kernel_report == {"packages": {"scalepkg": {"path": str(pkg), "kernels": ["pkg_scale"]}},
                                 "errors": {}}
    for tenant in ("alice", "bob"):
        c = site.client(srv, site.tenant(tenant))
        x, y, s = _buffers(c)
        np.testing.assert_allclose(_launch(c, s, x, y, "pkg_scale"), 3 * X)
        listed = c.list_kernels()
        assert "pkg_scale" in listed["node"] and listed["installed"] == {"pkg_scale": "scalepkg"}
        assert (listed["registered"], listed["upload"]) == ([], False)
    srv.device.reset()                                   # the node's packages outlive a reset
    c = site.client(srv, site.tenant("carol"))
    x, y, s = _buffers(c)
    np.testing.assert_allclose(_launch(c, s, x, y, "pkg_scale"), 3 * X)


def test_a_builtin_cannot_be_replaced(site, tmp_path):
    evil = tmp_path / "evilpkg.py"
    evil.write_text("def relu(ctx, x, y):\n    y[0:y.size] = x[0:x.size] * 0 + 42\n\nKERNELS = {'relu': relu}\n")
    srv = site.device(policy=DevicePolicy(pickled_kernels=True, kernels=(str(evil),)))
    assert srv.kernel_report["packages"] == {} and "built-in" in srv.kernel_report["errors"][str(evil)]
    with pytest.raises(AclError) as e:                   # not even the admin's upload
        site.client(srv, SECRET).register_kernel("relu", _evil_relu)
    assert e.value.code == 107000
    alice = site.client(srv, site.tenant("alice"))
    x, y, s = _buffers(alice)
    np.testing.assert_array_equal(_launch(alice, s, x, y, "relu"), np.maximum(X, 0))


def test_a_registered_kernel_is_its_tenants_only_and_released_with_its_client(site):
    srv = site.device(policy=DevicePolicy(pickled_kernels=True))
    a1 = site.client(srv, SECRET, client_id="admin-1")
    a1.register_kernel("admin_private_x2", _admin_x2)
    x, y, s = _buffers(a1)
    np.testing.assert_allclose(_launch(a1, s, x, y, "admin_private_x2"), 2 * X)
    bob = site.client(srv, site.tenant("bob"))
    bx, by, bs = _buffers(bob)
    with pytest.raises(AclError) as e:
        _launch(bob, bs, bx, by, "admin_private_x2")
    assert e.value.code == 507027
    assert "admin_private_x2" not in str(bob.list_kernels())
    a2 = site.client(srv, SECRET, client_id="admin-2")
    np.testing.assert_allclose(_launch(a2, a2.create_stream(), x, y, "admin_private_x2"), 2 * X)  # the tenant's
    a1.close()                                                               # its lease ends: released
    assert srv.leases.wait_released(Owner(ADMIN_TENANT, "admin-1", limited=False), 10.0)
    with pytest.raises(AclError) as e:
        _launch(a2, a2.create_stream(), x, y, "admin_private_x2")
    assert e.value.code == 507027


def test_only_the_admin_reloads_the_nodes_packages(site, tmp_path):
    node_dir = tmp_path / "kernels"
    node_dir.mkdir()
    (node_dir / "broken.py").write_text("raise RuntimeError('half-written')\n")
    srv = site.device(policy=DevicePolicy(kernels=(str(node_dir),)))    # a broken package: the device serves
    assert srv.kernel_report["packages"] == {} and "half-written" in srv.kernel_report["errors"][str(node_dir / "broken.py")]
    bob = site.client(srv, site.tenant("bob"))
    x, y, s = _buffers(bob)
    with pytest.raises(AclError) as e:
        _launch(bob, s, x, y, "pkg_scale")
    assert e.value.code == 507027
    (node_dir / "scalepkg.py").write_text(SCALE_PKG)                    # the operator installs a package
    with pytest.raises(AclError) as e:
        bob.reload_kernels()
    _refused(e)
    with pytest.raises(AclError) as e:                                   # not loaded by the tenant's call
        _launch(bob, s, x, y, "pkg_scale")
    assert e.value.code == 507027
    report = site.client(srv, SECRET).reload_kernels()
    assert report["packages"]["scalepkg"]["kernels"] == ["pkg_scale"] and list(report["errors"]) == [
        str(node_dir / "broken.py")]
    np.testing.assert_allclose(_launch(bob, s, x, y, "pkg_scale"), 3 * X)
    (node_dir / "scalepkg.py").unlink()                                  # and removes it
    assert site.client(srv, SECRET).reload_kernels()["packages"] == {}
    with pytest.raises(AclError) as e:
        _launch(bob, s, x, y, "pkg_scale")
    assert e.value.code == 507027


def _marking_pkg(path, mode: int, marker) -> None:
    """A package at ``path`` (``mode``) whose module code leaves ``marker`` behind when it runs."""
    path.write_text(f"open({str(marker)!r}, 'w').close()\nKERNELS = {{'k_{path.stem}': lambda ctx: None}}\n")
    path.chmod(mode)


def test_a_package_others_can_change_is_refused_before_its_code_runs(site, tmp_path):
    """A device loads a package only when no one but its owner (this user, or root) can change it: a file
    writable by group or others, one in a directory writable by group or others (sticky or not: sshd's
    StrictModes), or one owned by another user is refused with one line in the load report, and its code
    never runs; the operator's own package next to them loads."""
    own = tmp_path / "own"
    own.mkdir()
    own.chmod(0o700)
    (own / "scalepkg.py").write_text(SCALE_PKG)
    (own / "scalepkg.py").chmod(0o644)                                   # read by others: fine
    marker = tmp_path / "ran"
    bad = {own / "worldw.py": (0o666, "writable by group or others"),
           own / "groupw.py": (0o620, "writable by group or others")}
    for d, mode in (("shared", 0o777), ("sticky", 0o1777), ("groupdir", 0o770)):
        (tmp_path / d).mkdir()
        (tmp_path / d).chmod(mode)
        bad[tmp_path / d / f"in{d}.py"] = (0o600, f"its directory {tmp_path / d} is writable by group or others")
    if os.geteuid() == 0:                                                # root can give a file away
        theirs = own / "theirs.py"
        bad[theirs] = (0o600, "is owned by uid 4242")
    for path, (mode, _) in bad.items():
        _marking_pkg(path, mode, marker)
    if os.geteuid() == 0:
        os.chown(theirs, 4242, 4242)
    entries = (str(own),) + tuple(str(p) for p in bad if p.parent != own)
    srv = site.device(policy=DevicePolicy(kernels=entries))
    report = srv.kernel_report
    assert list(report["packages"]) == ["scalepkg"], report
    assert sorted(report["errors"]) == sorted(str(p) for p in bad), report["errors"]
    for path, (_, says) in bad.items():
        line = report["errors"][str(path)]
        assert "\n" not in line and "refused" in line and says in line, line
    assert not marker.exists(), "a refused package's code ran"
    bob = site.client(srv, site.tenant("bob"))
    x, y, s = _buffers(bob)
    np.testing.assert_allclose(_launch(bob, s, x, y, "pkg_scale"), 3 * X)


@pytest.mark.parametrize("var", ["VNPU_TENANT_TOKEN", "VNPU_TOKEN"])
def test_a_tenant_cannot_install_a_package(site, tmp_path, monkeypatch, capsys, var):
    """``vnpu kernels`` is the admin's: a process presenting a tenant credential installs, removes and lists
    nothing (exit 2, one line); the devices' ReloadKernels refuses a tenant (above)."""
    from runtime.cli import main
    home = tmp_path / "home"
    (home / "kernels").mkdir(parents=True)
    (home / "token").write_text(SECRET)
    (home / "kernels" / "keep.py").write_text(SCALE_PKG)
    pkg = tmp_path / "mine.py"
    pkg.write_text(SCALE_PKG.replace("pkg_scale", "mine_scale"))
    monkeypatch.setenv("VNPU_HOME", str(home))
    monkeypatch.delenv("VNPU_TOKEN", raising=False)
    monkeypatch.delenv("VNPU_TENANT_TOKEN", raising=False)
    monkeypatch.setenv(var, site.tenant("mallory"))
    for argv in (["install", str(pkg)], ["remove", "keep"], ["list"]):
        assert main(["kernels", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and "admin" in err, err
    assert sorted(p.name for p in (home / "kernels").iterdir()) == ["keep.py"]
