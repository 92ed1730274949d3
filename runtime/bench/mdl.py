"""``vnpu bench mdl``: a model compiled by ``vnpu atc`` and executed through ``acl.mdl.execute`` (a pyACL
program's path: datasets of device buffers, copies in, ONE graph replay, copies out, synchronize) and
through the offline-model layer it wraps, against
onnxruntime with one intra-op thread on the same ONNX file and the same inputs, and against the numpy
bound of the same kernel graph (every step's kernel called directly on host memory: no runtime, no
replay, no copies), all in the same run with rounds interleaved so the three see the same machine load.

Also printed: launches before and after fusion, the static memory plan's peak against the sum of all
intermediate tensors, the modeled device time on the target SoC, and the largest difference from
onnxruntime's outputs.  Ratios are printed as measured (no pass/fail against a target).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time

import numpy as np

MODELS = {"minilm-l3": "runtime.models.weights:minilm_l3_onnx"}


#: largest |vnpu - reference| of an output element that passes (outputs are O(1) embeddings)
VERIFY_NUMPY_ATOL, VERIFY_ORT_ATOL = 1e-4, 1e-3

def register(bench_sub) -> None:
    p = bench_sub.add_parser("mdl", help="an atc-compiled model as one graph replay vs onnxruntime (1 thread) "
                                         "and the numpy bound of the same kernel graph",
                             example="vnpu bench mdl --model minilm-l3 --batch 8 --seq 128 --rounds 10")
    p.add_argument("--model", choices=sorted(MODELS), default="minilm-l3",
                   help="the ONNX model to compile (default minilm-l3)")
    p.add_argument("--batch", type=int, default=8, help="sentences per execution (default 8)")
    p.add_argument("--seq", type=int, default=128, help="tokens per sentence (default 128)")
    p.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (medians; default 10)")
    p.add_argument("--soc_version", default="Ascend910B3", help="chip to compile for, as atc --soc_version")
    p.add_argument("--backend", choices=["local", "cluster"], default="local",
                   help="in-process device (default) or a device actor of a local Ray cluster over gRPC")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=_run)


def _onnx_path(model: str) -> str:
    import importlib
    mod, _, attr = MODELS[model].partition(":")
    return str(getattr(importlib.import_module(mod), attr)())


def _inputs(batch: int, seq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids with right padding: row lengths spread over [seq/2, seq] (row 0 full length)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (batch, seq)).astype(np.int64)
    lens = rng.integers(max(1, seq // 2), seq + 1, batch)
    lens[0] = seq
    mask = (np.arange(seq)[None, :] < lens[:, None]).astype(np.int64)
    ids[mask == 0] = 0
    ids[:, 0] = 101
    return ids, mask


def _runtime(backend: str):
    from devices.device import DeviceConfig
    from runtime.api import Runtime, runtime_scope
    from runtime.backend import LocalBackend
    if backend == "local":
        return runtime_scope(Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30))))
    from runtime.cluster import ClusterSpec, cluster_runtime
    return cluster_runtime(spec=ClusterSpec(devices=1, arena_bytes=1 << 30))


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench(model: str, batch: int, seq: int, rounds: int, soc: str, backend: str) -> dict:
    """Compile ``model`` for (batch, seq), load it on device 0 of ``backend`` and time every path over
    ``rounds`` rounds (pyACL, offline API, end to end, numpy, onnxruntime when installed), checking their
    outputs; blocks the host for the whole run."""
    from runtime import offline
    from runtime.atc import compile_model, make_options
    from runtime.atc.hostrun import HostRun
    path = _onnx_path(model)
    t0 = time.perf_counter()
    cm = compile_model(path, make_options(f"input_ids:{batch},{seq};attention_mask:{batch},{seq}", None, soc))
    compile_s = time.perf_counter() - t0
    om_bytes = cm.to_bytes()
    ids, mask = _inputs(batch, seq)
    sess = _ort_session(path)
    host = HostRun(cm.manifest, cm.weights)
    res = {"model": model, "batch": batch, "seq": seq, "rounds": rounds, "soc_version": soc, "backend": backend,
           "machine": {"cpu": _cpu(), "cpus": os.cpu_count(), "python": platform.python_version()},
           "compile_s": round(compile_s, 3), "report": cm.report}
    with _runtime(backend) as rt:
        dev = rt.device(0)
        free0 = dev.mem_info()[0]
        t0 = time.perf_counter()
        m = offline.load_from_bytes(om_bytes, dev)
        res["load_s"] = round(time.perf_counter() - t0, 3)
        stream = dev.stream()
        try:
            d_ids, d_mask = dev.from_numpy(ids), dev.from_numpy(mask)
            outs = [dev.empty(s.dims_at(None), s.dtype) for s in m.desc.outputs]
            feeds = {"input_ids": ids, "attention_mask": mask}

            def run_vnpu():
                m.execute([d_ids, d_mask], outs, stream)

            def run_e2e():
                d_ids.copy_from(ids)
                d_mask.copy_from(mask)
                m.execute([d_ids, d_mask], outs, stream)
                return [o.numpy(stream) for o in outs]

            got = run_e2e()
            acl_model = _AclModel(om_bytes, [d_ids, d_mask], outs)
            ref = sess.run(None, feeds) if sess is not None else None
            bound = host.run([ids, mask])
            t, cpu = _time_rounds(rounds, (("acl", acl_model.execute), ("vnpu", run_vnpu), ("vnpu_e2e", run_e2e),
                                           ("numpy", lambda: host.run([ids, mask])),
                                           ("ort", (lambda: sess.run(None, feeds)) if sess is not None else None)))
            res["acl_equals_offline"] = _acl_equals(acl_model, outs, stream, got)
            _add_diffs(res, [s.name for s in m.desc.outputs], got, bound, ref)
            busy = dev.telemetry().get("busy_s")
        finally:
            if locals().get("acl_model") is not None:
                acl_model.close()
            for x in [locals().get("d_ids"), locals().get("d_mask")] + list(locals().get("outs", [])):
                if x is not None:
                    x.free()
            stream.destroy()
            m.unload()
            dev.empty_cache()                   # the inputs and outputs went back to the caching pool
        # at least as much free as before: what this run allocated is back (on a shared device another
        # client's memory may come back meanwhile -- a process that just exited, released by its lease)
        res["hbm_back_to_baseline"] = dev.mem_info()[0] >= free0
    _add_verdicts(res, t, cpu, batch, backend, busy)
    return res


def _ort_session(path: str):
    """A single-threaded, sequential onnxruntime CPU session of the model, or None without onnxruntime."""
    try:
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    except ImportError:
        return None


def _time_rounds(rounds: int, paths) -> tuple[dict, dict]:
    """Run each ``(key, fn)`` path (None: skipped) once per round, in turn: each one's wall and CPU times."""
    t: dict = {"acl": [], "vnpu": [], "vnpu_e2e": [], "ort": [], "numpy": []}
    cpu: dict = {k: [] for k in t}
    for _ in range(rounds):
        for key, fn in paths:
            if fn is None:
                continue
            c, s = time.process_time(), time.perf_counter()
            fn()
            t[key].append(time.perf_counter() - s)
            cpu[key].append(time.process_time() - c)
    return t, cpu


def _acl_equals(acl_model, outs: list, stream, got: list) -> bool:
    """Whether pyACL's own run, into zeroed output buffers, gives the offline API's outputs ``got``."""
    for o in outs:                                # acl's own outputs, from zeroed buffers
        o.copy_from(np.zeros(o.shape, o.dtype))
    acl_model.execute()
    acl_got = [o.numpy(stream) for o in outs]
    return all(np.array_equal(a, g) for a, g in zip(acl_got, got))


def _add_diffs(res: dict, names: list[str], got: list, bound: list, ref) -> None:
    """Each output's largest difference from the numpy run, and from onnxruntime's when it ran."""
    res["max_abs_diff_vs_numpy_bound"] = {n: float(np.abs(g.astype(np.float64) - b).max())
                                          for n, g, b in zip(names, got, bound)}
    if ref is not None:
        res["max_abs_diff_vs_onnxruntime"] = {n: float(np.abs(g.astype(np.float64) - r).max())
                                              for n, g, r in zip(names, got, ref)}


def _add_verdicts(res: dict, t: dict, cpu: dict, batch: int, backend: str, busy) -> None:
    """The verdict (outputs within tolerance, HBM back) and the median latencies, throughputs and ratios."""
    # the same kernel graph in numpy computes the same numbers up to float32 rounding; onnxruntime's graph
    # differs more (fused kernels, other summation orders)
    res["verified"] = (max(res["max_abs_diff_vs_numpy_bound"].values()) <= VERIFY_NUMPY_ATOL
                       and max(res.get("max_abs_diff_vs_onnxruntime", {"-": 0.0}).values()) <= VERIFY_ORT_ATOL
                       and res["hbm_back_to_baseline"])
    med = {k: statistics.median(v) for k, v in t.items() if v}
    cmed = {k: statistics.median(v) for k, v in cpu.items() if v}
    res["latency_ms"] = {k: round(v * 1e3, 2) for k, v in med.items()}
    res["cpu_ms"] = {k: round(v * 1e3, 2) for k, v in cmed.items()}
    res["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE")
    res["throughput_sentences_per_s"] = {k: round(batch / v, 1) for k, v in med.items()}
    if "ort" in med:
        res["acl_vs_onnxruntime"] = round(med["ort"] / med["acl"], 3)
        res["vs_onnxruntime"] = round(med["ort"] / med["vnpu"], 3)
        res["e2e_vs_onnxruntime"] = round(med["ort"] / med["vnpu_e2e"], 3)
        if backend == "local":                    # a device actor's CPU time is not this process's
            res["cpu_vs_onnxruntime"] = round(cmed["ort"] / cmed["vnpu"], 3)
    res["vs_numpy_bound"] = round(med["numpy"] / med["vnpu"], 3)
    if busy is not None:
        res["device_busy_s"] = round(busy, 3)


class _AclModel:
    """The same model through pyACL calls: loaded from host memory, one dataset per side over the bench's
    device buffers, executed on the current context's default stream (``acl.mdl.execute`` blocks)."""

    def __init__(self, om_bytes: bytes, inputs, outputs):
        from runtime import acl
        self.acl = acl
        _check(acl.init(), "acl.init")
        _check(acl.rt.set_device(inputs[0].device.index), "acl.rt.set_device")
        self._om = om_bytes
        ptr = acl.util.bytes_to_ptr(self._om)
        self.model_id = _check(acl.mdl.load_from_mem(ptr, len(self._om)), "acl.mdl.load_from_mem")
        self.datasets = []
        for bufs in (inputs, outputs):
            ds = acl.mdl.create_dataset()
            for t in bufs:
                _check(acl.mdl.add_dataset_buffer(ds, acl.create_data_buffer(t.ptr, t.nbytes)),
                       "acl.mdl.add_dataset_buffer")
            self.datasets.append(ds)

    def execute(self) -> None:
        _check(self.acl.mdl.execute(self.model_id, *self.datasets), "acl.mdl.execute")

    def close(self) -> None:
        acl = self.acl
        for ds in self.datasets:
            for i in range(acl.mdl.get_dataset_num_buffers(ds)):
                acl.destroy_data_buffer(acl.mdl.get_dataset_buffer(ds, i))
            acl.mdl.destroy_dataset(ds)
        acl.mdl.unload(self.model_id)
        acl.rt.reset_device(0)
        acl.finalize()


def _check(ret, what: str):
    """pyACL returns ``ret`` or ``(value, ret)``: the value, or an error naming the call."""
    value, code = ret if isinstance(ret, tuple) else (None, ret)
    if code != 0:
        from devices.errors import error_for_code
        raise error_for_code(code, f"{what} failed")
    return value


def _run(a) -> int:
    res = bench(a.model, a.batch, a.seq, a.rounds, a.soc_version, a.backend)
    if a.json:
        print(json.dumps(res))
        return 0 if res["verified"] else 1
    r, lat, thr = res["report"], res["latency_ms"], res["throughput_sentences_per_s"]
    mb = lambda n: f"{n / 1e6:.2f} MB"  # noqa: E731
    m = res["machine"]
    print(f"{res['model']} batch {res['batch']} x seq {res['seq']}, {res['backend']} device, {res['rounds']} rounds "
          f"(machine: {m['cpu']}, {m['cpus']} CPUs)")
    print(f"  compile {res['compile_s']} s, load {res['load_s']} s (weights uploaded once, "
          f"{len(r['gears'])} graph(s) captured)")
    print(f"  launches {r['launches_before_fusion']} -> {r['launches_after_fusion']} after fusion; "
          f"intermediates {mb(r['intermediate_bytes_before_fusion'])} -> {mb(r['intermediate_bytes_after_fusion'])}")
    print(f"  static memory plan: peak {mb(r['plan_peak_bytes'])} vs {mb(r['intermediate_bytes_after_fusion'])} of "
          f"intermediates ({mb(r['plan_no_reuse_bytes'])} without reuse, inputs included)")
    print(f"  modeled device time on {res['soc_version']}: {r['modeled_us'] / 1e3:.3f} ms")
    cpu = res["cpu_ms"]
    local = res["backend"] == "local"
    print("  medians                          wall ms   sentences/s   CPU ms (this process" +
          (")" if local else "; the device's kernels run in its actor)"))
    rows = (("acl", "acl.mdl.execute (one replay)"), ("vnpu", "offline layer execute"), ("vnpu_e2e", "vnpu incl. H2D inputs + D2H"),
            ("ort", "onnxruntime, 1 intra-op thread"), ("numpy", "numpy bound, same kernel graph"))
    for key, label in rows:
        if key in lat:
            print(f"  {label:31s} {lat[key]:8.2f}   {thr[key]:11.1f}   {cpu[key]:8.2f}")
    if "vs_onnxruntime" in res:
        cpu_note = f"CPU time {res['cpu_vs_onnxruntime']:.2f}x, " if "cpu_vs_onnxruntime" in res else ""
        print(f"  acl.mdl.execute / onnxruntime: {res['acl_vs_onnxruntime']:.2f}x wall")
        print(f"  offline layer / onnxruntime: {res['vs_onnxruntime']:.2f}x wall ({cpu_note}e2e "
              f"{res['e2e_vs_onnxruntime']:.2f}x); vnpu / numpy bound: {res['vs_numpy_bound']:.2f}x")
        if res["openblas_coretype"]:
            print(f"  (OPENBLAS_CORETYPE={res['openblas_coretype']} is set: numpy's GEMMs use that core's kernels; "
                  "onnxruntime picks its own)")
        d = res["max_abs_diff_vs_onnxruntime"]
        print("  max |vnpu - onnxruntime|: " + ", ".join(f"{k} {v:.2e}" for k, v in d.items()))
    else:
        print("  (onnxruntime not installed: pip install onnxruntime)")
    print(f"  verified: {'yes' if res['verified'] else 'NO: outputs differ from the references'}")
    return 0 if res["verified"] else 1
