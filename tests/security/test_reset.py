"""Item 8: reset works in any state, and communicators are owned by their clients (tenant + client) and
released with their lease."""
from __future__ import annotations

import secrets

import numpy as np
import pytest

from devices.errors import ACL_ERROR_RT_INVALID_HANDLE, AclError
from devices.tasks import Collective
from devices.tenancy import Owner

from .conftest import SECRET

pytestmark = pytest.mark.security

N = 64


def _comm(cs, cid, timeout_s=20.0):
    peers = [c.hccl_info() for c in cs]
    for r, c in enumerate(cs):
        c.hccl_comm_init(cid, r, peers, {"exec_timeout_s": timeout_s})


def _allreduce(cs, cid):
    bufs, streams = [], []
    for r, c in enumerate(cs):
        p = c.malloc(4 * N)
        c.memcpy_h2d(p, np.full(N, r + 1, np.float32))
        s = c.create_stream()
        c.submit([Collective(s, cid, "allreduce", p, p, N, "float32")])
        bufs.append(p)
        streams.append(s)
    for c, s in zip(cs, streams):
        c.synchronize_stream(s, 20_000)
    return [c.memcpy_d2h(p, 4 * N).view(np.float32) for c, p in zip(cs, bufs)]


def test_reset_after_hccl_use(site):
    srvs = [site.device(26), site.device(27)]
    cs = [site.client(s, SECRET) for s in srvs]
    cid = secrets.token_hex(16)
    _comm(cs, cid)
    assert [r.tolist() for r in _allreduce(cs, cid)] == [[3.0] * N] * 2      # CCL buffers now exist
    for c in cs:
        c.reset()
    for srv in srvs:
        assert srv.device.arena.stats().allocations == 0 and not srv.device.hccl.comms
    cid = secrets.token_hex(16)                                               # and the devices work again
    _comm(cs, cid)
    assert [r.tolist() for r in _allreduce(cs, cid)] == [[3.0] * N] * 2


def test_reset_while_a_collective_waits_for_a_peer_that_never_comes(site):
    srvs = [site.device(28), site.device(29)]
    cs = [site.client(s, SECRET) for s in srvs]
    cid = secrets.token_hex(16)
    _comm(cs, cid, timeout_s=60.0)
    p = cs[0].malloc(4 * N)
    s = cs[0].create_stream()
    cs[0].submit([Collective(s, cid, "allreduce", p, p, N, "float32")])   # rank 1 never issues its half
    cs[0].reset()                                                            # must not wait the 60 s out
    with pytest.raises(AclError) as e:
        cs[0].synchronize_stream(s, 1000)                                    # the stream went with the reset
    assert e.value.code == ACL_ERROR_RT_INVALID_HANDLE, e.value
    q = cs[0].malloc(4 * N)
    cs[0].memcpy_h2d(q, np.ones(N, np.float32))
    assert cs[0].memcpy_d2h(q, 8).view(np.float32).tolist() == [1.0, 1.0]
    assert srvs[0].device.arena.stats().allocations == 1


def test_communicators_are_released_with_their_clients_lease(site):
    srvs = [site.device(30), site.device(31)]
    tok = site.tenant("alice")
    cs = [site.client(s, tok, client_id="leaver") for s in srvs]
    cid = secrets.token_hex(16)
    _comm(cs, cid)
    _allreduce(cs, cid)
    stay = site.client(srvs[0], tok, client_id="stayer")
    p = stay.malloc(64)
    for c in cs:
        c.close()
    for srv in srvs:
        assert srv.leases.wait_released(Owner("alice", "leaver"), 10.0)
        assert not srv.device.hccl.comms
    assert srvs[0].device.arena.stats().allocations == 1 and srvs[1].device.arena.stats().allocations == 0
    stay.free(p)
