"""Chaos campaigns: a seeded, reproducible series of faults against a running multi-device job.

``run_campaign(ChaosConfig(...))`` starts an embedded cluster (``devices`` logical devices plus ``spares``,
actors restartable), runs the workload fault-free for a while (reference results and baseline
throughput), then again for ``duration_s`` while a fault is injected every ``every_s``: kind and victim
chosen by ``random.Random(seed)`` (never the last healthy device).  Each fault gets a live line (time,
fault, device, detected after, recovered after).  The report counts requests (submitted / completed /
failed / lost / duplicated, from the runner's history), checks every result against the fault-free one,
gives detection and recovery latencies, availability, throughput with vs without faults, and checks
that HBM, actors, processes and shared-memory segments are back to baseline at the end.
"""
from __future__ import annotations

import contextlib
import glob
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from devices.errors import AclError
from devices.faults import FAULT_KINDS

from .failover import DevicePool, FailoverOptions, percentiles
from .jobrunner import JobRunner, checksum, make_workload
from .node_faults import NODE_FAULTS, NodeChaos, node_outcome


@dataclass(frozen=True)
class ChaosConfig:
    workload: str = "mlp"
    devices: int = 4
    spares: int = 1
    duration_s: float = 60.0
    every_s: float = 5.0
    faults: tuple = ("kill", "hang", "slow", "ecc", "link-down")
    seed: int = 0
    baseline_s: float | None = None          #: fault-free phase (default: min(10, duration / 3))
    inflight_per_device: int = 2
    distinct_inputs: int = 32
    hang_ms: tuple = (1500, 3000)
    fault_ms: tuple = (1500, 3000)
    cores: int | None = 2
    arena_bytes: int = 256 << 20
    max_restarts: int = 1000
    options: FailoverOptions = field(default_factory=FailoverOptions)
    #: >= 2: a multi-node cluster (that many worker nodes, the devices and spares spread over them, and a
    #: head without NPUs), which node faults (``node-kill``, :mod:`.node_faults`) need
    nodes: int = 1
    replace_nodes: bool = True               #: a killed node is replaced by one with the same devices


class _Load:
    """Closed-loop load: keeps ``window`` requests outstanding; request i uses input i % len(inputs)."""

    def __init__(self, runner: JobRunner, inputs: list, window: int, first_id: int = 0):
        self.runner, self.inputs, self.window = runner, inputs, window
        self.next_id = first_id
        self.stop = threading.Event()
        self.input_of: dict[int, int] = {}

    def run_for(self, seconds: float) -> tuple[int, int]:
        end = time.monotonic() + seconds
        first = self.next_id
        r = self.runner
        while time.monotonic() < end and not self.stop.is_set():
            r.wait_until(lambda r: len(r.requests) - len(r.results) - len(r.errors) < self.window,
                         max(0.0, end - time.monotonic()))
            if time.monotonic() >= end:
                break
            rid = self.next_id
            self.next_id += 1
            k = rid % len(self.inputs)
            self.input_of[rid] = k
            r.submit(rid, self.inputs[k])
        return first, self.next_id


def _link_peer(pool: DevicePool, rng: random.Random, victim: int) -> int:
    peers = sorted(p for p in pool.phys if p != victim)
    return rng.choice(peers) if peers else victim + 1


#: fault kind -> the campaign's parameters for one injection (kinds: devices.faults.FAULT_KINDS)
CAMPAIGN_PARAMS = {
    "kill": lambda rng, cfg, pool, victim: {},
    "hang": lambda rng, cfg, pool, victim: {"duration_ms": rng.randint(*cfg.hang_ms)},
    "slow": lambda rng, cfg, pool, victim: {"factor": 5.0, "duration_ms": rng.randint(*cfg.fault_ms)},
    # the allocations live at the low end of the arena
    "ecc": lambda rng, cfg, pool, victim: {"offset": 0, "length": cfg.arena_bytes // 2},
    "link-down": lambda rng, cfg, pool, victim: {"peer": _link_peer(pool, rng, victim),
                                                 "duration_ms": rng.randint(*cfg.fault_ms)},
    "task-fail": lambda rng, cfg, pool, victim: {"count": 2},
    "overheat": lambda rng, cfg, pool, victim: {"celsius": 120.0, "duration_ms": rng.randint(*cfg.fault_ms)},
}


def _inject(pool: DevicePool, rng: random.Random, cfg: ChaosConfig, kind: str, victim: int) -> dict:
    h = pool.handle(victim)
    params = CAMPAIGN_PARAMS[kind](rng, cfg, pool, victim)
    pid = pool.phys[victim].where.get("pid", 0)
    if kind == "kill" and pid and _alive(pid) and _is_actor_process(pid):
        # the device process dies for real (SIGKILL), not through the device's own kill switch
        import signal
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        return {"kind": kind, "device": victim, "t": t, "params": {"signal": "SIGKILL", "pid": pid}}
    t = time.monotonic()
    h.inject_fault(kind, **params)
    return {"kind": kind, "device": victim, "t": t, "params": params}


def _is_actor_process(pid: int) -> bool:
    """A device actor's worker process on this machine (never this process)."""
    if pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ray" in f.read()
    except OSError:
        return False


def _fault_outcome(f: dict, pool: DevicePool, runner: JobRunner, t_next: float) -> dict:
    """Detection and recovery of fault ``f`` from the pool's events and the runner's history."""
    v, t0 = f["device"], f["t"]
    det = next((e for e in list(pool.events) if e["kind"] == "detected" and e["physical"] == v
                and t0 <= e["t"] < t_next), None)
    detected_after = None if det is None else det["t"] - t0
    # requests that failed on the victim because of this fault, and when they completed elsewhere
    failed_ids = {h["id"] for h in list(runner.history)
                  if h["op"] == "attempt-failed" and h.get("physical") == v and t0 <= h["t"] < t_next}
    done_t = {h["id"]: h["t"] for h in list(runner.history) if h["op"] == "completed" and h["id"] in failed_ids}
    recovered_after = None
    if failed_ids and len(done_t) == len(failed_ids):
        recovered_after = max(done_t.values()) - t0
    elif not failed_ids:
        rb = next((e for e in list(pool.events) if e["kind"] == "bound" and e.get("previous") == v
                   and t0 <= e["t"] < t_next), None)
        if rb is not None:
            recovered_after = rb["t"] - t0
    return dict(f, detected_after_s=detected_after, cause=None if det is None else det["cause"],
                requests_replayed=len(failed_ids), recovered_after_s=recovered_after)


def _fmt(x) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def _leaks(where_seen: set[str], pids_seen: set[int]) -> dict:
    end = time.monotonic() + 15.0
    while any(_alive(p) for p in pids_seen) and time.monotonic() < end:
        threading.Event().wait(0.1)
    alive = [p for p in pids_seen if _alive(p)]
    segs = [s for s in where_seen if s and os.path.exists(os.path.join("/dev/shm", s))]
    dead_segs = []
    for p in glob.glob("/dev/shm/vnpu_*"):
        pid = os.path.basename(p).split("_")[1]
        if pid.isdigit() and not _alive(int(pid)):
            dead_segs.append(os.path.basename(p))
    return {"processes": alive, "segments": segs}, dead_segs


def _named_actors() -> list[str]:
    import ray
    from driver.host import ACTOR_PREFIX, NAMESPACE
    if not ray.is_initialized():
        return []
    with contextlib.suppress(Exception):
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX)]
    return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _settle(runner, timeout_s: float = 600.0) -> None:
    """Wait for every submitted request of the fault-free phase (model workloads take seconds each)."""
    if not runner.wait(timeout_s):
        raise TimeoutError(f"the fault-free phase did not finish within {timeout_s:.0f} s")
    if runner.errors:
        rid, msg = next(iter(runner.errors.items()))
        raise RuntimeError(f"the fault-free phase failed {len(runner.errors)} request(s), e.g. #{rid}: {msg}")


def run_campaign(cfg: ChaosConfig, out=print) -> dict:
    from .local import remove_segments
    rng = random.Random(cfg.seed)
    wl = make_workload(cfg.workload)
    inputs = wl.make_inputs(cfg.distinct_inputs, seed=cfg.seed + 1)
    n_phys = cfg.devices + cfg.spares
    t_start = time.monotonic()
    cluster, node_chaos = _campaign_cluster(cfg, n_phys)
    report: dict = {"config": {k: v for k, v in asdict(cfg).items() if k != "options"},
                    "options": asdict(cfg.options), "workload": getattr(wl, "name", cfg.workload)}
    pool = runner = None
    actors_left: list[str] = []
    pids_seen: set[int] = {w["pid"] for w in cluster.where}
    try:
        from dataclasses import replace
        opts = replace(cfg.options, cpu_arena_bytes=max(cfg.options.cpu_arena_bytes, cfg.arena_bytes))
        if node_chaos is not None and node_chaos.replace:      # a node takes longer to come back than an actor
            opts = replace(opts, restart_wait_s=max(opts.restart_wait_s, NODE_RESTART_WAIT_S))
        pool = DevicePool(cluster.where, cluster.token, cfg.devices, opts)
        hbm0 = pool.hbm_used()
        runner = JobRunner(pool, wl)
        load = _Load(runner, inputs, cfg.inflight_per_device * cfg.devices)
        # ---------------- fault-free phase
        base_s = cfg.baseline_s if cfg.baseline_s is not None else min(10.0, max(2.0, cfg.duration_s / 3))
        if getattr(wl, "name", cfg.workload) != cfg.workload:
            out(f"chaos: workload {cfg.workload!r} is not available here: running {wl.name!r} instead")
        out(f"chaos: {cfg.workload} on {cfg.devices} devices (+{cfg.spares} spare), seed {cfg.seed}: "
            f"fault-free run {base_s:g} s")
        load.run_for(0.5)                                  # warm-up (weights uploaded, first launches)
        _settle(runner)
        warm_end = load.next_id
        tb0 = time.monotonic()
        lo, hi = load.run_for(base_s)
        _settle(runner)
        tb1 = time.monotonic()
        base_rps = (hi - lo) / (tb1 - tb0)
        reference: dict[int, str] = {}
        ref_arrays: dict[int, np.ndarray] = {}
        for rid in range(0, hi):
            if rid in runner.results:
                k = load.input_of[rid]
                if k not in reference:
                    reference[k] = checksum(runner.results[rid])
                    ref_arrays[k] = runner.results[rid]
        for k in range(len(inputs)):                      # inputs the fault-free phase did not reach
            if k not in reference:
                rid = load.next_id
                load.next_id += 1
                load.input_of[rid] = k
                runner.submit(rid, inputs[k])
                _settle(runner)
                reference[k] = checksum(runner.results[rid])
                ref_arrays[k] = runner.results[rid]
        out(f"  fault-free: {hi - lo} requests in {tb1 - tb0:.1f} s = {base_rps:.1f} req/s")
        # ---------------- faults
        faults: list[dict] = []
        stop = threading.Event()
        t_faults0 = time.monotonic()
        t_faults_end = t_faults0 + cfg.duration_s

        def chaos_loop():
            k = 0
            while not stop.wait(max(0.0, t_faults0 + (k + 1) * cfg.every_s - time.monotonic())):
                if time.monotonic() >= t_faults_end - 0.5:
                    return
                k += 1
                kind = rng.choice(list(cfg.faults))
                if kind in NODE_FAULTS:
                    f = node_chaos.inject(kind, pool, rng)
                    if f is None:
                        out(f"  t={time.monotonic() - t_faults0:5.1f}s  skip {kind}: no node may lose its devices now")
                        continue
                    pids_seen.update(f["params"]["pids"])
                    faults.append(f)
                    continue
                healthy = pool.healthy_physical()
                bound = [b.physical for b in list(pool.bindings.values()) if not b.is_cpu]
                cands = [p for p in healthy if p in bound] or healthy
                if len(healthy) <= 1 or not cands:
                    out(f"  t={time.monotonic() - t_faults0:5.1f}s  skip {kind}: only {len(healthy)} healthy device")
                    continue
                victim = rng.choice(sorted(cands))
                try:
                    f = _inject(pool, rng, cfg, kind, victim)
                except AclError as e:
                    out(f"  t={time.monotonic() - t_faults0:5.1f}s  {kind} on device {victim} not injected: {e}")
                    continue
                if kind == "kill":
                    pids_seen.add(pool.phys[victim].where.get("pid", 0))
                faults.append(f)

        th = threading.Thread(target=chaos_loop, name="vnpu-chaos", daemon=True)
        printed = 0

        def print_ready(final: bool) -> None:
            nonlocal printed
            while printed < len(faults):
                f = faults[printed]
                t_next = faults[printed + 1]["t"] if printed + 1 < len(faults) else float("inf")
                if not final and printed + 1 >= len(faults) and time.monotonic() - f["t"] < cfg.every_s * 0.9:
                    return
                o = (node_outcome if f["kind"] in NODE_FAULTS else _fault_outcome)(f, pool, runner, t_next)
                faults[printed] = o
                out(f"  t={o['t'] - t_faults0:5.1f}s  {o['kind']:<9} device {o['device']}  detected after "
                    f"{_fmt(o['detected_after_s'])}{' (' + o['cause'] + ')' if o['cause'] else ''}  recovered after "
                    f"{_fmt(o['recovered_after_s'])}  replayed {o['requests_replayed']}")
                printed += 1

        th.start()
        lo2 = load.next_id
        t_end = t_faults_end
        while time.monotonic() < t_end:
            load.run_for(min(0.5, t_end - time.monotonic()))
            print_ready(False)
        hi2 = load.next_id
        stop.set()
        th.join(timeout=10)
        drained = runner.wait(120)
        t_f1 = time.monotonic()
        print_ready(True)
        faults_rps = (sum(1 for rid in range(lo2, hi2) if rid in runner.results)) / (t_f1 - t_faults0)
        # ---------------- correctness and counts
        wrong, approx = [], 0
        for rid, arr in list(runner.results.items()):
            if rid < warm_end:
                continue
            k = load.input_of.get(rid)
            if k is None:
                continue
            if checksum(arr) != reference[k]:
                if np.allclose(arr, ref_arrays[k], rtol=1e-4, atol=1e-5):
                    approx += 1
                else:
                    wrong.append(rid)
        counts = runner.counts()
        # availability: share of 250 ms slices of the fault phase in which some request completed
        done_t = sorted(h["t"] for h in runner.history if h["op"] == "completed" and h["t"] >= t_faults0)
        slices = max(1, int((t_f1 - t_faults0) / 0.25))
        hit = {int((t - t_faults0) / 0.25) for t in done_t}
        availability = 100.0 * len([s for s in range(slices) if s in hit]) / slices
        det = [f["detected_after_s"] for f in faults if f.get("detected_after_s") is not None]
        rec = [f["recovered_after_s"] for f in faults if f.get("recovered_after_s") is not None]
        by_kind: dict = {}
        for f in faults:
            d = by_kind.setdefault(f["kind"], {"injected": 0, "detected": 0, "detect_s": [], "recover_s": []})
            d["injected"] += 1
            if f.get("detected_after_s") is not None:
                d["detected"] += 1
                d["detect_s"].append(f["detected_after_s"])
            if f.get("recovered_after_s") is not None:
                d["recover_s"].append(f["recovered_after_s"])
        for d in by_kind.values():
            d["detection"] = percentiles(d.pop("detect_s"))
            d["recovery"] = percentiles(d.pop("recover_s"))
        # ---------------- back to baseline
        if node_chaos is not None:
            node_chaos.join()
            report["nodes_replaced"] = node_chaos.replaced
        for pid in list(pool.phys):
            h = pool.phys[pid].handle
            if h is not None and not h.lost.is_set():
                with contextlib.suppress(AclError):
                    h.inject_fault("clear")
        settled = pool.wait_for(lambda p: len(p.healthy_physical()) == sum(
            1 for q in p.phys.values() if q.state != "dead"), 30.0)
        runner.close()
        hbm1 = pool.hbm_used()
        for p in pool.phys.values():
            pids_seen.add(p.where.get("pid", 0))
        report.update(counts)
        report.update({
            "drained": drained, "settled": settled,
            "correct": len(wrong) == 0, "wrong_results": wrong[:20], "approx_equal_results": approx,
            "final_errors": dict(list(runner.errors.items())[:10]),
            "attempt_errors": [h for h in runner.history if h["op"] == "attempt-failed"][:40],
            "faults": [{k: v for k, v in f.items()} for f in faults],
            "faults_by_kind": by_kind,
            "detection_latency_s": percentiles(det), "recovery_latency_s": percentiles(rec),
            "availability_pct": availability,
            "throughput": {"fault_free_rps": base_rps, "with_faults_rps": faults_rps,
                           "ratio": faults_rps / base_rps if base_rps else None},
            "hbm_used_baseline": hbm0, "hbm_used_end": hbm1,
            "hbm_back_to_baseline": all(hbm1.get(k, 0) <= hbm0.get(k, 0) for k in hbm1),
            "pool_events": [dict(e, t=e["t"] - t_start) for e in pool.events],
        })
        for f in report["faults"]:
            f["t"] = f["t"] - t_faults0
    finally:
        if runner is not None:
            runner.close()
        arenas = set(pool.arenas_seen) if pool is not None else set()
        if pool is not None:
            pool.close()
        arenas |= {w["arena"] for w in cluster.where}
        from .local import stop_devices
        with contextlib.suppress(Exception):
            arenas |= set(stop_devices())
        end = time.monotonic() + 10.0
        while (actors_left := _named_actors()) and time.monotonic() < end:
            threading.Event().wait(0.1)
        cluster.close()
        remove_segments([a for a in arenas if a and not _alive(_seg_pid(a))])
    leaks, foreign = _leaks(arenas, pids_seen - {0})
    leaks = {"actors": actors_left, **leaks}
    report["leaks"] = leaks
    report["device_pids_seen"] = sorted(pids_seen - {0})
    report["arenas_seen"] = sorted(a for a in arenas if a)
    report["other_dead_pid_segments"] = foreign          # not this campaign's (not counted as its leaks)
    report["clean"] = not any(leaks.values())
    report["elapsed_s"] = time.monotonic() - t_start
    return report


#: how long the pool waits for the devices of a killed node to come back (on a replacement node)
NODE_RESTART_WAIT_S = 120.0


def _campaign_cluster(cfg: ChaosConfig, n_phys: int):
    """The campaign's cluster: one node, or ``cfg.nodes`` worker nodes (devices and spares spread over
    them, device ids node by node) with node faults (:class:`.node_faults.NodeChaos`)."""
    from devices.errors import InvalidParamError
    node_kinds = [k for k in cfg.faults if k in NODE_FAULTS]
    if node_kinds and cfg.nodes < 2:
        raise InvalidParamError(f"fault {node_kinds[0]} needs a multi-node cluster (nodes >= 2), not {cfg.nodes} node")
    if cfg.nodes < 2:
        from .local import ClusterSpec, LocalCluster
        spec = ClusterSpec(devices=n_phys, arena_bytes=cfg.arena_bytes, cores=cfg.cores)
        return LocalCluster(spec, max_restarts=cfg.max_restarts), None
    from .multinode import MultiNodeCluster, MultiNodeSpec, NodeSpec
    per, extra = divmod(n_phys, cfg.nodes)
    workers = tuple(NodeSpec(npus=per + (1 if i < extra else 0), hbm_bytes=cfg.arena_bytes) for i in range(cfg.nodes))
    cluster = MultiNodeCluster(MultiNodeSpec(workers=tuple(w for w in workers if w.npus), cores=cfg.cores),
                               max_restarts=cfg.max_restarts)
    return cluster, NodeChaos(cluster, replace=cfg.replace_nodes)


def _seg_pid(name: str) -> int:
    try:
        return int(name.split("_")[1])
    except (IndexError, ValueError):
        return 0


def summary_lines(r: dict) -> list[str]:
    t = r["throughput"]
    d, c = r["detection_latency_s"], r["recovery_latency_s"]

    def pc(x):
        return "-" if x.get("p50") is None else (f"p50 {x['p50'] * 1000:.0f} ms  p99 {x['p99'] * 1000:.0f} ms  "
                                                  f"max {x['max'] * 1000:.0f} ms  (n={x['n']})")
    lines = [
        f"requests: submitted {r['submitted']}  completed {r['completed']}  failed {r['failed']}  lost {r['lost']}  "
        f"duplicated {r['duplicated']}  (attempts replayed {r['attempt_failures']})",
        f"results vs fault-free run: {'all equal' if r['correct'] else 'WRONG: ' + str(r['wrong_results'])}",
        f"detection: {pc(d)}",
        f"recovery:  {pc(c)}",
    ]
    for k, v in sorted(r["faults_by_kind"].items()):
        lines.append(f"  {k:<9} injected {v['injected']}  detected {v['detected']}  detection {pc(v['detection'])}")
    lines += [
        f"availability: {r['availability_pct']:.1f} %",
        f"throughput: {t['with_faults_rps']:.1f} req/s with faults vs {t['fault_free_rps']:.1f} fault-free "
        f"({(t['ratio'] or 0) * 100:.0f} %)",
        f"end state: HBM {'back to baseline' if r['hbm_back_to_baseline'] else 'NOT at baseline'} "
        f"{r['hbm_used_end']}; leaks: {'none' if r['clean'] else r['leaks']}",
    ]
    return lines


__all__ = ["ChaosConfig", "run_campaign", "summary_lines", "FAULT_KINDS", "NODE_FAULTS"]
