"""``vnpu bench overhead``: where a small decoder's time goes, five ways, on the modeled and the wall clock.

The same decoder (``--layers`` blocks of rmsnorm -> matmul -> silu -> mul by a per-step gate input ->
matmul -> residual add -> bias add over ``--tokens`` x ``--hidden``, FFN ``--ffn``) decodes ``--steps``
steps five ways, each adding one fix to the one before:

1. **naive** -- eager launches (one submit each), ``malloc``/``free`` of every activation every step
   (raw driver calls), pageable synchronous uploads of the step's inputs, a synchronize after every op;
2. **+ caching pool** -- activations come from the device's caching pool (:mod:`runtime.memory`; without
   it, from buffers allocated once -- the bench says which);
3. **+ pinned + async copies** -- inputs live in pinned host buffers (:mod:`runtime.hostbuf`) and go up
   on a copy stream one step ahead (double-buffered, ordered by events); one synchronize per step;
4. **+ batched launches** -- the launch queue hands ops to the device in batches (one doorbell each);
5. **+ graph replay** -- the step is captured once (per input buffer) and replayed with one launch.

Each run is profiled (:mod:`runtime.profiler`) and printed as the launch / alloc / copy / sync / compute /
idle breakdown on the modeled clock (the reference chip: :mod:`runtime.profiler.hostcost` prices the host
side, :mod:`devices.chip` the device) and on the wall clock (this machine), with the time per step.  The
naive run is compared with the published breakdown of a naive decode loop (launch 22 %, alloc 15 %, H2D
18 %, sync 7 %, compute 38 %).  The baseline is the naive run; the machine's bound is the device compute
alone (the sum of the kernels' own time per step).  Last, the profiler's own cost: decode rounds of
variant 4 alternated with and without profiling, medians of each.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, replace

import numpy as np

from devices.device import DeviceConfig
from devices.kernel import TensorDesc
from runtime import hostbuf, profiler
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.cliargs import int_at_least, positive_int
from runtime.profiler.analysis import CATEGORIES, Breakdown, modeled_timeline, wall_breakdown

#: the published breakdown of a naive decode loop (issue 16), share of the total
PUBLISHED = {"launch": 0.22, "alloc": 0.15, "copy": 0.18, "sync": 0.07, "compute": 0.38}


@dataclass(frozen=True)
class Variant:
    name: str
    pool: bool = False          #: activations from the caching pool (else raw malloc/free every step)
    pinned_async: bool = False  #: pinned inputs, uploaded one step ahead on a copy stream; one sync per step
    batch: int = 1              #: launch-queue batch size (ops per submit)
    graph: bool = False         #: replay a captured step


VARIANTS = (
    Variant("1 naive"),
    Variant("2 +caching pool", pool=True),
    Variant("3 +pinned, async copies", pool=True, pinned_async=True),
    Variant("4 +batched launches", pool=True, pinned_async=True, batch=8),
    Variant("5 +graph replay", pool=True, pinned_async=True, batch=8, graph=True),
)


@dataclass(frozen=True)
class DecoderSpec:
    layers: int = 4
    tokens: int = 64
    hidden: int = 1024
    ffn: int = 4608
    block_dim: int = 4
    seed: int = 0


def register(bs) -> None:
    p = bs.add_parser("overhead", help="where a small decoder's time goes, naive -> pool -> pinned/async -> "
                                       "batched -> graph, modeled and wall",
                      example="vnpu bench overhead --steps 6 --rounds 5")
    p.add_argument("--steps", type=positive_int, default=6, help="profiled decode steps per variant (default 6)")
    p.add_argument("--layers", type=positive_int, default=DecoderSpec.layers,
                   help=f"decoder layers (default {DecoderSpec.layers})")
    p.add_argument("--tokens", type=positive_int, default=DecoderSpec.tokens, help="tokens decoded per step")
    p.add_argument("--hidden", type=int_at_least(8), default=DecoderSpec.hidden,
                   help=f"hidden size (default {DecoderSpec.hidden})")
    p.add_argument("--ffn", type=int_at_least(8), default=DecoderSpec.ffn,
                   help=f"FFN width (default {DecoderSpec.ffn})")
    p.add_argument("--block-dim", type=positive_int, default=DecoderSpec.block_dim, help="blocks per matmul")
    p.add_argument("--rounds", type=int_at_least(0), default=5,
                   help="alternated rounds with/without the profiler for its cost (0: skip; default 5)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=run)


# ---------------------------------------------------------------------------------------------- the decoder
class Decoder:
    """Weights on one device and the host inputs of each step (what the variants share)."""

    def __init__(self, dev, spec: DecoderSpec):
        self.dev, self.spec = dev, spec
        rng = np.random.default_rng(spec.seed)
        t, h, f = spec.tokens, spec.hidden, spec.ffn
        self.layers = []
        self.host: list[dict] = []                #: the same weights on the host (the reference's)
        for _ in range(spec.layers):
            w = {"gamma": np.ones(h, np.float32),
                 "w1": (rng.standard_normal((h, f), np.float32) / np.sqrt(h)).astype(np.float32),
                 "w2": (rng.standard_normal((f, h), np.float32) / np.sqrt(f)).astype(np.float32),
                 "bias": np.full((t, h), 0.01, np.float32)}
            self.host.append(w)
            self.layers.append({k: dev.from_numpy(v) for k, v in w.items()})
        self.x_host = rng.standard_normal((t, h), np.float32)
        self.gate_host = [rng.random((t, f), np.float32) for _ in range(spec.layers)]

    def shapes(self) -> dict:
        t, h, f = self.spec.tokens, self.spec.hidden, self.spec.ffn
        return {"h": (t, h), "u": (t, f), "v": (t, h)}

    def layer_ops(self, launch, x, gate, acts, layer) -> None:
        """The 7 ops of one block (``launch(kernel, ins, outs, block_dim=0)``)."""
        w = self.layers[layer]
        bd = self.spec.block_dim
        h, u, v = acts["h"], acts["u"], acts["v"]
        launch("rmsnorm", [x, w["gamma"]], [h])
        launch("matmul", [h, w["w1"]], [u], bd)
        launch("silu", [u], [u])
        launch("mul", [u, gate], [u])
        launch("matmul", [u, w["w2"]], [v], bd)
        launch("add", [x, v], [x])
        launch("add", [x, w["bias"]], [x])

    def reference(self) -> np.ndarray:
        """One step's output (every step decodes the same inputs) in float64 numpy."""
        x = self.x_host.astype(np.float64)
        for w, gate in zip(self.host, self.gate_host):
            h = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w["gamma"]
            u = h @ w["w1"].astype(np.float64)
            u = u / (1.0 + np.exp(-u)) * gate
            x = x + u @ w["w2"].astype(np.float64) + w["bias"]
        return x

    def free(self) -> None:
        for w in self.layers:
            for t in w.values():
                t.free()


def _desc(ptr: int, shape) -> TensorDesc:
    return TensorDesc(int(ptr), tuple(shape), "float32")


def _nbytes(shape) -> int:
    return int(np.prod(shape)) * 4


class Run:
    """One variant on one device: ``step()`` decodes one step; ``close()`` frees what it holds.

    A step's inputs (the hidden states and one gate per layer) live in one device buffer per input set
    (two sets when uploads run a step ahead); the naive runs upload each part with its own synchronous
    pageable copy, the async runs upload the whole set from one pinned staging buffer in one copy."""

    def __init__(self, dec: Decoder, v: Variant):
        self.dec, self.v, self.dev = dec, v, dec.dev
        d, spec = self.dev, dec.spec
        self.s = d.stream()
        t, h, f = spec.tokens, spec.hidden, spec.ffn
        self.pool_used = v.pool and _has_pool(d)
        sets = 2 if v.pinned_async else 1
        n_in = t * h + spec.layers * t * f
        self.inputs = [d.empty((n_in,)) for _ in range(sets)]
        self.x = [buf.view((t, h)) for buf in self.inputs]
        self.gates = [[buf.view((t, f), offset_bytes=(t * h + i * t * f) * 4) for i in range(spec.layers)]
                      for buf in self.inputs]
        self.out_host = hostbuf.pinned_empty((t, h)) if v.pinned_async else None
        if v.pinned_async:
            self.cs = d.stream()
            self.ev = [d.event(), d.event()]
            self.staging = hostbuf.pinned_empty((n_in,))
            self.staging[:t * h] = dec.x_host.reshape(-1)
            for i, g in enumerate(dec.gate_host):
                self.staging[t * h + i * t * f:t * h + (i + 1) * t * f] = g.reshape(-1)
        # activations: per layer from the driver (naive) or the pool; made once when there is no pool
        # (the stand-in) or for a captured graph (its buffers must not move)
        self.fixed = self._alloc_acts() if (v.pool and not self.pool_used) or v.graph else None
        self.graphs = None
        self.k = 0
        if v.pinned_async:
            self._upload_async(0)
        if v.graph:
            self.graphs = []
            for p in range(sets):
                with self.s.capture() as cap:
                    self._ops(p)
                self.graphs.append(cap.graph)

    # -- pieces
    def _alloc_acts(self) -> dict:
        d = self.dev
        if self.pool_used:           # blocks of the caching pool, for work on the compute stream
            return {k: d.empty(shape, stream=self.s) for k, shape in self.dec.shapes().items()}
        if self.v.pool:              # no pool on this branch: plain tensors (made once, see __init__)
            return {k: d.empty(shape) for k, shape in self.dec.shapes().items()}
        return {k: _desc(d.malloc(_nbytes(shape)), shape) for k, shape in self.dec.shapes().items()}

    def _free_acts(self, acts: dict) -> None:
        for a in acts.values():
            if isinstance(a, TensorDesc):
                self.dev.free(a.ptr)
            else:
                a.free()

    def _upload_async(self, step: int) -> None:
        p = step % 2
        self.cs.write(self.inputs[p].ptr, self.staging)
        self.ev[p].record(self.cs)

    def _ops(self, p: int, sync_each: bool = False) -> None:
        s, d = self.s, self.dev

        def launch(kern, ins, outs, bd=0):
            s.launch(kern, ins, outs, block_dim=bd)
            if sync_each:
                d.synchronize()                           # naive: wait after every op
        for layer in range(self.dec.spec.layers):
            acts = self.fixed if self.fixed is not None else self._alloc_acts()
            self.dec.layer_ops(launch, self.x[p], self.gates[p][layer], acts, layer)
            if self.fixed is None:
                self._free_acts(acts)   # naive: after the sync; async: the pool reuses it after the stream

    def step(self) -> None:
        d, v, s = self.dev, self.v, self.s
        k = self.k
        self.k += 1
        if not v.pinned_async:                            # naive / pool: pageable synchronous uploads
            d.memcpy_h2d(self.x[0].ptr, self.dec.x_host)
            for buf, g in zip(self.gates[0], self.dec.gate_host):
                d.memcpy_h2d(buf.ptr, g)
            self._ops(0, sync_each=True)
            self.last = d.memcpy_d2h(self.x[0].ptr, self.x[0].nbytes)
            return
        p = k % 2
        s.wait(self.ev[p])
        if self.graphs is not None:
            self.graphs[p].execute_async(s)
        else:
            self._ops(p)
        d.flush()                                         # hand the step to the device now
        self._upload_async(k + 1)                         # next step's inputs go up while this one runs
        s.synchronize()
        self.last = d.memcpy_d2h(self.x[p].ptr, self.x[p].nbytes, out=self.out_host)

    def close(self) -> None:
        self.s.synchronize()
        if self.v.pinned_async:
            self.cs.synchronize()
        if self.graphs:
            for g in self.graphs:
                g.destroy()
        if self.fixed is not None:
            self._free_acts(self.fixed)
        for buf in self.inputs:
            buf.free()


def _has_pool(dev) -> bool:
    """Whether the runtime gives tensors a caching pool (runtime.memory, issue 12)."""
    return hasattr(dev, "memory_stats")


# ---------------------------------------------------------------------------------------------- running
@dataclass
class Result:
    variant: str
    modeled: Breakdown
    wall: Breakdown
    modeled_step_s: float
    wall_step_s: float
    compute_wall_step_s: float
    ops_per_step: float
    submits_per_step: float
    allocator: str
    host_launch_step_s: float = 0.0     #: modeled host time in launches and submits, hidden or not
    max_error: float = float("nan")     #: of the last step's output against the float64 reference
    verified: bool = False              #: within :data:`TOLERANCE` of it


    def as_dict(self) -> dict:
        return {"variant": self.variant, "modeled": self.modeled.as_dict(), "wall": self.wall.as_dict(),
                "modeled_step_us": self.modeled_step_s * 1e6, "wall_step_ms": self.wall_step_s * 1e3,
                "compute_wall_step_ms": self.compute_wall_step_s * 1e3, "ops_per_step": self.ops_per_step,
                "submits_per_step": self.submits_per_step, "allocator": self.allocator,
                "host_launch_step_us": self.host_launch_step_s * 1e6, "max_error": self.max_error,
                "verified": self.verified}


#: float32 kernels against the float64 reference: sums of up to ``ffn`` products (blocked matmuls) round
#: at ~sqrt(K) * 6e-8 relative; 1e-4 of the output's scale leaves a wide margin and still catches a wrong op
TOLERANCE = 1e-4


def _runtime(v: Variant, spec: DecoderSpec) -> Runtime:
    weights = spec.layers * (2 * spec.hidden * spec.ffn + spec.tokens * spec.hidden + spec.hidden) * 4
    acts = (3 * spec.tokens * spec.ffn + 4 * spec.tokens * spec.hidden) * 4 * (2 + spec.layers)
    arena = int((weights + acts) * 1.3) + (64 << 20)
    return Runtime(LocalBackend(1, DeviceConfig(arena_bytes=arena)), batch_size=v.batch)


def measure(v: Variant, spec: DecoderSpec, steps: int) -> Result:
    rt = _runtime(v, spec)
    try:
        dev = rt.device(0)
        dec = Decoder(dev, spec)
        r = Run(dec, v)
        r.step()                                           # warm up (plans, pool segments, threads)
        with profiler.recording(runtime=rt) as p:
            for _ in range(steps):
                r.step()
        out = np.asarray(r.last).reshape(-1).view(np.float32).reshape(spec.tokens, spec.hidden)
        ref = dec.reference()
        err = float(np.max(np.abs(out - ref)))
        r.close()
        dec.free()
    finally:
        rt.close()
    raw = p.raw
    timeline = modeled_timeline(raw)
    model = timeline.breakdown
    host_launch = sum(e - s for _, cat, s, e in timeline.host if cat == "launch")
    wall = wall_breakdown([raw])
    tasks = [t for d in raw.devices for t in d["tasks"]]
    compute = sum(t["end"] - t["start"] for t in tasks if t["task_type"] != "MEMCPY")
    submits = sum(1 for a in raw.api if a[0] == "rtSubmit")
    alloc = "caching pool" if r.pool_used else ("buffers made once (no pool on this branch)" if v.pool
                                                 else "driver malloc/free")
    return Result(v.name, model, wall, model.total / steps, wall.total / steps, compute / steps,
                  len(tasks) / steps, submits / steps, alloc, host_launch / steps, err,
                  err <= TOLERANCE * max(1.0, float(np.max(np.abs(ref)))))


def profiler_cost(spec: DecoderSpec, rounds: int, steps: int) -> dict:
    """Decode throughput of variant 4 with and without the profiler, rounds alternated; medians."""
    v = VARIANTS[3]
    rt = _runtime(v, spec)
    on: list[float] = []
    off: list[float] = []
    cpu_on: list[float] = []
    cpu_off: list[float] = []
    try:
        dev = rt.device(0)
        dec = Decoder(dev, spec)
        r = Run(dec, v)
        r.step()
        for i in range(2 * rounds):
            profiled = i % 2 == 1
            if profiled:                          # steady state: starting and fetching are not decode time
                with profiler.recording(runtime=rt):
                    t0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(steps):
                        r.step()
                    dt, dc = time.perf_counter() - t0, time.process_time() - c0
            else:
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    r.step()
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
            (on if profiled else off).append(steps * spec.tokens / dt)
            (cpu_on if profiled else cpu_off).append(dc / steps)
        r.close()
        dec.free()
    finally:
        rt.close()
    m_on, m_off = statistics.median(on), statistics.median(off)
    c_on, c_off = statistics.median(cpu_on), statistics.median(cpu_off)
    return {"tokens_per_s_off": m_off, "tokens_per_s_on": m_on, "cost": 1.0 - m_on / m_off, "rounds": rounds,
            "steps_per_round": steps, "cpu_ms_per_step_off": c_off * 1e3, "cpu_ms_per_step_on": c_on * 1e3,
            "cpu_cost": c_on / c_off - 1.0, "load_average": os.getloadavg()[0]}


def _row(r: Result, b: Breakdown) -> str:
    return " ".join(f"{b.share(c):6.1%}" for c in CATEGORIES)


def run(a) -> int:
    spec = DecoderSpec(a.layers, a.tokens, a.hidden, a.ffn, a.block_dim)
    results = [measure(v, spec, a.steps) for v in VARIANTS]
    costs = []
    if a.rounds:
        costs.append(("this decoder", profiler_cost(spec, a.rounds, max(2, a.steps // 2))))
        tiny = replace(spec, tokens=1, hidden=64, ffn=128, block_dim=1)     # launch-bound: tiny ops
        costs.append(("a launch-bound tiny decoder (1 x 64, ffn 128)", profiler_cost(tiny, a.rounds, 4 * a.steps)))
    naive = results[0]
    verified = all(r.verified for r in results)
    if a.json:
        print(json.dumps({"spec": spec.__dict__, "results": [r.as_dict() for r in results], "published": PUBLISHED,
                          "profiler_cost": {name: c for name, c in costs}, "verified": verified}))
        return 0 if verified else 1
    print(f"vnpu bench overhead: {spec.layers} layers x 7 ops, {spec.tokens} tokens x hidden {spec.hidden}, "
          f"ffn {spec.ffn}; {a.steps} profiled steps per variant")
    head = " ".join(f"{c:>6s}" for c in CATEGORIES)
    print(f"\nmodeled clock (the reference chip; host side priced by runtime/profiler/hostcost.py)")
    print(f"{'variant':26s} {head} {'us/step':>9s} {'vs naive':>8s} {'host launch us':>14s}")
    for r in results:
        print(f"{r.variant:26s} {_row(r, r.modeled)} {r.modeled_step_s * 1e6:9.1f} "
              f"{naive.modeled_step_s / r.modeled_step_s:7.2f}x {r.host_launch_step_s * 1e6:14.1f}")
    print("  host launch = modeled host time spent packing launches and ringing doorbells per step, hidden behind "
          "device work or not (batching cuts it even where the share does not show it)")
    print(f"{'published naive loop':26s} " + " ".join(f"{PUBLISHED[c]:6.1%}" if c in PUBLISHED else f"{'':6s}"
                                                        for c in CATEGORIES))
    print(f"\nwall clock (this machine)")
    print(f"{'variant':26s} {head} {'ms/step':>9s} {'vs naive':>8s} {'bound':>7s}")
    for r in results:
        print(f"{r.variant:26s} {_row(r, r.wall)} {r.wall_step_s * 1e3:9.2f} "
              f"{naive.wall_step_s / r.wall_step_s:7.2f}x {r.compute_wall_step_s * 1e3:6.2f}")
    print("  bound = the kernels' own wall time per step (device compute alone): no variant can beat it here; a graph "
          "replay runs its ops one after another on one core thread here, so its bound is higher")
    print(f"\nper step: " + "; ".join(f"{r.variant.split()[0]}: {r.ops_per_step:.0f} tasks, {r.submits_per_step:.0f} "
                                     f"submits" for r in results))
    print(f"activations: " + "; ".join(f"{r.variant.split()[0]}: {r.allocator}" for r in results))
    dev = {c: (naive.modeled.share(c) - PUBLISHED[c]) * 100 for c in PUBLISHED}
    print(f"\nnaive vs published (modeled, percentage points): " + ", ".join(f"{c} {x:+.1f}" for c, x in dev.items()))
    g = results[4].modeled.compute_share
    print(f"graph replay: device compute {g:.1%} of the modeled time")
    print(f"verdicts (modeled): " + "; ".join(f"{r.variant.split()[0]}: {r.modeled.verdict().split(':')[0]}"
                                             for r in results))
    print("\nwhat the wall clock cannot show here: pinned vs pageable copies (host memory is ordinary memory on this "
          "machine, both are one memcpy; only the modeled clock prices PCIe pinned 50 GB/s vs pageable ~21 GB/s), "
          "and the driver's malloc/free and doorbell costs (an in-process device makes them Python calls).")
    for name, cost in costs:
        print(f"\nprofiler cost on a decode run of {name} (variant 4, {cost['rounds']} alternated rounds of "
              f"{cost['steps_per_round']} steps, medians): {cost['tokens_per_s_off']:.0f} tokens/s off, "
              f"{cost['tokens_per_s_on']:.0f} on -> {cost['cost']:+.1%} throughput cost (goal <= 5 %); process CPU "
              f"{cost['cpu_ms_per_step_off']:.2f} -> {cost['cpu_ms_per_step_on']:.2f} ms/step ({cost['cpu_cost']:+.1%}); "
              f"load average {cost['load_average']:.1f} on {os.cpu_count()} cores")
    print(f"\noutputs vs a float64 numpy reference: " + "; ".join(f"{r.variant.split()[0]}: {r.max_error:.1e}"
                                                                 for r in results)
          + f"  -> {'OK' if verified else 'WRONG'}")
    return 0 if verified else 1
