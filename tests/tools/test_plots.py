"""Pictures: ``vnpu bench ... --plot FILE`` and the plots of the diagnose / stress-test / postmortem reports.

- a benchmark's plot is drawn from its ``--json`` document: the numbers on each line are the document's
  (read back from the written PNG, whose metadata carries the plotted lines: :func:`runtime.plots.figure.save`),
  the bound's line included; ``vnpu bench hccl --plot`` runs for real on in-process devices, the other
  benchmarks' figures are drawn from documents recorded by real runs (``tests/samples/bench``; the smoke tier
  runs every ``--plot`` against a real cluster);
- PNG, SVG and PDF by the suffix (magic bytes, a non-trivial size), a bad ``--plot`` / ``--output`` path is
  exit 2 with one line before any work;
- the HTML reports embed an ``<svg>`` with axis labels and units and load nothing; a ``.pdf`` report is a
  page of text, then the plots two to a page (the page count follows the report's JSON).
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.cli import main
from runtime.observe.metrics_store import History, device_scope
from runtime.plots.figure import read_png_series, series_of

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "tests" / "samples" / "bench"
T0 = 1_800_000_000.0


def _doc(name: str) -> dict:
    return json.loads((SAMPLES / f"{name}.json").read_text())


def _cli(argv, capsys):
    rc = main([str(x) for x in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _pdf_pages(data: bytes) -> int:
    return len(re.findall(rb"/Type\s*/Page\b(?!s)", data))


# ---------------------------------------------------------------------------------------------- bench --plot
def test_bench_hccl_plot_holds_the_json_numbers(tmp_path):
    """A real run on in-process devices: the PNG's busbw line is the JSON's busbw per size, the bound's line
    is the busbw at the bound's time (same bytes: busbw x time / bound time)."""
    png = tmp_path / "hccl.png"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", VNPU_BACKEND="local")
    env.pop("VNPU_TOKEN", None)
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "bench", "hccl", "--devices", "2", "--min-bytes", "16K",
                        "--max-bytes", "64K", "--op", "allreduce", "--no-baselines", "--json", "--plot", str(png)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    lines = read_png_series(str(png))["bus bandwidth (GB/s)"]
    rows = doc["rows"]
    assert lines["allreduce busbw"]["x"] == [r["size"] for r in rows] == [16 << 10, 32 << 10, 64 << 10]
    assert lines["allreduce busbw"]["y"] == [r["busbw"] for r in rows]
    threads = rows[0]["bound"]["threads"]
    assert lines[f"allreduce bound, {threads} threads"]["y"] == pytest.approx(
        [r["busbw"] * r["time_us"] / r["bound"]["tn_us"] for r in rows], rel=1e-12)
    assert lines["allreduce bound, 1 thread"]["y"] == pytest.approx(
        [r["busbw"] * r["time_us"] / r["bound"]["t1_us"] for r in rows], rel=1e-12)


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml"), (".pdf", b"%PDF-")])
def test_plot_formats_follow_the_suffix(suffix, magic, tmp_path):
    from runtime.plots.bench import write
    out = tmp_path / f"memcpy{suffix.upper() if suffix == '.pdf' else suffix}"      # the suffix in any case
    write("memcpy", _doc("memcpy"), str(out))
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 5_000
    if suffix == ".pdf":
        assert _pdf_pages(data) == 1
    if suffix == ".svg":
        assert "copy size (bytes)" in data.decode() and "bandwidth (GB/s)" in data.decode()


def test_memcpy_figure_lines_are_the_documents():
    from runtime.plots.bench import figure
    doc = _doc("memcpy")
    rows = doc["rows"]
    lines = series_of(figure("memcpy", doc))["bandwidth (GB/s)"]
    x = [r["bytes"] for r in rows]
    for label, key in (("H2D (shared memory)", "h2d_gbs"), ("D2H (shared memory)", "d2h_gbs"),
                       ("bound: np.copyto, same run", "copyto_gbs")):
        assert lines[label] == {"x": x, "y": [r[key] for r in rows]}, label
    grpc = [r for r in rows if "grpc_h2d_gbs" in r]
    assert grpc and lines["H2D (gRPC)"]["y"] == [r["grpc_h2d_gbs"] for r in grpc]
    assert lines["D2H (gRPC)"]["x"] == [r["bytes"] for r in grpc]


def test_serve_figure_lines_are_the_documents():
    from runtime.plots.bench import figure
    doc = _doc("serve")
    rows = doc["levels"]
    s = series_of(figure("serve", doc))
    x = [r["concurrency"] for r in rows]
    assert s["output tokens/s"]["vnpu serve"] == {"x": x, "y": [r["output_tokens_per_s"] for r in rows]}
    assert s["output tokens/s"]["baseline: max_num_seqs=1"]["y"] == [r["baseline"]["output_tokens_per_s"] for r in rows]
    assert s["output tokens/s"]["bound: numpy decode, batch = clients"]["y"] == \
        [r["numpy_bound_tokens_per_s"] for r in rows]
    assert s["latency p99 (ms)"]["TTFT p99"]["y"] == [r["ttft_ms_p99"] for r in rows]
    assert s["latency p99 (ms)"]["inter-token p99"]["y"] == [r["itl_ms_p99"] for r in rows]


def test_scale_figure_lines_are_the_documents():
    from runtime.plots.bench import figure
    doc = _doc("scale")
    rows = doc["rows"]
    s = series_of(figure("scale", doc))
    x = [r["devices"] for r in rows]
    assert s["start time (s)"]["vnpu devices"] == {"x": x, "y": [r["start_s"] for r in rows]}
    assert s["start time (s)"]["baseline: empty Ray actors"]["y"] == [r["plain_actors"]["start_s"] for r in rows]
    assert s["memory per process (MiB)"]["PSS per device, median"]["y"] == \
        pytest.approx([r["memory"]["pss_median"] / 2 ** 20 for r in rows])
    assert s["AllReduce time (us)"]["bound: same work, all cores"]["y"] == [r["bound"]["tn_us"] for r in rows]


BAD_PLOT = [
    (["memcpy", "--plot", "{d}/missing/x.png"], "does not exist"),
    (["memcpy", "--plot", "{d}/x.txt"], "a plot is written as .png, .svg, .pdf"),
    (["hccl", "--plot", "{d}/noext"], "without a suffix"),
    (["scale", "--plot", "{d}"], "--plot"),                                     # a directory
    (["serve", "--plot", "/proc/vnpu-plot.png"], "cannot write"),              # a file system that refuses
    (["serve", "--load-step", "--plot", "{d}/x.png"], "not with --load-step"),
]


@pytest.mark.parametrize("argv,word", BAD_PLOT, ids=[" ".join(b[0][:2]) for b in BAD_PLOT])
def test_bad_plot_paths_exit_2_with_one_line_before_any_work(argv, word, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VNPU_BACKEND", "local")
    rc, out, err = _cli(["bench", *[a.format(d=tmp_path) for a in argv]], capsys)
    assert rc == 2 and err.count("\n") == 1 and word in err and "Traceback" not in err, err
    assert "argument --plot" in err and not out
    assert not (tmp_path / "home").exists()                   # nothing started: no state written


# ---------------------------------------------------------------------------------------------- reports
def _history(path: Path) -> History:
    """Three minutes of one server: 10 req/s at 80 ms p99, then 30 s at 2000 ms with 20 % errors after a
    device fault at +90 s, a restart at +92 s that recovers it in 25 s."""
    h = History(path)
    for i in range(180):
        bad = 90 <= i < 120
        h.record_samples(T0 + i, {"qps": 10.0, "p99_latency_ms": 2000.0 if bad else 80.0,
                                  "error_rate": 0.2 if bad else 0.0, "shed_rate": 0.0, "kv_cache_usage": 0.3,
                                  "replicas": 1})
        for d in range(2):
            h.record_samples(T0 + i, {"aicore_util": 40.0, "device_health": 4 if (d == 1 and bad) else 0},
                             scope=device_scope(d))
    h.record_event("config", ts=T0 - 60, source="serve", detail={"slo": {"target_p99_ms": 500, "availability": 0.99}})
    h.record_event("fault", ts=T0 + 90, source="npu:1", diagnosis="device 1 lost", detail={"device": 1})
    h.record_event("action", ts=T0 + 92, source="heal", trigger="dead", diagnosis="restart_device npu:1",
                   result="ok", duration_s=25.0)
    return h


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("plots") / "h.sqlite"
    _history(path).close()
    return path


def _svgs(page: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", page, flags=re.S)


def test_diagnose_html_embeds_plots_with_axes_and_units(history, tmp_path, capsys):
    out = tmp_path / "d.html"
    rc, stdout, err = _cli(["diagnose", "--history", history, "--since", "2026-12-01T00:00:00", "--output", out,
                            "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(stdout)
    page = out.read_text()
    svgs = _svgs(page)
    shown = len(doc["symptoms"][:5]) + sum(1 for c in doc["candidates"][:8] if c.get("anomaly"))
    assert shown >= 2 and len(svgs) == shown
    p99 = next(s for s in svgs if "p99_latency_ms (ms)" in s)       # the value axis: metric and unit
    assert "time (UTC)" in p99 and "00:00" in p99                      # the time axis: clock times
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def test_diagnose_pdf_is_a_page_of_text_then_the_plots(history, tmp_path, capsys):
    out = tmp_path / "d.pdf"
    rc, stdout, err = _cli(["diagnose", "--history", history, "--since", "2026-12-01T00:00:00", "--output", out,
                            "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(stdout)
    shown = len(doc["symptoms"][:5]) + sum(1 for c in doc["candidates"][:8] if c.get("anomaly"))
    data = out.read_bytes()
    assert data.startswith(b"%PDF-") and len(data) > 10_000
    assert _pdf_pages(data) == 1 + math.ceil(shown / 2)


def test_postmortem_html_and_pdf_plot_the_window_against_the_targets(history, tmp_path, capsys):
    html_out, pdf_out = tmp_path / "pm.html", tmp_path / "pm.pdf"
    for out in (html_out, pdf_out):
        rc, stdout, err = _cli(["postmortem", "--history", history, "--event", "2", "--output", out], capsys)
        assert rc == 0, err
    svgs = _svgs(html_out.read_text())
    assert len(svgs) == 3                                          # p99, qps, error rate
    assert "p99_latency_ms (ms)" in svgs[0] and "p99 target 500 ms" in svgs[0]
    assert "qps (1/s)" in svgs[1] and "error_rate (ratio)" in svgs[2] and "error budget" in svgs[2]
    assert all("time (UTC)" in s for s in svgs)
    data = pdf_out.read_bytes()
    assert data.startswith(b"%PDF-") and _pdf_pages(data) == 3      # the text, then 2 + 1 plots


def test_postmortem_plot_holds_the_history_samples(history):
    from runtime.observe.postmortem import analyse, targets_of
    from runtime.observe.report import postmortem_plots
    from runtime.observe.source import FileSource
    from runtime.plots.timeline import figure
    src = FileSource(history)
    try:
        pm = analyse(src, T0, T0 + 179, targets_of(src.events(until=T0 + 200)))
        plots = postmortem_plots(src, pm)
        want = src.samples("p99_latency_ms", T0, T0 + 179)
    finally:
        src.close()
    line = series_of(figure(plots[0]))["p99_latency_ms (ms)"]["p99_latency_ms"]
    assert line["x"] == pytest.approx([t for t, _ in want], abs=1e-6)     # times: microseconds (datetime)
    assert line["y"] == [v for _, v in want]
    assert sorted(set(line["y"])) == [80.0, 2000.0]


def _stress_rep() -> dict:
    """The parts of a stress test's report that its plots read (runtime.stress.run: windows, faults, the
    p99 target): 6 windows of 10 s, a fault at +25 s."""
    w = [{"start_s": 10.0 * k, "intended_rate": 2.0 + k, "achieved_rate": 2.0 + k - (k == 3),
          "p99_ms": None if k == 0 else 100.0 * k, "shed": 0.1 * (k == 3)} for k in range(6)]
    return {"windows": w, "faults": [{"at_s": 25.0, "kind": "slow", "device": 1}], "target_p99_ms": 300.0}


def test_stress_report_html_and_pdf(tmp_path):
    from runtime.observe.report import plot_html
    from runtime.plots.timeline import figure
    from runtime.stress.report import stress_html, stress_plots, write_stress
    rep = _stress_rep()
    plots = stress_plots(rep)
    page = stress_html(rep, ["a summary line"])
    svgs = _svgs(page)
    assert len(svgs) == len(plots) == 3 and "a summary line" in page
    assert all("time since start (s)" in s for s in svgs)
    assert "achieved rate (req/s)" in svgs[0] and "intended rate" in svgs[0]
    assert "p99 latency (ms)" in svgs[1] and "p99 target 300 ms" in svgs[1] and "slow on npu:1" in svgs[1]
    assert plot_html(plots[1]).count("<svg") == 1
    s = series_of(figure(plots[0]))["achieved rate (req/s)"]
    assert s["achieved rate"]["y"] == [x["achieved_rate"] for x in rep["windows"]]
    assert s["intended rate"]["y"] == [x["intended_rate"] for x in rep["windows"]]
    p99 = series_of(figure(plots[1]))["p99 latency (ms)"]["p99 latency"]
    assert p99["x"] == [10.0, 20.0, 30.0, 40.0, 50.0]           # windows without a success are not drawn
    write_stress(str(tmp_path / "s.pdf"), rep, ["line"] * 70)      # two pages of text, two of plots
    data = (tmp_path / "s.pdf").read_bytes()
    assert data.startswith(b"%PDF-") and _pdf_pages(data) == 4


BAD_REPORT = [
    (["diagnose", "--history", "{h}", "--output", "{d}/r.txt"], "not a report file"),
    (["postmortem", "--history", "{h}", "--output", "{d}/r.png"], "not a report file"),
    (["postmortem", "--history", "{h}", "--output", "{d}/missing/r.pdf"], "does not exist"),
    (["diagnose", "--history", "{h}", "--output", "/proc/vnpu-report.pdf"], "cannot write"),
    (["stress-test", "--url", "http://127.0.0.1:9", "--output", "{d}/r.svg"], "not a report file"),
]


@pytest.mark.parametrize("argv,word", BAD_REPORT, ids=[" ".join(b[0][:1] + b[0][-1:]) for b in BAD_REPORT])
def test_bad_report_paths_exit_2_with_one_line(argv, word, history, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path / "home"))
    rc, out, err = _cli([a.format(d=tmp_path, h=history) for a in argv], capsys)
    assert rc == 2 and err.count("\n") == 1 and word in err and "Traceback" not in err, err
    assert "--output" in err
