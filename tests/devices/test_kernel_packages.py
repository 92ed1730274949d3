"""Kernel packages, the way custom kernels reach devices: ``vnpu kernels install | list | remove`` on this
node, the packages a cluster.yaml names, and what a device loads.

The CLI runs in-process (:func:`runtime.cli.main`) against a state directory of the test's own
(``$VNPU_HOME``) whose ``cluster.json`` names a device served in this process over real gRPC, so
``install`` and ``remove`` reach a running device the way they reach a cluster's.  A bad package is exit 2
with one line and nothing installed; a process presenting a tenant credential installs nothing.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from devices.device import Device, DeviceConfig
from devices.errors import AclError
from devices.kernel import TensorDesc
from devices.tasks import Launch
from driver import credentials
from driver.client import RemoteDevice
from driver.policy import DevicePolicy
from driver.service import serve
from runtime.cli import main

pytestmark = pytest.mark.rpc

SECRET = "kernel-packages-test-token-0123456789"
N = 16

ADD_PKG = """
import numpy as np


def add_k(ctx, x, y, k=1.0):
    y[0:y.size] = x[0:x.size] + np.float32(k)


KERNELS = {"kp_add": add_k}
"""

#: bad packages: (file name, text, a word the one line must contain)
BAD = [
    ("syntax.py", "def f(:\n", "SyntaxError"),
    ("raises.py", "raise RuntimeError('no GPU here')\n", "no GPU here"),
    ("exits.py", "import sys\nsys.exit(3)\n", "SystemExit"),
    ("nokernels.py", "X = 1\n", "KERNELS"),
    ("emptykernels.py", "KERNELS = {}\n", "KERNELS"),
    ("listkernels.py", "def f(ctx, x): pass\nKERNELS = [f]\n", "KERNELS"),
    ("builtin.py", "def f(ctx, x): pass\nKERNELS = {'matmul': f}\n", "built-in"),
    ("notfn.py", "KERNELS = {'kp_x': 3}\n", "not a function"),
    ("badname.py", "def f(ctx, x): pass\nKERNELS = {'': f}\n", "kernel name"),
    ("bad-name.py", ADD_PKG, "named like a Python module"),
    ("add.txt", ADD_PKG, ".py"),
]


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A state directory with this node's kernel package directory, and a device served in this process
    that loads it (``cluster.json`` names it as the running cluster's device)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "token").write_text(SECRET)
    monkeypatch.setenv("VNPU_HOME", str(home))
    monkeypatch.delenv("VNPU_TOKEN", raising=False)
    monkeypatch.delenv("VNPU_TENANT_TOKEN", raising=False)
    dev = Device(DeviceConfig(device_id=41, arena_bytes=4 << 20, cores=1))
    srv = serve(dev, host="127.0.0.1", token=SECRET, policy=DevicePolicy(kernels=(str(home / "kernels"),)))
    (home / "cluster.json").write_text(json.dumps({"ray_address": "127.0.0.1:1", "where": [
        {"device_id": dev.id, "address": srv.address}]}))
    clients = []

    def client(tenant: str) -> RemoteDevice:
        c = RemoteDevice(srv.address, credentials.mint(SECRET, tenant), dev.id, timeout_s=10.0, same_node=False)
        clients.append(c)
        c.open_lease()
        return c
    try:
        yield home, client
    finally:
        for c in clients:
            c.close()
        srv.stop(grace=None)
        dev.close()


def _cli(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(rc, err, prog="vnpu kernels install"):
    assert rc == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error:"), err


def _add(c):
    x, y, s = c.malloc(4 * N), c.malloc(4 * N), c.create_stream()
    c.memcpy_h2d(x, np.arange(N, dtype=np.float32))
    c.synchronize_stream(s, 10_000, ops=[Launch(s, "kp_add", (TensorDesc(x, (N,)),), (TensorDesc(y, (N,)),),
                                               {"k": 5.0})])
    return c.memcpy_d2h(y, 4 * N).view(np.float32)


def test_install_reaches_the_running_devices_and_every_tenant_launches_by_name(node, tmp_path, capsys):
    home, client = node
    pkg = tmp_path / "addpkg.py"
    pkg.write_text(ADD_PKG)
    alice = client("alice")
    with pytest.raises(AclError) as e:
        _add(alice)
    assert e.value.code == 507027                                    # not installed yet
    rc, out, err = _cli(["kernels", "install", pkg], capsys)
    assert rc == 0, err
    assert "installed kernel package addpkg (kp_add)" in out and "loaded by 1 of 1 running device(s)" in out
    installed = home / "kernels" / "addpkg.py"
    assert installed.read_text() == ADD_PKG and installed.stat().st_mode & 0o777 == 0o600
    assert (home / "kernels").stat().st_mode & 0o777 == 0o700
    for c in (alice, client("bob")):
        np.testing.assert_array_equal(_add(c), np.arange(N, dtype=np.float32) + 5)
    rc, out, _ = _cli(["kernels", "list"], capsys)
    assert rc == 0 and out.startswith(f"addpkg  {installed}  kernels: kp_add")
    rc, out, err = _cli(["kernels", "remove", "addpkg"], capsys)
    assert rc == 0 and "loaded by 1 of 1" in out, err
    assert not installed.exists()
    with pytest.raises(AclError) as e:
        _add(alice)
    assert e.value.code == 507027
    rc, out, _ = _cli(["kernels", "list"], capsys)
    assert rc == 0 and out.startswith("no kernel packages installed")


@pytest.mark.parametrize("name,text,word", BAD, ids=[b[0] for b in BAD])
def test_a_bad_package_is_exit_2_one_line_and_nothing_is_installed(node, tmp_path, capsys, name, text, word):
    home, _ = node
    bad = tmp_path / name
    bad.write_text(text)
    rc, out, err = _cli(["kernels", "install", bad], capsys)
    _one_line(rc, err)
    assert word in err, err
    assert not (home / "kernels").exists() or list((home / "kernels").iterdir()) == []


@pytest.mark.parametrize("where", ["a world-writable file", "a group-writable file", "a world-writable directory"])
def test_install_refuses_a_package_others_can_change_before_running_it(node, tmp_path, capsys, where):
    """The admin's process runs a package's code to check it: a source others could have changed is
    refused first (exit 2, one line), nothing installed; the same text from the admin's own file installs,
    and its installed copy (0600 in a 0700 directory) is one the devices accept."""
    home, client = node
    marker = tmp_path / "ran"
    text = f"open({str(marker)!r}, 'w').close()\n" + ADD_PKG
    shared = tmp_path / "shared"
    shared.mkdir()
    src = (shared if where == "a world-writable directory" else tmp_path) / "addpkg.py"
    src.write_text(text)
    src.chmod({"a world-writable file": 0o666, "a group-writable file": 0o660}.get(where, 0o644))
    shared.chmod(0o777 if where == "a world-writable directory" else 0o755)
    rc, out, err = _cli(["kernels", "install", src], capsys)
    _one_line(rc, err)
    assert "refused" in err and "writable by group or others" in err, err
    assert not marker.exists(), "the package's code ran before its modes were checked"
    assert not (home / "kernels").exists() or list((home / "kernels").iterdir()) == []
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "addpkg.py").write_text(ADD_PKG)
    rc, out, err = _cli(["kernels", "install", mine / "addpkg.py"], capsys)
    assert rc == 0 and "loaded by 1 of 1 running device(s)" in out, err
    np.testing.assert_array_equal(_add(client("alice")), np.arange(N, dtype=np.float32) + 5)


def test_install_refuses_clashes_and_a_missing_file(node, tmp_path, capsys):
    home, _ = node
    (tmp_path / "addpkg.py").write_text(ADD_PKG)
    assert _cli(["kernels", "install", tmp_path / "addpkg.py"], capsys)[0] == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "addpkg.py").write_text(ADD_PKG.replace("k=1.0", "k=2.0"))
    rc, _, err = _cli(["kernels", "install", other / "addpkg.py"], capsys)     # same package name
    _one_line(rc, err)
    assert "installed already" in err
    (other / "clash.py").write_text(ADD_PKG)                                   # another package's kernel name
    rc, _, err = _cli(["kernels", "install", other / "clash.py"], capsys)
    _one_line(rc, err)
    assert "'kp_add' is package 'addpkg''s" in err
    rc, _, err = _cli(["kernels", "install", tmp_path / "missing.py"], capsys)
    _one_line(rc, err)
    assert "missing.py" in err
    rc, _, err = _cli(["kernels", "remove", "nosuch"], capsys)
    _one_line(rc, err, "vnpu kernels remove")
    assert sorted(p.name for p in (home / "kernels").iterdir()) == ["addpkg.py"]
    assert (home / "kernels" / "addpkg.py").read_text() == ADD_PKG
    rc, out, err = _cli(["kernels", "install", "--replace", other / "addpkg.py"], capsys)
    assert rc == 0, err
    assert "k=2.0" in (home / "kernels" / "addpkg.py").read_text()


def test_up_checks_the_packages_its_config_names_before_starting(tmp_path, capsys, monkeypatch):
    import runtime.cluster

    def trip(*a, **k):
        raise AssertionError("the cluster started before its kernel packages were checked")
    monkeypatch.setattr(runtime.cluster, "cluster_up", trip)
    cfg = (tmp_path / "cluster.yaml")
    base = ("available_node_types:\n  h: {resources: {NPU: 2}, node_config: {}}\nhead_node_type: h\n"
            "metadata:\n  vnpu:\n    kernels: [%s]\n")
    (tmp_path / "broken.py").write_text("KERNELS = {'relu': print}\n")
    for kernels, word in (("broken.py", "built-in"), ("nosuch.py", "nosuch.py"), ("nodir/", "nodir")):
        cfg.write_text(base % kernels)
        rc, out, err = _cli(["up", "--config", cfg], capsys)
        _one_line(rc, err, "vnpu up")
        assert "--config" in err and word in err, err


def test_a_cluster_yaml_names_kernel_packages_relative_to_itself(tmp_path):
    from devices.errors import InvalidParamError
    from runtime.cluster import spec_from_yaml
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("available_node_types:\n  h: {resources: {NPU: 2}, node_config: {}}\nhead_node_type: h\n"
                   "metadata: {vnpu: {kernels: [pkgs/addpkg.py, /opt/kernels]}}\n")
    assert spec_from_yaml(cfg).policy.kernels == (str(tmp_path / "pkgs" / "addpkg.py"), "/opt/kernels")
    cfg.write_text("available_node_types:\n  h: {resources: {NPU: 2}, node_config: {}}\nhead_node_type: h\n"
                   "metadata: {vnpu: {kernels: addpkg.py}}\n")
    with pytest.raises(InvalidParamError, match="metadata.vnpu.kernels"):
        spec_from_yaml(cfg)


@pytest.mark.cluster
def test_vnpu_up_gives_its_devices_the_policy(tmp_path, monkeypatch, capsys):
    """``vnpu up`` passes its policy to the head that starts the devices: the config's kernel packages,
    ``--allow-pickled-kernels`` (the admin's uploads) and ``--no-shm-fast-path`` reach the device actors."""
    from runtime.cluster.discovery import read_state, token_file
    home = tmp_path / "home"
    monkeypatch.setenv("VNPU_HOME", str(home))
    monkeypatch.delenv("VNPU_TOKEN", raising=False)
    monkeypatch.delenv("VNPU_TENANT_TOKEN", raising=False)
    (tmp_path / "addpkg.py").write_text(ADD_PKG)
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("available_node_types:\n  h: {resources: {NPU: 1}, labels: {vnpu.hbm-bytes: '16777216'}, "
                   "node_config: {}}\nhead_node_type: h\nmetadata: {vnpu: {kernels: [addpkg.py]}}\n")
    rc, out, err = _cli(["up", "--config", cfg, "--allow-pickled-kernels", "--no-shm-fast-path"], capsys)
    clients = []
    try:
        assert rc == 0, err
        w = read_state()["where"][0]
        assert w["arena"] == ""                                          # --no-shm-fast-path reached it
        for tok in (token_file().read_text(), credentials.mint(token_file().read_text(), "alice")):
            c = RemoteDevice(w["address"], tok, w["device_id"], timeout_s=10.0, same_node=False)
            clients.append(c)
            c.open_lease()
            listed = c.list_kernels()
            assert listed["installed"] == {"kp_add": "addpkg"}           # the config's package
            assert listed["upload"] is (not credentials.is_credential(tok))   # the admin's uploads only
            np.testing.assert_array_equal(_add(c), np.arange(N, dtype=np.float32) + 5)
    finally:
        for c in clients:
            c.close()
        assert _cli(["down"], capsys)[0] == 0
