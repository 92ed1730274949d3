"""Make the documentation's figures (docs/img/) from real runs at small sizes.

    .venv/bin/python scripts/docs_figures.py                  # everything (~5 min on 2 cores)
    .venv/bin/python scripts/docs_figures.py --only reports   # some: bench-memcpy, bench-hccl, bench-serve,
                                                              #       bench-scale, reports (monitor included)

- ``bench-*``: ``vnpu bench <name> --json --plot docs/img/bench_<name>.png`` as a user runs it (a subprocess
  each; an embedded cluster where the benchmark starts one);
- ``reports``: a real server (MiniLM-L3 on two in-process devices behind the real HTTP server, its sampler
  recording the history) under a real 40 s stress test with an overheat and a slow device injected; then
  ``vnpu stress-test``'s report plots (``stress_rate.png``, ``stress_p99.png``), ``vnpu diagnose``'s first
  symptom and ``vnpu postmortem``'s p99 on that history (``diagnose_symptom.png``, ``postmortem_p99.png``)
  and ``vnpu monitor``'s frame rendered by rich to SVG (``monitor.svg``: Console(record=True).save_svg).

The figures carry the machine's numbers of the run that drew them (load, cores): regenerate, don't edit.
Every figure is a PNG of ~30-90 KB (the monitor an SVG of ~35 KB).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_ARGS = {
    "memcpy": ["--min-bytes", "64K", "--max-bytes", "16M", "--grpc-max-bytes", "4M"],
    "hccl": ["--devices", "4", "--op", "allreduce,allgather", "--min-bytes", "64K", "--max-bytes", "4M",
             "--no-baselines"],
    "serve": ["--concurrency", "1,2,4", "--requests", "4", "--max-tokens", "8", "--backend", "local"],
    "scale": ["--devices", "2,4,8", "--hbm-mb", "16", "--allreduce-bytes", "64K", "--iters", "3"],
}
ADMIN = "sk-ops-docs-figures-0123456789"
#: resolution of the report figures in the docs (small files; the benchmarks' --plot keeps its default)
DOCS_DPI = 90


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def bench(name: str, out: Path) -> None:
    png = out / f"bench_{name}.png"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "bench", name, *BENCH_ARGS[name], "--json",
                        "--plot", str(png)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"bench {name}: exit {p.returncode}\n{p.stderr[-2000:]}")
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    print(f"{_shown(png)}: verified {doc['verified']} (load average {os.getloadavg()[0]:.1f})")


def _stress(url: str, rt) -> dict:
    from runtime.observe.source import HttpSource
    from runtime.stress.faults import DeviceInjector
    from runtime.stress.profiles import builtin
    from runtime.stress.run import StressConfig, run_stress
    cfg = StressConfig(url=url, api_key=ADMIN, profile=builtin("burst", 8.0, 40.0), faults=("overheat", "slow"),
                       every_s=12.0, fault_devices=(0,), distinct_inputs=8, workers=16, target_p99_ms=250.0,
                       drain_s=30.0, window_s=4.0)
    try:
        return run_stress(cfg, DeviceInjector(rt, seed=1), HttpSource(url, ADMIN))
    finally:
        rt.devices()[0].handle.inject_fault("clear")


def _png(plot, name: str, out: Path) -> None:
    from runtime.plots.figure import save
    from runtime.plots.timeline import figure
    path = out / f"{name}.png"
    save(figure(plot), str(path), dpi=DOCS_DPI)
    print(f"{_shown(path)}: {plot.title}")


def reports(out: Path) -> None:
    """A real server under a real stress test, then every report drawn from it."""
    from devices.device import DeviceConfig
    from rich.console import Console

    from runtime.api import Runtime
    from runtime.backend import LocalBackend
    from runtime.cli.monitor import render
    from runtime.observe import report
    from runtime.observe.dashboard import DEFAULT_METRICS, build, metric_name
    from runtime.observe.diagnose import Options, diagnose
    from runtime.observe.metrics_store import History
    from runtime.observe.postmortem import analyse, targets_of
    from runtime.observe.source import FileSource
    from runtime.serve.config import model_spec
    from runtime.serve.metrics_sampler import Sampler
    from runtime.serve.server import Server, Service
    from runtime.serve.tenants import Tenant, key_digest
    from runtime.stress.report import stress_plots
    from runtime.stress.run import summary_lines
    tmp = Path(tempfile.mkdtemp(prefix="vnpu-docs-"))
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=256 << 20)))
    svc = Service(rt, (model_spec("minilm-l3", (0,), None),), (Tenant("ops", (key_digest(ADMIN),), admin=True),))
    hist = History(tmp / "history.sqlite")
    sampler = Sampler(svc, hist, rt, interval_s=0.5)
    srv = Server(svc).start()
    try:
        svc.load()
        sampler.start()
        t0 = time.time()
        rep = _stress(srv.url, rt)
        t1 = time.time()
    finally:
        sampler.stop()
        srv.stop()
        rt.close()
    print("\n".join(summary_lines(rep)))
    rates, p99 = stress_plots(rep)[:2]
    _png(rates, "stress_rate", out)
    _png(p99, "stress_p99", out)
    src = FileSource(hist)
    try:
        d = diagnose(src, Options(since=t0, until=t1))
        plots = report.diagnosis_plots(d)
        if plots:
            _png(plots[0], "diagnose_symptom", out)
        pm = analyse(src, t0, t1, targets_of(src.events(until=t1)))
        _png(report.postmortem_plots(src, pm)[0], "postmortem_p99", out)
        con = Console(record=True, width=110, force_terminal=True, color_system="truecolor", file=io.StringIO())
        con.print(render(build(src, [metric_name(m) for m in DEFAULT_METRICS], window_s=t1 - t0)))
        con.save_svg(str(out / "monitor.svg"), title="vnpu monitor")
        print(f"{_shown(out / 'monitor.svg')} (load average {os.getloadavg()[0]:.1f})")
    finally:
        src.close()
        hist.close()


def main(argv: list[str] | None = None) -> int:
    jobs = [f"bench-{n}" for n in BENCH_ARGS] + ["reports"]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(jobs), help=f"comma-separated: {', '.join(jobs)}")
    p.add_argument("--out", default=str(ROOT / "docs" / "img"), help="where the figures go (default docs/img)")
    a = p.parse_args(argv)
    chosen = [j.strip() for j in a.only.split(",") if j.strip()]
    bad = [j for j in chosen if j not in jobs]
    if bad:
        p.error(f"unknown figure set(s) {', '.join(bad)} (known: {', '.join(jobs)})")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for job in chosen:
        if job == "reports":
            reports(out)
        else:
            bench(job.removeprefix("bench-"), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
