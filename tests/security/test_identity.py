"""Item 1: identity is authenticated, not claimed.  Tenants present credentials derived from the cluster
secret; the device takes the tenant from the credential, never from the ``vnpu-client`` metadata."""
from __future__ import annotations

import json
import queue
import time

import grpc
import numpy as np
import pytest

from devices.errors import AclError
from devices.tenancy import Owner
from driver import credentials, wire
from driver.client import HealthEvent
from driver.host import NpuHost
from driver.policy import DevicePolicy

from .conftest import SECRET, filled

pytestmark = pytest.mark.security


def test_a_claimed_client_id_is_not_an_identity(site):
    """Mallory claims Alice's client id (the old identity): the device sees Mallory's tenant anyway."""
    srv = site.device()
    alice = site.client(srv, site.tenant("alice"), client_id="alice-1")
    p = filled(alice, 256, 0x5A)
    for token in (site.tenant("mallory"), SECRET):        # another tenant, and the admin: neither is Alice
        mallory = site.client(srv, token, client_id="alice-1")
        with pytest.raises(AclError) as e:
            mallory.memcpy_d2h(p, 16)
        assert e.value.code == 207006
        with pytest.raises(AclError) as e:
            mallory.free(p)
        assert e.value.code == 207006
    assert alice.memcpy_d2h(p, 4).tolist() == [0x5A] * 4


@pytest.mark.parametrize("bad", ["forged", "expired", "other-cluster", "truncated", "tenant-renamed", "garbage"])
def test_bad_credentials_are_unauthenticated(site, bad):
    srv = site.device()
    good = site.tenant("alice")
    token = {
        "forged": good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB"),
        "expired": credentials.mint(SECRET, "alice", ttl_s=60, now=1_000_000.0),
        "other-cluster": credentials.mint("another-cluster-secret-000000000", "alice"),
        "truncated": good[: len(good) // 2],
        "tenant-renamed": good.replace(".alice.", ".admin."),
        "garbage": "vnpu.t1." + "x" * 40,
    }[bad]
    before = srv.device.arena.stats().allocations
    c = site.client(srv, token, lease=False)
    with pytest.raises(AclError) as e:
        c.malloc(64)
    assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED and e.value.code == 207006
    assert srv.device.arena.stats().allocations == before


def test_clients_of_one_tenant_share_its_resources_but_leases_are_per_client(site):
    srv = site.device()
    one = site.client(srv, site.tenant("alice"), client_id="one")
    two = site.client(srv, site.tenant("alice"), client_id="two")    # a second credential of the same tenant
    p = filled(one, 128, 7)
    assert two.memcpy_d2h(p, 4).tolist() == [7] * 4                  # shared within the tenant
    q = filled(two, 128, 9)
    one.close()                                                        # one's lease ends: what it made goes
    assert srv.leases.wait_released(Owner("alice", "one"), 10.0)
    with pytest.raises(AclError) as e:
        two.memcpy_d2h(p, 4)
    assert e.value.code == 107000
    assert two.memcpy_d2h(q, 4).tolist() == [9] * 4                   # two's stays


def test_revocation_reaches_a_running_device(site):
    srv = site.device()
    admin = site.client(srv, SECRET, lease=False)
    tok = site.tenant("alice")
    alice = site.client(srv, tok, client_id="a")
    beats: queue.Queue[HealthEvent] = queue.Queue()
    watch = alice.watch_health(20, beats.put)
    p = filled(alice, 64, 1)
    with pytest.raises(AclError) as e:                                  # a tenant cannot revoke
        alice.revoke(tokens=[site.tenant("bob")])
    assert e.value.code == 207006
    admin.revoke(tokens=[tok])
    with pytest.raises(AclError) as e:
        alice.memcpy_d2h(p, 4)
    assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED
    while True:                                                         # its open watch is cut too
        ev = beats.get(timeout=10)
        if ev.error is not None:
            break
    assert ev.error.grpc_status == grpc.StatusCode.UNAUTHENTICATED and not ev.lost
    watch.stop()
    # a new credential of the tenant works (issued before the tenant's revocation below: the clock's
    # resolution is a millisecond, so the test does not rely on the calls in between taking one)
    fresh = site.client(srv, site.tenant("alice", now=time.time() - 5))
    fresh.malloc(64)
    admin.revoke(tenants=["alice"])                                     # ... until the tenant is revoked
    with pytest.raises(AclError) as e:
        fresh.malloc(64)
    assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED
    later = site.client(srv, site.tenant("alice", now=time.time() + 5))  # credentials issued after that work
    later.malloc(64)


def test_a_restarted_device_loads_the_revocation_file(tmp_path):
    revoked = credentials.mint(SECRET, "alice")
    keep = credentials.mint(SECRET, "bob")
    path = tmp_path / "revoked.json"
    credentials.Revocations.load(path).revoke_tokens([revoked], SECRET).save(path)
    host = NpuHost(31, SECRET, 4 << 20, host="127.0.0.1", cores=1, policy=DevicePolicy(revocations=str(path)))
    from driver.client import RemoteDevice
    clients = [RemoteDevice(host.server.address, t, 31, timeout_s=10.0, same_node=False) for t in (revoked, keep)]
    try:
        with pytest.raises(AclError) as e:
            clients[0].mem_info()
        assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED
        assert clients[1].mem_info()[1] == 4 << 20
    finally:
        for c in clients:
            c.close()
        host.shutdown()


def test_token_cli_creates_and_revokes(site, tmp_path, monkeypatch, capsys):
    """``vnpu token create`` prints a credential the devices accept; ``vnpu token revoke`` pushes the
    revocation to every running device of the cluster and records it for devices that start later."""
    from runtime.cli import main
    srv = site.device()
    home = tmp_path / "home"
    home.mkdir()
    (home / "token").write_text(SECRET)
    (home / "cluster.json").write_text(json.dumps({"ray_address": "127.0.0.1:1", "where": [
        {"device_id": srv.device.id, "address": srv.address}]}))
    monkeypatch.setenv("VNPU_HOME", str(home))
    monkeypatch.delenv("VNPU_TOKEN", raising=False)
    monkeypatch.delenv("VNPU_TENANT_TOKEN", raising=False)
    assert main(["token", "create", "--tenant", "carol", "--ttl", "2h"]) == 0
    tok = capsys.readouterr().out.strip()
    assert credentials.verify(SECRET, tok).tenant == "carol"
    c = site.client(srv, tok)
    p = filled(c, 64, 3)
    assert main(["token", "revoke", tok]) == 0
    with pytest.raises(AclError) as e:
        c.memcpy_d2h(p, 4)
    assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED
    assert credentials.Revocations.load(home / "revoked.json").refuses(credentials.verify(SECRET, tok, check=False))
    assert main(["token", "create", "--tenant", "admin"]) == 2          # the admin's name is reserved
    assert main(["token", "create", "--tenant", "bad name"]) == 2
    assert main(["token", "create", "--tenant", "x", "--ttl", "0s"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 3


def test_the_runtime_uses_a_tenant_credential_when_given_one(site, monkeypatch):
    from runtime.cluster.discovery import load_token
    from runtime.cluster.remote import RemoteBackend
    srv = site.device()
    tok = site.tenant("dave")
    monkeypatch.setenv("VNPU_TOKEN", SECRET)
    monkeypatch.setenv("VNPU_TENANT_TOKEN", tok)
    assert load_token() == tok
    be = RemoteBackend([{"device_id": srv.device.id, "address": srv.address}], load_token(), same_node=False)
    try:
        p = be.device(srv.device.id).malloc(64)
        be.device(srv.device.id).memcpy_h2d(p, np.arange(64, dtype=np.uint8))
        admin = site.client(srv, SECRET)
        with pytest.raises(AclError) as e:
            admin.memcpy_d2h(p, 4)
        assert e.value.code == 207006
        assert site.client(srv, site.tenant("dave")).memcpy_d2h(p, 4).tolist() == [0, 1, 2, 3]
    finally:
        be.close()
    assert wire.CLIENT_KEY == "vnpu-client"


def test_hbm_holders_show_a_tenant_its_own_clients_only(site):
    """``vnpu smi``'s process list comes from device telemetry: the admin sees every client holding HBM (per
    client, bytes and allocations, freed memory gone); a tenant sees its own tenant's clients -- in
    GetTelemetry and in its heartbeats -- never another tenant's name or client ids."""
    srv = site.device()
    alice = site.client(srv, site.tenant("alice"), client_id="host-101-aaaaaaaa")
    bob = site.client(srv, site.tenant("bob"), client_id="host-202-bbbbbbbb")
    pa, pb = alice.malloc(1 << 20), bob.malloc(3 << 20)
    bob.malloc(1 << 10)
    admin = site.client(srv, lease=False)
    seen = {(h["tenant"], h["client"]): h for h in admin.telemetry()["holders"]}
    assert set(seen) == {("alice", "host-101-aaaaaaaa"), ("bob", "host-202-bbbbbbbb")}
    assert seen["bob", "host-202-bbbbbbbb"]["allocations"] == 2
    a, b = seen["alice", "host-101-aaaaaaaa"]["hbm_bytes"], seen["bob", "host-202-bbbbbbbb"]["hbm_bytes"]
    assert b >= (3 << 20) + (1 << 10) > a >= 1 << 20
    assert [h["tenant"] for h in alice.telemetry()["holders"]] == ["alice"]
    beats: queue.Queue = queue.Queue()
    alice.watch_health(20, beats.put)
    assert [h["tenant"] for h in beats.get(timeout=10).telemetry["holders"]] == ["alice"]
    bob.free(pb)
    alice.free(pa)
    assert [h["client"] for h in admin.telemetry()["holders"]] == ["host-202-bbbbbbbb"]
