"""Chaos campaigns: a seeded, reproducible series of faults against a running multi-device job.

``run_campaign(ChaosConfig(...))`` starts an embedded cluster (``devices`` logical devices plus ``spares``,
actors restartable), runs the workload fault-free for a while (reference results and baseline
throughput), then again for ``duration_s`` while a fault is injected every ``every_s``: kind and victim
chosen by ``random.Random(seed)`` (never the last healthy device).  Each fault gets a live line (time,
fault, device, detected after, recovered after).

The report carries the full history of every request (submit, each attempt, each failure, each
completion with its result digest, each acknowledgement by the consumer, with times; see
:mod:`runtime.cluster.history_check`) and the fault-free digest of every input, and its counts come from the
independent checker of that history (``vnpu chaos check report.json`` re-checks the file): each request
completed exactly once with the fault-free result, delivered once, every extra execution explained by a
failed attempt.  It also gives detection and recovery latencies (hang detection against its deadline),
availability, throughput with vs without faults, and what the campaign left behind -- measured after the
cluster's own graceful teardown and BEFORE any forced cleanup: its device processes, its named actors,
its HBM (every device of the pool, restarted ones included) and the ``/dev/shm`` segments of its device
processes; the forced cleanup then removes only this cluster's segments.
"""
from __future__ import annotations

import collections
import contextlib
import os
import random
import threading
import time
from dataclasses import asdict, dataclass, field, replace

from devices import segments
from devices.errors import AclError
from devices.faults import FAULT_KINDS

from . import history_check
from . import procs
from . import rayenv
from .failover import DevicePool, FailoverOptions, percentiles
from .jobrunner import WORKLOADS as _WORKLOAD_CLASSES
from .jobrunner import History, JobRunner, checksum, make_workload
from .node_faults import NODE_FAULTS, NodeChaos, node_outcome

#: workloads a campaign can run
WORKLOADS = tuple(_WORKLOAD_CLASSES)


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
    #: HBM per device; None: what the workload needs (``arena_bytes`` of its class: 1 GiB for generate)
    arena_bytes: int | None = None
    max_restarts: int = 1000
    options: FailoverOptions = field(default_factory=FailoverOptions)
    #: >= 2: a multi-node cluster (that many worker nodes, the devices and spares spread over them, and a
    #: head without NPUs), which node faults (``node-kill``, :mod:`.node_faults`) need
    nodes: int = 1
    replace_nodes: bool = True               #: a killed node is replaced by one with the same devices

    @property
    def hbm_bytes(self) -> int:
        """The HBM per device this campaign runs with."""
        if self.arena_bytes is not None:
            return self.arena_bytes
        return _WORKLOAD_CLASSES[self.workload].arena_bytes


class _Load:
    """Closed-loop load: keeps ``window`` requests outstanding; request i uses input i % len(inputs)."""

    def __init__(self, runner: JobRunner, inputs: list, window: int, first_id: int = 0):
        self.runner, self.inputs, self.window = runner, inputs, window
        self.next_id = first_id
        self.stop = threading.Event()
        self.input_of: dict[int, int] = {}

    def submit(self, k: int) -> int:
        rid = self.next_id
        self.next_id += 1
        self.input_of[rid] = k
        self.runner.submit(rid, self.inputs[k], input=k)
        return rid

    def run_for(self, seconds: float) -> tuple[int, int]:
        end = time.monotonic() + seconds
        first = self.next_id
        r = self.runner
        while time.monotonic() < end and not self.stop.is_set():
            r.wait_until(lambda r: len(r.requests) - len(r.results) - len(r.errors) < self.window,
                         max(0.0, end - time.monotonic()))
            if time.monotonic() >= end:
                break
            self.submit(self.next_id % len(self.inputs))
        return first, self.next_id


class _Consumer:
    """Where results are delivered: counts deliveries per request id and acknowledges each one in the
    history (with the digest of what it received)."""

    def __init__(self, history: History):
        self.history = history
        self.deliveries: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, rid: int, out) -> None:
        with self._lock:
            self.deliveries[rid] += 1
        self.history.record("ack", rid, digest=checksum(out))


def _link_peer(pool: DevicePool, rng: random.Random, victim: int) -> int:
    peers = sorted(p for p in pool.phys if p != victim)
    return rng.choice(peers) if peers else victim + 1


#: fault kind -> the campaign's parameters for one injection (kinds: devices.faults.FAULT_KINDS)
CAMPAIGN_PARAMS = {
    "kill": lambda rng, cfg, pool, victim: {},
    "hang": lambda rng, cfg, pool, victim: {"duration_ms": rng.randint(*cfg.hang_ms)},
    "slow": lambda rng, cfg, pool, victim: {"factor": 5.0, "duration_ms": rng.randint(*cfg.fault_ms)},
    # the allocations live at the low end of the arena
    "ecc": lambda rng, cfg, pool, victim: {"offset": 0, "length": cfg.hbm_bytes // 2},
    "link-down": lambda rng, cfg, pool, victim: {"peer": _link_peer(pool, rng, victim),
                                                 "duration_ms": rng.randint(*cfg.fault_ms)},
    "task-fail": lambda rng, cfg, pool, victim: {"count": 2},
    "overheat": lambda rng, cfg, pool, victim: {"celsius": 120.0, "duration_ms": rng.randint(*cfg.fault_ms)},
}


def _inject(pool: DevicePool, rng: random.Random, cfg: ChaosConfig, kind: str, victim: int) -> dict:
    params = CAMPAIGN_PARAMS[kind](rng, cfg, pool, victim)
    pid = pool.phys[victim].where.get("pid", 0)
    return dict(inject(pool.handle(victim), kind, params, pid), device=victim)


def inject(handle, kind: str, params: dict, pid: int = 0) -> dict:
    """THE fault injector (``vnpu chaos`` and ``vnpu stress-test``): ``kill`` of a device whose actor process
    ``pid`` is known and alive on this machine is a real SIGKILL of that process; every other fault (and a
    kill without a pid, e.g. an in-process device) goes through the device's ``inject_fault``.  Returns
    ``{"kind", "t" (monotonic), "params"}``."""
    if kind == "kill" and pid and procs.alive(pid) and _is_actor_process(pid):
        # the device process dies for real (SIGKILL), not through the device's own kill switch
        import signal
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        return {"kind": kind, "t": t, "params": {"signal": "SIGKILL", "pid": pid}}
    t = time.monotonic()
    handle.inject_fault(kind, **params)
    return {"kind": kind, "t": t, "params": params}


def _is_actor_process(pid: int) -> bool:
    """A device actor's worker process on this machine (never this process)."""
    if pid == os.getpid():
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"ray" in f.read()
    except OSError:
        return False


def _fault_outcome(f: dict, pool: DevicePool, runner: JobRunner, t_next: float, t_hist: float = 0.0) -> dict:
    """Detection and recovery of fault ``f`` from the pool's events and the runner's history (whose
    times count from ``t_hist``, in monotonic seconds)."""
    v, t0 = f["device"], f["t"]
    det = next((e for e in list(pool.events) if e["kind"] == "detected" and e["physical"] == v
                and t0 <= e["t"] < t_next), None)
    detected_after = None if det is None else det["t"] - t0
    # requests that failed on the victim because of this fault, and when they completed elsewhere
    events = [dict(h, t=h["t"] + t_hist) for h in runner.history.events()]
    failed_ids = {h["id"] for h in events
                  if h["op"] == "attempt-failed" and h.get("physical") == v and t0 <= h["t"] < t_next}
    done_t = {h["id"]: h["t"] for h in events if h["op"] == "complete" and h["id"] in failed_ids}
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


def _named_actors() -> list[str]:
    rayenv.prepare()
    import ray
    from driver.host import ACTOR_PREFIX, NAMESPACE
    if not ray.is_initialized():
        return []
    with contextlib.suppress(Exception):
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX)]
    return []


def _settle(runner, timeout_s: float = 600.0) -> None:
    """Wait for every submitted request of the fault-free phase (model workloads take seconds each)."""
    if not runner.wait(timeout_s):
        raise TimeoutError(f"the fault-free phase did not finish within {timeout_s:.0f} s")
    if runner.errors:
        rid, msg = next(iter(runner.errors.items()))
        raise RuntimeError(f"the fault-free phase failed {len(runner.errors)} request(s), e.g. #{rid}: {msg}")


def leaks(device_pids: set[int], arenas: set[str]) -> dict:
    """What a campaign left behind, measured before any forced cleanup: its device processes still
    running, and the ``/dev/shm`` segments owned by one of its device processes (or named in ``arenas``)
    -- split by whether the owner still runs.  ``other_dead_pid_segments``: segments of dead owners that
    are not this campaign's (reported, never touched)."""
    alive = sorted(p for p in device_pids if procs.alive(p))
    names = segments.list_segments()
    ours, others = [], []
    for n in names:
        pid = (segments.owner(n) or (0, None))[0]
        (ours if (pid in device_pids or n in arenas) else others).append(n)
    return {"processes": alive,
            "segments": sorted(ours),
            "segments_of_dead_processes": sorted(n for n in ours if not segments.owner_alive(*segments.owner(n))),
            "other_dead_pid_segments": sorted(n for n in others if not segments.owner_alive(*segments.owner(n)))}


def hbm_report(before: dict, after: dict) -> dict:
    """HBM in use per device at the end vs at the start: every device of the pool (a restarted device is
    compared with its start too); a device that could not be asked is not back."""
    not_back = {pid: {"start": before.get(pid), "end": used} for pid, used in after.items()
                if used is None or used > (before.get(pid) or 0)}
    return {"hbm_used_baseline": before, "hbm_used_end": after, "hbm_back_to_baseline": not not_back and bool(after),
            "hbm_not_back": not_back}


def run_campaign(cfg: ChaosConfig, out=print) -> dict:
    """Run one campaign (module docstring) and return its report; blocks the host for the whole campaign
    (fault-free phase, ``duration_s`` of faults, drain, teardown)."""
    rng = random.Random(cfg.seed)
    wl = make_workload(cfg.workload)
    inputs = wl.make_inputs(cfg.distinct_inputs, seed=cfg.seed + 1)
    n_phys = cfg.devices + cfg.spares
    t_start = time.monotonic()
    cluster, node_chaos = _campaign_cluster(cfg, n_phys)
    report: dict = {"config": {k: v for k, v in asdict(cfg).items() if k != "options"} | {"hbm_bytes": cfg.hbm_bytes},
                    "options": asdict(cfg.options), "workload": getattr(wl, "name", cfg.workload)}
    pool = runner = None
    hist = History(clock=lambda: time.monotonic() - t_start)
    consumer = _Consumer(hist)
    pids_seen: set[int] = {w["pid"] for w in cluster.where}
    arenas: set[str] = {w["arena"] for w in cluster.where}
    try:
        pool = DevicePool(cluster.where, cluster.token, cfg.devices, _pool_options(cfg, node_chaos))
        hbm0 = pool.hbm_used(every=True)
        runner = JobRunner(pool, wl, on_result=consumer, history=hist)
        load = _Load(runner, inputs, cfg.inflight_per_device * cfg.devices)
        base_rps, reference = _fault_free_phase(cfg, wl, runner, load, len(inputs), out)
        phase = _FaultPhase(cfg, rng, pool, runner, node_chaos, pids_seen, out, t_start)
        drained, faults_rps = phase.run(load)
        faults = phase.faults
        availability = _availability(hist, t_start, phase.t0, phase.t1)
        stats = _fault_stats(cfg, faults)
        # ---------------- back to baseline: replaced nodes joined, every device healthy again, then the
        # job's HBM released
        if node_chaos is not None:
            node_chaos.join()
            report["nodes_replaced"] = node_chaos.replaced
        settled = _heal_all(pool)
        runner.close()
        report.update(hbm_report(hbm0, pool.hbm_used(every=True)))
        _note_devices(pool, pids_seen, arenas)
        report.update({
            "drained": drained, "settled": settled,
            "faults": [{k: v for k, v in f.items()} for f in faults],
            **stats,
            "availability_pct": availability,
            "throughput": {"fault_free_rps": base_rps, "with_faults_rps": faults_rps,
                           "ratio": faults_rps / base_rps if base_rps else None},
            "pool_events": [dict(e, t=e["t"] - t_start) for e in pool.events],
            "reference": reference,
        })
        for f in report["faults"]:
            f["t"] = f["t"] - phase.t0
    finally:
        actors_left, left = _teardown(cluster, pool, runner, pids_seen, arenas)
    _add_history_check(report, hist, consumer)
    _add_leaks(report, actors_left, left, pids_seen, arenas)
    report["elapsed_s"] = time.monotonic() - t_start
    return report


def _pool_options(cfg: ChaosConfig, node_chaos) -> FailoverOptions:
    """The pool's failover options for this campaign: a CPU arena as large as a device's HBM, and a longer
    restart wait when nodes are replaced."""
    opts = replace(cfg.options, cpu_arena_bytes=max(cfg.options.cpu_arena_bytes, cfg.hbm_bytes))
    if node_chaos is not None and node_chaos.replace:      # a node takes longer to come back than an actor
        opts = replace(opts, restart_wait_s=max(opts.restart_wait_s, NODE_RESTART_WAIT_S))
    return opts


def _fault_free_phase(cfg: ChaosConfig, wl, runner: JobRunner, load: _Load, n_inputs: int,
                      out) -> tuple[float, dict[str, str]]:
    """Warm up, then run the load fault-free for the baseline time: its throughput (req/s) and the
    fault-free digest of every input (those the run did not reach are run once each).  Blocks the host
    for the whole phase."""
    base_s = cfg.baseline_s if cfg.baseline_s is not None else min(10.0, max(2.0, cfg.duration_s / 3))
    if getattr(wl, "name", cfg.workload) != cfg.workload:
        out(f"chaos: workload {cfg.workload!r} is not available here: running {wl.name!r} instead")
    out(f"chaos: {cfg.workload} on {cfg.devices} devices (+{cfg.spares} spare, {cfg.hbm_bytes >> 20} MiB HBM "
        f"each), seed {cfg.seed}: fault-free run {base_s:g} s")
    load.run_for(0.5)                                  # warm-up (weights uploaded, first launches)
    _settle(runner)
    tb0 = time.monotonic()
    lo, hi = load.run_for(base_s)
    _settle(runner)
    tb1 = time.monotonic()
    base_rps = (hi - lo) / (tb1 - tb0)
    reference: dict[str, str] = {}
    for rid in range(0, hi):
        if rid in runner.results:
            reference.setdefault(str(load.input_of[rid]), checksum(runner.results[rid]))
    for k in range(n_inputs):                         # inputs the fault-free phase did not reach
        if str(k) not in reference:
            rid = load.submit(k)
            _settle(runner)
            reference[str(k)] = checksum(runner.results[rid])
    out(f"  fault-free: {hi - lo} requests in {tb1 - tb0:.1f} s = {base_rps:.1f} req/s")
    return base_rps, reference


class _FaultPhase:
    """The campaign's fault phase: a thread injects a seeded fault every ``every_s`` while the host keeps
    the load going and prints each fault's outcome once the next fault (or its window) has come.
    ``faults`` holds the injected faults, each replaced by its outcome once printed; ``t0``/``t1`` are
    the phase's start and end (after the drain)."""

    def __init__(self, cfg: ChaosConfig, rng: random.Random, pool: DevicePool, runner: JobRunner, node_chaos,
                 pids_seen: set[int], out, t_start: float):
        self.cfg, self.rng, self.pool, self.runner, self.node_chaos = cfg, rng, pool, runner, node_chaos
        self.pids_seen, self.out, self.t_start = pids_seen, out, t_start
        self.faults: list[dict] = []
        self.printed = 0
        self.t0 = self.t1 = 0.0
        self._stop = threading.Event()

    def run(self, load: _Load) -> tuple[bool, float]:
        """Run the phase (blocks the host for ``duration_s``, then up to 120 s of drain): whether the job
        drained, and the throughput (req/s) of the requests submitted during the phase."""
        self.t0 = time.monotonic()
        t_end = self.t0 + self.cfg.duration_s
        th = threading.Thread(target=self._inject_loop, args=(t_end,), name="vnpu-chaos", daemon=True)
        th.start()
        lo = load.next_id
        while time.monotonic() < t_end:
            load.run_for(min(0.5, t_end - time.monotonic()))
            self._print_ready(False)
        hi = load.next_id
        self._stop.set()
        th.join(timeout=10)
        drained = self.runner.wait(120)
        self.t1 = time.monotonic()
        self._print_ready(True)
        faults_rps = (sum(1 for rid in range(lo, hi) if rid in self.runner.results)) / (self.t1 - self.t0)
        return drained, faults_rps

    def _say(self, msg: str) -> None:
        self.out(f"  t={time.monotonic() - self.t0:5.1f}s  {msg}")

    def _inject_loop(self, t_end: float) -> None:
        k = 0
        while not self._stop.wait(max(0.0, self.t0 + (k + 1) * self.cfg.every_s - time.monotonic())):
            if time.monotonic() >= t_end - 0.5:
                return
            k += 1
            self._inject_one(self.rng.choice(list(self.cfg.faults)))

    def _inject_one(self, kind: str) -> None:
        pool = self.pool
        if kind in NODE_FAULTS:
            f = self.node_chaos.inject(kind, pool, self.rng)
            if f is None:
                self._say(f"skip {kind}: no node may lose its devices now")
                return
            self.pids_seen.update(f["params"]["pids"])
            self.faults.append(f)
            return
        healthy = pool.healthy_physical()
        bound = [b.physical for b in list(pool.bindings.values()) if not b.is_cpu]
        cands = [p for p in healthy if p in bound] or healthy
        if len(healthy) <= 1 or not cands:
            self._say(f"skip {kind}: only {len(healthy)} healthy device")
            return
        victim = self.rng.choice(sorted(cands))
        try:
            f = _inject(pool, self.rng, self.cfg, kind, victim)
        except AclError as e:
            self._say(f"{kind} on device {victim} not injected: {e}")
            return
        if kind == "kill":
            self.pids_seen.add(pool.phys[victim].where.get("pid", 0))
        self.faults.append(f)

    def _print_ready(self, final: bool) -> None:
        faults = self.faults
        while self.printed < len(faults):
            i = self.printed
            f = faults[i]
            t_next = faults[i + 1]["t"] if i + 1 < len(faults) else float("inf")
            if not final and i + 1 >= len(faults) and time.monotonic() - f["t"] < self.cfg.every_s * 0.9:
                return
            outcome = node_outcome if f["kind"] in NODE_FAULTS else _fault_outcome
            o = outcome(f, self.pool, self.runner, t_next, self.t_start)
            faults[i] = o
            self.out(f"  t={o['t'] - self.t0:5.1f}s  {o['kind']:<9} device {o['device']}  detected after "
                     f"{_fmt(o['detected_after_s'])}{' (' + o['cause'] + ')' if o['cause'] else ''}  recovered "
                     f"after {_fmt(o['recovered_after_s'])}  replayed {o['requests_replayed']}")
            self.printed += 1


def _availability(hist: History, t_start: float, t0: float, t1: float) -> float:
    """Share (%) of the 250 ms slices of the fault phase [t0, t1] in which some request completed."""
    done_t = sorted(h["t"] + t_start for h in hist.events() if h["op"] == "complete" and h["t"] + t_start >= t0)
    slices = max(1, int((t1 - t0) / 0.25))
    hit = {int((t - t0) / 0.25) for t in done_t}
    return 100.0 * len([s for s in range(slices) if s in hit]) / slices


def _fault_stats(cfg: ChaosConfig, faults: list[dict]) -> dict:
    """The report's fault statistics: per kind, detection and recovery latencies, hang detection."""
    det = [f["detected_after_s"] for f in faults if f.get("detected_after_s") is not None]
    rec = [f["recovered_after_s"] for f in faults if f.get("recovered_after_s") is not None]
    hang_det = [f["detected_after_s"] for f in faults if f["kind"] == "hang" and f.get("detected_after_s") is not None]
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
    return {
        "faults_by_kind": by_kind,
        "detection_latency_s": percentiles(det), "recovery_latency_s": percentiles(rec),
        "hang_detection": {"deadline_s": cfg.options.hang_deadline_s, **percentiles(hang_det),
                           "within_deadline": all(x <= cfg.options.hang_deadline_s for x in hang_det)},
    }


def _heal_all(pool: DevicePool) -> bool:
    """Clear every live device's injected fault, then wait (up to 30 s) until every device that is not
    dead is healthy: whether it was."""
    for pid in list(pool.phys):
        h = pool.phys[pid].handle
        if h is not None and not h.lost.is_set():
            with contextlib.suppress(AclError):
                h.inject_fault("clear")
    return pool.wait_for(lambda p: len(p.healthy_physical()) == sum(
        1 for q in p.phys.values() if q.state != "dead"), 30.0)


def _note_devices(pool: DevicePool, pids_seen: set[int], arenas: set[str]) -> None:
    """Add the pool's device processes and every arena it has seen to the campaign's sets."""
    for p in pool.phys.values():
        pids_seen.add(p.where.get("pid", 0))
    arenas |= set(pool.arenas_seen)


def _teardown(cluster, pool: DevicePool | None, runner: JobRunner | None, pids_seen: set[int],
              arenas: set[str]) -> tuple[list[str], dict]:
    """Tear the campaign down: graceful first (the job, the pool, the device actors, each closing its
    arena), then measure what it left (named actors still up, :func:`leaks`), then the forced cleanup
    (Ray, its processes, and this cluster's segments only).  Blocks the host up to ~25 s plus the
    cluster's close."""
    from .local import stop_devices
    if runner is not None:
        runner.close()
    if pool is not None:
        arenas |= set(pool.arenas_seen)
        for p in pool.phys.values():
            pids_seen.add(p.where.get("pid", 0))
        pool.close()
    with contextlib.suppress(Exception):
        stop_devices(actors=cluster.actors)
    end = time.monotonic() + 10.0
    while (actors_left := _named_actors()) and time.monotonic() < end:
        threading.Event().wait(0.1)
    device_pids = pids_seen - {0}
    procs.wait_gone(device_pids, 15.0)
    # what this campaign left, measured BEFORE the forced cleanup
    left = leaks(device_pids, arenas - {""})
    # forced cleanup: Ray, its processes, and this cluster's segments only
    cluster.device_pids |= device_pids
    cluster.close()
    return actors_left, left


def _add_history_check(report: dict, hist: History, consumer: _Consumer) -> None:
    """Add the full history and the independent checker's verdict on it (its counts, violations, wrong
    results) and what the consumer saw delivered."""
    events = hist.events()
    report["history"] = events
    check = history_check.check(events, report.get("reference"))
    report.update(check["counts"])                      # the counts come from the checker
    report["check"] = {"ok": check["ok"], "by_kind": check["by_kind"], "violations": check["violations"]}
    report["wrong_result_ids"] = sorted({v["id"] for v in check["violations"] if v["kind"] == "wrong-result"})[:20]
    report["correct"] = check["counts"]["wrong_results"] == 0
    report["deliveries_seen_by_consumer"] = {"requests": len(consumer.deliveries),
                                             "more_than_once": sorted(r for r, n in consumer.deliveries.items()
                                                                      if n > 1)[:20]}


def _add_leaks(report: dict, actors_left: list[str], left: dict, pids_seen: set[int], arenas: set[str]) -> None:
    """Add what the campaign left behind (measured before the forced cleanup) and whether that is nothing."""
    report["leaks"] = {"actors": actors_left, "processes": left["processes"], "segments": left["segments"],
                       "segments_of_dead_processes": left["segments_of_dead_processes"]}
    report["other_dead_pid_segments"] = left["other_dead_pid_segments"]   # not this campaign's: not its leaks
    report["device_pids_seen"] = sorted(pids_seen - {0})
    report["arenas_seen"] = sorted(a for a in arenas if a)
    report["clean"] = not any(report["leaks"].values())


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
        spec = ClusterSpec(devices=n_phys, arena_bytes=cfg.hbm_bytes, cores=cfg.cores)
        return LocalCluster(spec, max_restarts=cfg.max_restarts), None
    from .multinode import MultiNodeCluster, MultiNodeSpec, NodeSpec
    per, extra = divmod(n_phys, cfg.nodes)
    workers = tuple(NodeSpec(npus=per + (1 if i < extra else 0), hbm_bytes=cfg.hbm_bytes) for i in range(cfg.nodes))
    cluster = MultiNodeCluster(MultiNodeSpec(workers=tuple(w for w in workers if w.npus), cores=cfg.cores),
                               max_restarts=cfg.max_restarts)
    return cluster, NodeChaos(cluster, replace=cfg.replace_nodes)


def failures(r: dict) -> list[str]:
    """What makes a campaign's report a failure (empty: it passed): the history check, results that differ
    from the fault-free run, HBM not back to its baseline, anything left behind (``clean``).  ``vnpu chaos``
    exits 1 when there is any."""
    out = []
    if not r["check"]["ok"]:
        out.append(f"history check failed {r['check']['by_kind']}")
    if not r["correct"]:
        out.append(f"results differ from the fault-free run {r['wrong_result_ids']}")
    if not r["hbm_back_to_baseline"]:
        out.append(hbm_text(r))
    if not r["clean"]:
        out.append(f"left behind {leaks_text(r['leaks'])}")
    return out


def _mib(n) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} B"


def hbm_text(r: dict) -> str:
    """``HBM back to baseline on all 3 devices (0 B in use)`` or which device is not, with its start and end."""
    end = r.get("hbm_used_end") or {}
    if r["hbm_back_to_baseline"]:
        used = sorted({v for v in end.values() if v is not None})
        return (f"HBM back to baseline on all {len(end)} devices ("
                + (f"{_mib(used[0])} in use" if len(used) == 1 else "in use: " + ", ".join(
                    f"device {d} {_mib(v)}" for d, v in sorted(end.items()))) + ")")
    if not r.get("hbm_not_back"):
        return "HBM NOT back to baseline: no device could be asked"
    return "HBM NOT back to baseline on " + ", ".join(
        f"device {d} (start {_mib(x.get('start'))}, end {_mib(x.get('end'))})" for d, x in sorted(r["hbm_not_back"].items()))


#: leak kind -> (singular, plural)
_LEAK_WORDS = {"actors": ("actor", "actors"), "processes": ("process", "processes"),
               "segments": ("shared-memory segment", "shared-memory segments"),
               "segments_of_dead_processes": ("segment of a dead process", "segments of dead processes")}


def leaks_text(leaks: dict) -> str:
    """``none``, or ``1 process (pid 4242), 2 shared-memory segments (vnpu_1_2_0_ab, ...)``."""
    parts = []
    for k, v in leaks.items():
        if not v:
            continue
        one, many = _LEAK_WORDS.get(k, (k, k))
        names = [f"pid {x}" if isinstance(x, int) else str(x) for x in v]
        parts.append(f"{len(v)} {one if len(v) == 1 else many} ({', '.join(names[:4])}"
                     f"{', ...' if len(names) > 4 else ''})")
    return ", ".join(parts) or "none"


def summary_lines(r: dict) -> list[str]:
    t = r["throughput"]
    d, c, hd = r["detection_latency_s"], r["recovery_latency_s"], r["hang_detection"]

    def pc(x):
        return "-" if x.get("p50") is None else (f"p50 {x['p50'] * 1000:.0f} ms  p99 {x['p99'] * 1000:.0f} ms  "
                                                  f"max {x['max'] * 1000:.0f} ms  (n={x['n']})")
    lines = [
        f"requests: submitted {r['submitted']}  completed {r['completed']}  failed {r['failed']}  lost {r['lost']}  "
        f"duplicated {r['duplicated']}  (executions {r['executions']}, {r['attempt_failures']} failed attempts "
        f"replayed; {r['deliveries']} deliveries)",
        f"history check: {'OK' if r['check']['ok'] else 'FAILED ' + str(r['check']['by_kind'])}",
        f"results vs fault-free run: {'all equal' if r['correct'] else 'WRONG: ' + str(r['wrong_result_ids'])}",
        f"detection: {pc(d)}",
        f"recovery:  {pc(c)}",
    ]
    if hd.get("n"):
        lines.append(f"hang detection: {pc(hd)} against a {hd['deadline_s'] * 1000:.0f} ms deadline: "
                     f"{'within' if hd['within_deadline'] else 'OVER'}")
    for k, v in sorted(r["faults_by_kind"].items()):
        lines.append(f"  {k:<9} injected {v['injected']}  detected {v['detected']}  detection {pc(v['detection'])}")
    lines += [
        f"availability: {r['availability_pct']:.1f} %",
        f"throughput: {t['with_faults_rps']:.1f} req/s with faults vs {t['fault_free_rps']:.1f} fault-free "
        f"({(t['ratio'] or 0) * 100:.0f} %)",
        f"end state: {hbm_text(r)}; leaks: {leaks_text(r['leaks'])}",
    ]
    return lines


__all__ = ["ChaosConfig", "WORKLOADS", "run_campaign", "failures", "summary_lines", "leaks", "hbm_report", "FAULT_KINDS",
           "hbm_text", "leaks_text",
           "NODE_FAULTS"]
