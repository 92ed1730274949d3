"""Item 4: quotas per tenant, and every resource owned by a lease.  One tenant exhausting its share gets
the CANN code of the resource and leaves the other tenants unaffected; a call that would create a resource
without a lease is refused (ACL_ERROR_RT_CONTEXT_NULL: no device context); what a client leaves is released."""
from __future__ import annotations

import queue
import secrets

import pytest

from devices.arena import block_size
from devices.errors import AclError
from devices.tasks import Memset
from devices.tenancy import Owner
from driver.policy import DevicePolicy

from .conftest import ARENA, SECRET, quota

pytestmark = pytest.mark.security


def _exhaust(create, limit: int, code: int) -> list:
    made = []
    for _ in range(limit):
        made.append(create())
    with pytest.raises(AclError) as e:
        create()
    assert e.value.code == code
    return made


def test_stream_quota(site):
    srv = site.device(policy=quota(streams=8))
    greedy, other = site.client(srv, site.tenant("greedy")), site.client(srv, site.tenant("other"))
    made = _exhaust(greedy.create_stream, 8, 207008)
    for _ in range(8):
        other.create_stream()                               # the other tenant is unaffected
    greedy.destroy_stream(made[0])
    greedy.create_stream()                                  # and the quota is a count, not a lifetime budget


def test_event_quota(site):
    srv = site.device(policy=quota(events=16))
    greedy, other = site.client(srv, site.tenant("greedy")), site.client(srv, site.tenant("other"))
    made = _exhaust(greedy.create_event, 16, 207007)
    other.create_event()
    greedy.destroy_event(made[0])
    greedy.create_event()


def test_memory_quota(site):
    srv = site.device(policy=quota(hbm_bytes=1 << 20))
    greedy, other = site.client(srv, site.tenant("greedy")), site.client(srv, site.tenant("other"))
    made = _exhaust(lambda: greedy.malloc(256 << 10), 3, 207001)    # blocks are a little larger than asked
    p = other.malloc(768 << 10)                                      # more than greedy could still get
    other.free(p)
    greedy.free(made[0])
    greedy.malloc(256 << 10)


def test_watch_quota(site):
    srv = site.device(policy=quota(watches=3))
    tok = site.tenant("greedy")
    greedy = site.client(srv, tok, lease=False)
    refused: queue.Queue = queue.Queue()
    watches = [greedy.watch_health(50) for _ in range(3)]
    for w in watches:
        assert w.wait_open(10)
    w = greedy.watch_health(50, refused.put)
    ev = refused.get(timeout=10)
    assert ev.error is not None and ev.error.code == 207012 and not ev.lost
    w.stop()
    other = site.client(srv, site.tenant("other"), lease=False)
    assert other.watch_health(50).wait_open(10)
    admin = site.client(srv, SECRET, lease=False)                    # the admin has no quota of its own
    assert all(admin.watch_health(50).wait_open(10) for _ in range(4))


@pytest.mark.parametrize("call", ["malloc", "create_stream", "create_event", "graph_create", "submit",
                                  "register_kernel", "hccl_comm_init"])
def test_creating_without_a_lease_is_refused(site, call):
    srv = site.device(policy=DevicePolicy(pickled_kernels=True))
    tok = SECRET if call == "register_kernel" else site.tenant("alice")    # code uploads are the admin's only
    leased = site.client(srv, tok, client_id="leased")
    s, p = leased.create_stream(), leased.malloc(64)
    c = site.client(srv, tok, client_id="no-lease", lease=False)
    before = (srv.device.arena.stats().allocations, len(srv.device.sched.streams), len(srv.device.sched.events),
              len(srv.device.graphs), len(srv.device.hccl.comms))
    fn = {"malloc": lambda: c.malloc(64), "create_stream": c.create_stream, "create_event": c.create_event,
          "graph_create": lambda: c.graph_create([Memset(s, p, 0, 8)]),
          "submit": lambda: c.submit([Memset(s, p, 0, 8)]),
          "register_kernel": lambda: c.register_kernel("alice_k", _k),
          "hccl_comm_init": lambda: c.hccl_comm_init(secrets.token_hex(16), 0, [c.hccl_info()], {})}[call]
    with pytest.raises(AclError) as e:
        fn()
    assert e.value.code == 107002 and "lease" in e.value.detail
    after = (srv.device.arena.stats().allocations, len(srv.device.sched.streams), len(srv.device.sched.events),
             len(srv.device.graphs), len(srv.device.hccl.comms))
    assert after == before
    assert c.mem_info()[1] == ARENA and c.health()[0] == "OK"       # reading is fine without a lease
    leased.submit([Memset(s, p, 0, 8)])                             # and the tenant's leased client works
    leased.synchronize_stream(s, 5000)


def _k(ctx, x):
    pass


def test_a_lease_less_watch_still_works(site):
    """The failover pool's and npu-smi's watches hold no lease: they create nothing, and beat."""
    srv = site.device()
    c = site.client(srv, site.tenant("alice"), lease=False)
    beats: queue.Queue = queue.Queue()
    w = c.watch_health(20, beats.put)
    assert beats.get(timeout=10).health == "OK"
    w.stop()


def test_everything_a_client_leaves_is_released(site):
    srv = site.device()
    dev = srv.device
    c = site.client(srv, site.tenant("alice"), client_id="leaver")
    p = c.malloc(4096)
    s = c.create_stream()
    e = c.create_event()
    c.graph_create([Memset(s, p, 0, 8)])
    c.hccl_comm_init(secrets.token_hex(16), 0, [c.hccl_info()], {})
    assert dev.usage(Owner("alice"))["hbm_bytes"] == block_size(4096)
    c.close()
    assert srv.leases.wait_released(Owner("alice", "leaver"), 10.0)
    assert dev.arena.stats().allocations == 0
    assert (len(dev.sched.streams), len(dev.sched.events), len(dev.graphs), len(dev.hccl.comms)) == (1, 0, 0, 0)
    assert dev.usage(Owner("alice")) == {"streams": 0, "events": 0, "hbm_bytes": 0}
    del e
