"""A local cluster listens on loopback only, starts no Ray client server, and leaves no process behind:
``vnpu up`` / ``vnpu down`` (the detached cluster) and the embedded :class:`LocalCluster`.

"A process of the cluster" is found independently of how the cluster starts its processes: any process
whose command line or open files name the cluster's Ray temp dir (every Ray process logs under it, also
the workers and agents that rename themselves ``ray::...``).  Listening sockets are read from
``/proc/net/tcp{,6}`` and matched to those processes through their socket inodes.  The time ``vnpu down``
takes is printed (``-s``), never asserted.
"""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time

import pytest

from runtime.cluster.procs import alive, wait_gone

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------------------------- /proc
def cluster_processes(temp_dir: str) -> dict[int, str]:
    """pid -> command line of every live process (not this one) that names ``temp_dir``."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        pid = int(d)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        hit = temp_dir in cmd
        if not hit:
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(temp_dir):
                            hit = True
                            break
                    except OSError:
                        continue
            except OSError:
                continue
        if hit and alive(pid):
            out[pid] = cmd[:200]
    return out


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass
    return out


def _listening() -> dict[int, str]:
    """socket inode -> local address of every listening TCP socket on the machine."""
    out = {}
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if f[3] != "0A":                      # LISTEN
                continue
            hexaddr, port = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if v6:
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                addr = ipaddress.IPv6Address(raw)
                addr = addr.ipv4_mapped or addr
            else:
                addr = ipaddress.IPv4Address(raw[::-1])
            out[int(f[9])] = f"{addr}:{int(port, 16)}"
    return out


def non_loopback_listeners(pids) -> list[str]:
    listen = _listening()
    bad = []
    for pid in pids:
        for inode in _socket_inodes(pid):
            a = listen.get(inode)
            if a is not None and not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback:
                bad.append(f"pid {pid} listens on {a}")
    return bad


# ---------------------------------------------------------------------------------------------- tests
def _vnpu(args, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


_EMBEDDED = """
import json, ray
from runtime.cluster import ClusterSpec, LocalCluster
c = LocalCluster(ClusterSpec(devices=1, arena_bytes=16 << 20, cores=1))
try:
    out = {"pids": [w["pid"] for w in c.where], "temp_dir": c.temp_dir,
           "gcs": ray.get_runtime_context().gcs_address}
finally:
    c.close()
print(json.dumps(out))
"""


def test_vnpu_up_down_loopback_only_and_nothing_left(tmp_path):
    env = dict(os.environ, VNPU_HOME=str(tmp_path / "home"), OPENBLAS_NUM_THREADS="1")
    for k in ("VNPU_TOKEN", "RAY_ADDRESS", "VNPU_BIND"):
        env.pop(k, None)
    up = _vnpu(["up", "--devices", "2", "--hbm-mb", "64"], env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = json.loads((tmp_path / "home" / "cluster.json").read_text())
        temp_dir = st["temp_dir"]
        procs = cluster_processes(temp_dir)
        device_pids = {w["pid"] for w in st["where"]}
        assert device_pids <= set(procs), (device_pids, procs)
        print(f"\n[vnpu up] {len(procs)} processes: " + "; ".join(sorted({c.split()[0].rsplit('/', 1)[-1]
                                                                        for c in procs.values()})))
        assert not [c for c in procs.values() if "ray.util.client.server" in c], "a Ray client server runs"
        assert non_loopback_listeners(procs) == []
        # a LocalCluster started with RAY_ADDRESS naming this (external) cluster starts a Ray of its own
        # and, closing, stops its own devices only: the external cluster's device processes live on
        emb = subprocess.run([sys.executable, "-c", _EMBEDDED], capture_output=True, text=True, timeout=300,
                             cwd=ROOT, env=dict(env, RAY_ADDRESS=st["ray_address"]))
        assert emb.returncode == 0, emb.stdout[-2000:] + emb.stderr[-3000:]
        mine = json.loads(emb.stdout.strip().splitlines()[-1])
        assert not set(mine["pids"]) & device_pids and mine["temp_dir"] != temp_dir
        assert mine["gcs"] != st["ray_address"], mine
        assert all(alive(p) for p in device_pids), "a LocalCluster killed devices of a cluster it did not start"
        assert wait_gone(mine["pids"], 30.0) == []
        # a second `up` with another size is refused with one line (the cluster keeps running)
        again = _vnpu(["up", "--devices", "4"], env)
        assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stdout + again.stderr
        assert "2 devices" in again.stderr and "vnpu down" in again.stderr
        t0 = time.monotonic()
        down = _vnpu(["down"], env)
        took = time.monotonic() - t0
        assert down.returncode == 0, down.stdout + down.stderr
        print(f"[vnpu down] {took:.2f} s (command, including interpreter start)")
        assert wait_gone(procs, 30.0) == [], {p: procs[p] for p in procs if alive(p)}
        assert cluster_processes(temp_dir) == {}
        assert not os.path.exists(temp_dir)
        assert not [w["arena"] for w in st["where"] if os.path.exists(os.path.join("/dev/shm", w["arena"]))]
    finally:
        _vnpu(["down"], env)


def test_local_cluster_loopback_only_and_nothing_left():
    from runtime.cluster import ClusterSpec, LocalCluster
    c = LocalCluster(ClusterSpec(devices=2, arena_bytes=32 << 20, cores=1))
    try:
        procs = cluster_processes(c.temp_dir)
        assert {w["pid"] for w in c.where} <= set(procs)
        assert not [cmd for cmd in procs.values() if "ray.util.client.server" in cmd]
        assert non_loopback_listeners(list(procs) + [os.getpid()]) == []
    finally:
        c.close()
    assert wait_gone(procs, 30.0) == [], {p: procs[p] for p in procs if alive(p)}
    assert cluster_processes(c.temp_dir) == {}
