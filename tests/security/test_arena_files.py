"""Item 5: arena segments are private to the device's Unix user, and a cluster that needs isolation
between processes of that one user turns the same-node shared-memory paths off: then no arena has a name
any process could open, clients copy over gRPC, and HCCL between same-node devices goes over gRPC too."""
from __future__ import annotations

import os
import secrets
import stat

import numpy as np
import pytest

from devices import segments
from devices.arena import SHM_DIR
from devices.hccl_transport import CROSS_NODE
from devices.tasks import Collective
from driver.hccl_grpc import GrpcTransport
from driver.policy import DevicePolicy

from .conftest import SECRET

pytestmark = pytest.mark.security


def test_arena_segments_are_mode_0600(site):
    srv = site.device()
    st = os.stat(os.path.join(SHM_DIR, srv.device.info().arena_name))
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()


def test_without_the_shm_fast_path_no_process_can_map_an_arena(site):
    before = set(os.listdir(SHM_DIR))
    off = DevicePolicy(shm_fast_path=False)
    srvs = [site.device(24, policy=off), site.device(25, policy=off)]
    # anonymous memory: no /dev/shm name of this process (other processes of a shared machine may add theirs)
    assert {n for n in set(os.listdir(SHM_DIR)) - before if (segments.owner(n) or (0, None))[0] == os.getpid()} == set()
    for srv in srvs:
        assert srv.device.info().arena_name == ""
        srv.device.hccl.set_transport(CROSS_NODE, GrpcTransport(srv.address, SECRET, client_id=f"hccl-{srv.device.id}"))
    tok = site.tenant("alice")
    cs = [site.client(srv, tok, same_node=True) for srv in srvs]     # even when forced, nothing to map
    assert not any(c.fast_path for c in cs)
    cid = secrets.token_hex(16)
    peers = [c.hccl_info() for c in cs]
    assert all(p["doorbell"] == "" for p in peers)
    for r, c in enumerate(cs):
        c.hccl_comm_init(cid, r, peers, {"exec_timeout_s": 20.0})
    bufs = []
    for r, c in enumerate(cs):
        p = c.malloc(4 * 64)
        c.memcpy_h2d(p, np.full(64, r + 1, np.float32))
        c.submit([Collective(c.create_stream(), cid, "allreduce", p, p, 64, "float32")])
        bufs.append(p)
    for c in cs:
        c.synchronize_device(20_000)
    for c, p in zip(cs, bufs):
        assert c.memcpy_d2h(p, 4 * 64).view(np.float32).tolist() == [3.0] * 64
