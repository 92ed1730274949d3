"""Item 2: every path to memory checks the owner.  One foreign-tenant attack per RPC that takes a pointer
or names something that holds one (copies, launches, graphs, streams, events, HCCL, the doorbell IPC);
each must be refused with its code and leave the victim's data as it was."""
from __future__ import annotations

import json
import secrets
import socket

import numpy as np
import pytest

from devices.errors import HCCL_E_PARA, AclError, HcclError, InvalidHandleError
from devices.hccl import scoped_comm_id
from devices.hccl_transport import CROSS_NODE, PROCESS_LINK_KEY, Doorbell
from devices.kernel import TensorDesc
from devices.tasks import Collective, CopyD2D, ExecGraph, Launch, Memset, Record, WriteH2D
from devices.tenancy import Owner
from driver.hccl_grpc import GrpcTransport

from .conftest import SECRET, filled

pytestmark = pytest.mark.security

N = 256
SECRET_BYTE = 0x5A


class Scene:
    """Alice's resources on one device, and Bob (another tenant) who goes after them."""

    def __init__(self, site):
        self.srv = srv = site.device()
        self.alice = site.client(srv, site.tenant("alice"), client_id="alice")
        self.bob = site.client(srv, site.tenant("bob"), client_id="bob")
        self.bob_fast = site.client(srv, site.tenant("bob"), client_id="bob-fast", same_node=True)
        self.admin = site.client(srv, SECRET, lease=False)
        a = self.alice
        self.pa = filled(a, N, SECRET_BYTE)
        self.sa = a.create_stream()
        self.ea = a.create_event()
        self.ga = a.graph_create([Memset(self.sa, self.pa, SECRET_BYTE, 16)])
        self.cid = secrets.token_hex(16)
        a.hccl_comm_init(self.cid, 0, [a.hccl_info()], {"exec_timeout_s": 10.0})
        self.pb = filled(self.bob, N, 0)
        self.sb = self.bob.create_stream()
        assert self.bob_fast.fast_path

    def intact(self) -> bool:
        return self.alice.memcpy_d2h(self.pa, N).tolist() == [SECRET_BYTE] * N


def _u8(p, n=16):
    return TensorDesc(p, (n,), "uint8")


#: attack name -> (what Bob does, the aclError it must get)
ATTACKS = {
    "free": (lambda s: s.bob.free(s.pa), 207006),
    "d2h": (lambda s: s.bob.memcpy_d2h(s.pa, 16), 207006),
    "d2h-fast-path": (lambda s: s.bob_fast.memcpy_d2h(s.pa, 16), 207006),
    "h2d": (lambda s: s.bob.memcpy_h2d(s.pa, b"evil" * 4), 207006),
    "h2d-fast-path": (lambda s: s.bob_fast.memcpy_h2d(s.pa, b"evil" * 4), 207006),
    "d2d-from": (lambda s: s.bob.memcpy_d2d(s.pb, s.pa, 16), 207006),
    "d2d-into": (lambda s: s.bob.memcpy_d2d(s.pa, s.pb, 16), 207006),
    "memset": (lambda s: s.bob.memset(s.pa, 0, 16), 207006),
    "launch-reads": (lambda s: s.bob.submit([Launch(s.sb, "copy", (_u8(s.pa),), (_u8(s.pb),))]), 207006),
    "launch-writes": (lambda s: s.bob.submit([Launch(s.sb, "copy", (_u8(s.pb),), (_u8(s.pa),))]), 207006),
    "copy-op": (lambda s: s.bob.submit([CopyD2D(s.sb, s.pb, s.pa, 16)]), 207006),
    "memset-op": (lambda s: s.bob.submit([Memset(s.sb, s.pa, 0, 16)]), 207006),
    "write-op": (lambda s: s.bob.submit([WriteH2D(s.sb, s.pa, b"evil")]), 207006),
    "graph-capture": (lambda s: s.bob.graph_create([CopyD2D(s.sb, s.pb, s.pa, 16)]), 207006),
    "graph-replay": (lambda s: s.bob.submit([ExecGraph(s.sb, s.ga)]), 107017),
    "graph-destroy": (lambda s: s.bob.graph_destroy(s.ga), 107017),
    "stream": (lambda s: s.bob.submit([Memset(s.sa, s.pb, 0, 16)]), 107017),
    "stream-sync": (lambda s: s.bob.synchronize_stream(s.sa, 1000), 107017),
    "event": (lambda s: s.bob.submit([Record(s.sb, s.ea)]), 107017),
    "collective-buffer": (lambda s: _bob_collective(s, send=s.pa), 207006),
    "collective-on-her-comm": (lambda s: s.bob.submit([Collective(s.sb, s.cid, "allreduce", s.pb, s.pb, 4,
                                                                  "float32")]), 107000),
    "hccl-read": (lambda s: _bob_reads_through_his_comm(s), 207006),
    "hccl-notify": (lambda s: s.bob.hccl_notify([s.cid, 1, "ready", 0, [s.pa, s.pa, 0, []]]), 207006),
    "hccl-async-error": (lambda s: s.bob.hccl_async_error(s.cid), ("hccl", 6)),      # HCCL_E_NOT_FOUND
}


def _bob_collective(s, send):
    cid = secrets.token_hex(16)
    s.bob.hccl_comm_init(cid, 0, [s.bob.hccl_info()], {"exec_timeout_s": 10.0})
    s.bob.submit([Collective(s.sb, cid, "allreduce", send, s.pb, 4, "float32")])


def _bob_reads_through_his_comm(s):
    """The attack of the issue: a one-rank communicator of his own, then HcclRead of Alice's pointer."""
    cid = secrets.token_hex(16)
    s.bob.hccl_comm_init(cid, 0, [s.bob.hccl_info()], {})
    return s.bob.hccl_read(cid, s.pa, 16)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_foreign_tenant_attack_is_refused(site, attack):
    s = Scene(site)
    fn, code = ATTACKS[attack]
    with pytest.raises(AclError) as e:
        fn(s)
        s.bob.synchronize_stream(s.sb, 5000)             # an error that only shows at the synchronize counts too
    if isinstance(code, tuple):
        assert isinstance(e.value, HcclError) and e.value.hccl_code == code[1], e.value
    else:
        assert e.value.code == code, e.value
    assert s.intact()
    # Alice's things still work for Alice
    s.alice.submit([ExecGraph(s.sa, s.ga), Record(s.sa, s.ea)])
    s.alice.synchronize_event(s.ea, 5000)
    assert s.alice.hccl_async_error(s.cid) == 0


def test_her_communicator_id_names_nothing_of_his(site):
    """Bob learns Alice's communicator id: initializing and destroying it touches only a comm of his own
    (ids are scoped by tenant), and Alice's collectives keep working."""
    s = Scene(site)
    s.bob.hccl_comm_init(s.cid, 0, [s.bob.hccl_info()], {})
    s.bob.hccl_comm_destroy(s.cid)
    s.bob.hccl_comm_destroy(s.cid)
    x = s.alice.malloc(16)
    s.alice.memcpy_h2d(x, np.arange(4, dtype=np.float32))
    s.alice.submit([Collective(s.sa, s.cid, "allreduce", x, x, 4, "float32")])
    s.alice.synchronize_stream(s.sa, 10_000)
    assert s.alice.memcpy_d2h(x, 16).view(np.float32).tolist() == [0, 1, 2, 3]


def test_admin_cannot_read_outside_a_running_collective(site):
    """HcclRead is the device-to-device path: even with the cluster token (a peer device), a range is
    served only while the communicator's rank on this device exposes it in a running operator.  A
    2-rank all-reduce across two (simulated) nodes reads through it; afterwards the same range is refused."""
    a0, a1 = site.device(21, node="sim-a"), site.device(22, node="sim-b")
    for srv in (a0, a1):
        srv.device.hccl.set_transport(CROSS_NODE, GrpcTransport(srv.address, SECRET, client_id=f"hccl-{srv.device.id}"))
    tok = site.tenant("alice")
    cs = [site.client(a0, tok), site.client(a1, tok)]
    cid = secrets.token_hex(16)
    peers = [c.hccl_info() for c in cs]
    for r, c in enumerate(cs):
        c.hccl_comm_init(cid, r, peers, {"exec_timeout_s": 20.0})
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
    assert cs[0].memcpy_d2h(bufs[0], 4 * N).view(np.float32).tolist() == [3.0] * N
    pulled = [a.device.hccl.stats["bytes_pulled"] for a in (a0, a1)]
    assert pulled == [4 * N, 4 * N], pulled              # each rank pulls its peer's buffer once
    peer = site.client(a1, SECRET, lease=False)                      # what the peer device's transport is
    scoped = scoped_comm_id(cid, Owner("alice"))
    with pytest.raises(AclError) as e:
        peer.hccl_read(scoped, bufs[1], 16)
    assert e.value.code == 207006
    with pytest.raises(AclError) as e:                              # and a made-up id is nothing at all
        peer.hccl_read(cid, bufs[1], 16)
    assert isinstance(e.value, HcclError) and e.value.hccl_code == HCCL_E_PARA, e.value


def test_forged_doorbell_messages_are_dropped(site):
    """Doorbells are abstract Unix sockets: any local process can send to them.  Only messages sealed with
    the devices' link key are delivered; a forged 'ready' (which would make a rank pull from an address
    of the forger's choosing) never reaches the engine."""
    srv = site.device()
    eng = srv.device.hccl
    name = eng.info()["doorbell"]
    cid = secrets.token_hex(16)
    forged = json.dumps([cid, 1, "ready", 1, [1, 2, 3, []]]).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sk:
        sk.sendto(forged, "\0" + name)
        sk.sendto(b"\x00" * 16 + forged, "\0" + name)
    bell = Doorbell(f"security-test-{secrets.token_hex(4)}", lambda m: True, key=PROCESS_LINK_KEY)
    try:
        bell.send(name, (cid, 1, "marker", 0, None))                # sealed as an engine seals it
    finally:
        bell.close()
    got = eng.mailbox.take([(cid, 1, "marker", 0)], deadline=_deadline(10), probe=lambda m: None,
                           cancelled=lambda: False)
    assert got == [None]
    assert len(eng.mailbox) == 0                                    # the forged ones came first: dropped


def _deadline(s: float) -> float:
    import time
    return time.monotonic() + s
