"""The cluster's security settings reach the device actors (real Ray actors, real gRPC over loopback):
``ClusterSpec.policy`` (its kernel packages, no pickled kernels, ``vnpu up --no-shm-fast-path``) is what
every device host enforces, the revocation list of the cluster's state is loaded by devices when they
start, and ``vnpu token revoke`` reaches the running ones through Ray."""
from __future__ import annotations

import glob
import secrets
import time
from dataclasses import replace

import grpc
import numpy as np
import pytest

from devices.errors import AclError
from devices.kernel import TensorDesc, register_user_kernel
from devices.tasks import Collective, Launch
from driver import credentials
from driver.policy import DevicePolicy

pytestmark = [pytest.mark.security, pytest.mark.cluster]


def _x2(ctx, x, y):
    y[0:y.size] = x[0:x.size] * np.float32(2)


register_user_kernel("alice_local_x2", _x2, replace=True)    # a kernel of this (the tenant's) program

PKG = "import numpy as np\n\ndef x3(ctx, x, y):\n    y[0:y.size] = x[0:x.size] * np.float32(3)\n\nKERNELS = {'pkg_x3': x3}\n"


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    from runtime.cluster import ClusterSpec, LocalCluster
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("vnpu-home")
    mp.setenv("VNPU_HOME", str(home))                                  # where the revocation list lives
    mp.delenv("VNPU_TENANT_TOKEN", raising=False)
    pkg = home / "x3pkg.py"
    pkg.write_text(PKG)
    spec = ClusterSpec(devices=2, arena_bytes=8 << 20, cores=1,
                       policy=DevicePolicy(kernels=(str(pkg),), shm_fast_path=False))
    try:
        c = LocalCluster(spec)
    except BaseException:
        mp.undo()
        raise
    try:
        yield c, home, None
    finally:
        c.close()
        mp.undo()


def test_the_policy_reaches_the_device_actors(strict):
    from runtime.cluster.remote import RemoteBackend
    c, _, _ = strict
    assert all(w["arena"] == "" for w in c.where)
    for w in c.where:                                                   # no arena is a /dev/shm segment
        assert glob.glob(f"/dev/shm/vnpu_{w['pid']}_*") == []
    be = RemoteBackend(c.where, credentials.mint(c.token, "alice"))
    try:
        d0, d1 = (be.device(w["device_id"]) for w in c.where)
        assert not d0.fast_path
        with pytest.raises(AclError) as e:                             # the device takes no code from her
            d0.register_kernel("alice_x2", _x2)
        assert e.value.code == 207006
        x, y, s = d0.malloc(4 * 64), d0.malloc(4 * 64), d0.create_stream()
        d0.memcpy_h2d(x, np.arange(64, dtype=np.float32))
        launch = [Launch(s, "pkg_x3", (TensorDesc(x, (64,)),), (TensorDesc(y, (64,)),))]
        d0.synchronize_stream(s, 30_000, ops=launch)                   # the installed package's kernel runs
        assert d0.memcpy_d2h(y, 4 * 64).view(np.float32).tolist() == [3.0 * i for i in range(64)]
        before = d0.rpc_count
        with pytest.raises(AclError) as e:                             # her program's own kernel: refused
            d0.submit([Launch(s, "alice_local_x2", (TensorDesc(x, (64,)),), (TensorDesc(y, (64,)),))])
        assert e.value.code == 207006 and "a Python function of this program" in e.value.detail
        assert getattr(e.value, "grpc_status", None) is None           # refused here, not by the device:
        assert d0.rpc_count - before == 1                              # ListKernels only, no code was sent
        assert "alice_local_x2" not in str(d0.list_kernels())
        cid = secrets.token_hex(16)                                    # HCCL between them goes over gRPC
        peers = [d0.hccl_info(), d1.hccl_info()]
        bufs = []
        for r, d in enumerate((d0, d1)):
            d.hccl_comm_init(cid, r, peers, {"exec_timeout_s": 30.0})
        for r, d in enumerate((d0, d1)):
            p = d.malloc(4 * 64)
            d.memcpy_h2d(p, np.full(64, r + 1, np.float32))
            d.submit([Collective(d.create_stream(), cid, "allreduce", p, p, 64, "float32")])
            bufs.append(p)
        for d in (d0, d1):
            d.synchronize_device(30_000)
        assert d1.memcpy_d2h(bufs[1], 4 * 64).view(np.float32).tolist() == [3.0] * 64
    finally:
        be.close()


def test_revocations_reach_started_and_running_actors(strict, capsys):
    from driver.client import RemoteDevice
    from runtime.cli import main
    from runtime.cluster import start_devices
    c, home, _ = strict
    early = credentials.mint(c.token, "early")
    credentials.Revocations().revoke_tokens([early], c.token).save(home / "revoked.json")   # recorded only
    late, late_actors = start_devices(replace(c.spec, devices=1), c.token, detached=False, first_id=2)
    clients = []

    def client(w, tok):
        d = RemoteDevice(w["address"], tok, w["device_id"], timeout_s=10.0, same_node=False)
        clients.append(d)
        return d
    try:
        with pytest.raises(AclError) as e:                              # the new device loaded the list
            client(late[0], early).mem_info()
        assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED
        bob_tok = credentials.mint(c.token, "bob", now=time.time() - 5)     # issued before the revocation
        bobs = [client(w, bob_tok) for w in c.where]
        assert all(b.mem_info()[1] == 8 << 20 for b in bobs)
        assert main(["token", "revoke", "--tenant", "bob"]) == 0       # found through Ray, pushed to all
        assert "pushed to 3 of 3 device(s)" in capsys.readouterr().out
        for b in bobs:
            with pytest.raises(AclError) as e:
                b.mem_info()
            assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED
    finally:
        for d in clients:
            d.close()
        import ray
        for a in late_actors:
            ray.get(a.shutdown.remote(), timeout=30)
            ray.kill(a, no_restart=True)
