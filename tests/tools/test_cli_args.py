"""Every vnpu command checks its arguments before doing any work: a bad one exits 2 with ONE line on
stderr, never a traceback, and nothing has started (no cluster, no device, no campaign).

The commands run in-process through :func:`runtime.cli.main`; whatever would start work -- a cluster, an
in-process device, a chaos campaign -- is replaced by a tripwire that fails the test, so "before doing work"
is checked, not assumed.  One test runs a real embedding job to check that inputs longer than the model's
context are reported on stderr (and still embedded).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from cli_checks import cli as _cli
from cli_checks import tripwires  # noqa: F401 - a fixture


@pytest.fixture
def files(tmp_path):
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"hello\x00world\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    good = tmp_path / "good.txt"
    good.write_text("a sentence\n")
    return {"binary": binary, "latin1": latin, "nul": nul, "empty": empty, "good": good,
            "dir": tmp_path, "missing": tmp_path / "missing.txt",
            "no_dir_out": tmp_path / "no-such-dir" / "report.json"}


#: (name, argv with {file} placeholders, a word the one line must contain)
BAD = [
    # chaos
    ("chaos unwritable --report", ["chaos", "--duration", "2s", "--report", "{no_dir_out}"], "--report"),
    ("chaos --report is a directory", ["chaos", "--duration", "2s", "--report", "{dir}"], "--report"),
    ("chaos --duration 0s", ["chaos", "--duration", "0s"], "--duration"),
    ("chaos --duration -1s", ["chaos", "--duration=-1s"], "--duration"),
    ("chaos --duration abc", ["chaos", "--duration", "abc"], "--duration"),
    ("chaos --every 0s", ["chaos", "--every", "0s"], "--every"),
    ("chaos --every 0ms", ["chaos", "--every", "0ms"], "--every"),
    ("chaos --baseline 0s", ["chaos", "--baseline", "0s"], "--baseline"),
    ("chaos --hang-deadline 0ms", ["chaos", "--hang-deadline", "0ms"], "--hang-deadline"),
    ("chaos --hang-deadline below 3 beats", ["chaos", "--hang-deadline", "200ms"], "--hang-deadline"),
    ("chaos check missing report", ["chaos", "check", "{missing}"], "missing.txt"),
    ("chaos check binary report", ["chaos", "check", "{binary}"], "not text"),
    ("chaos check not a report", ["chaos", "check", "{good}"], "report"),
    ("chaos --devices 0", ["chaos", "--devices", "0"], "--devices"),
    ("chaos --spares -1", ["chaos", "--spares=-1"], "--spares"),
    ("chaos --faults bogus", ["chaos", "--faults", "kill,bogus"], "bogus"),
    ("chaos --faults empty", ["chaos", "--faults", ","], "--faults"),
    ("chaos --seed x", ["chaos", "--seed", "x"], "--seed"),
    # run
    ("run embed binary --input", ["run", "embed", "--input", "{binary}"], "not text"),
    ("run embed latin-1 --input", ["run", "embed", "--input", "{latin1}"], "UTF-8"),
    ("run embed NUL in --input", ["run", "embed", "--input", "{nul}"], "binary"),
    ("run embed empty --input", ["run", "embed", "--input", "{empty}"], "no"),
    ("run embed missing --input", ["run", "embed", "--input", "{missing}"], "missing.txt"),
    ("run embed --input is a directory", ["run", "embed", "--input", "{dir}"], "--input"),
    ("run embed unwritable --output", ["run", "embed", "x", "--output", "{no_dir_out}"], "--output"),
    ("run embed --devices 0", ["run", "embed", "x", "--devices", "0"], "--devices"),
    ("run embed --batch-size 0", ["run", "embed", "x", "--batch-size", "0"], "--batch-size"),
    ("run generate binary --prompts", ["run", "generate", "--prompts", "{binary}"], "not text"),
    ("run generate --max-new-tokens 0", ["run", "generate", "--prompt", "hi", "--max-new-tokens", "0"],
     "--max-new-tokens"),
    ("run generate --temperature -1", ["run", "generate", "--prompt", "hi", "--temperature=-1"], "--temperature"),
    ("run generate --temperature nan", ["run", "generate", "--prompt", "hi", "--temperature", "nan"],
     "--temperature"),
    ("run generate --top-p 0", ["run", "generate", "--prompt", "hi", "--top-p", "0"], "--top-p"),
    ("run generate --top-p 1.5", ["run", "generate", "--prompt", "hi", "--top-p", "1.5"], "--top-p"),
    ("run generate --top-k -1", ["run", "generate", "--prompt", "hi", "--top-k=-1"], "--top-k"),
    ("run generate --max-len 1", ["run", "generate", "--prompt", "hi", "--max-len", "1"], "--max-len"),
    ("run generate --seed -1", ["run", "generate", "--prompt", "hi", "--seed=-1"], "--seed"),
    ("run generate no prompt", ["run", "generate"], "--prompt"),
    # bench
    ("bench hccl --min-bytes 0", ["bench", "hccl", "--min-bytes", "0"], "--min-bytes"),
    ("bench hccl --min-bytes x", ["bench", "hccl", "--min-bytes", "x"], "--min-bytes"),
    ("bench hccl min > max", ["bench", "hccl", "--min-bytes", "1M", "--max-bytes", "1K"], "--max-bytes"),
    ("bench hccl --iters 0", ["bench", "hccl", "--iters", "0"], "--iters"),
    ("bench hccl --warmup -1", ["bench", "hccl", "--warmup=-1"], "--warmup"),
    ("bench hccl --devices 0", ["bench", "hccl", "--devices", "0"], "--devices"),
    ("bench hccl --op bogus", ["bench", "hccl", "--op", "bogus"], "bogus"),
    ("bench memcpy --min-bytes 0", ["bench", "memcpy", "--min-bytes", "0"], "--min-bytes"),
    ("bench memcpy min > max", ["bench", "memcpy", "--min-bytes", "8M", "--max-bytes", "1M"], "--max-bytes"),
    ("bench memcpy --grpc-max-bytes -1", ["bench", "memcpy", "--grpc-max-bytes=-1"], "--grpc-max-bytes"),
    ("bench launch --launches 0", ["bench", "launch", "--launches", "0"], "--launches"),
    ("bench launch --repeat 0", ["bench", "launch", "--repeat", "0"], "--repeat"),
    ("bench infer --tokens 0", ["bench", "infer", "--tokens", "0"], "--tokens"),
    ("bench infer --rounds 0", ["bench", "infer", "--rounds", "0"], "--rounds"),
    ("bench memory --pairs 0", ["bench", "memory", "--pairs", "0"], "--pairs"),
    ("bench memory --raw-pairs x", ["bench", "memory", "--raw-pairs", "x"], "--raw-pairs"),
    ("bench memory --steps -1", ["bench", "memory", "--steps=-1"], "--steps"),
    ("bench memory --defrag-tensors 1", ["bench", "memory", "--defrag-tensors", "1"], "--defrag-tensors"),
    ("bench memory --defrag-tensors 500", ["bench", "memory", "--defrag-tensors", "500"], "--defrag-tensors"),
    ("bench memory --seed -1", ["bench", "memory", "--seed=-1"], "--seed"),
    ("bench memory --seeds 0", ["bench", "memory", "--seeds", "0"], "--seeds"),
    ("bench serve --concurrency 0", ["bench", "serve", "--concurrency", "1,0"], "--concurrency"),
    ("bench serve --concurrency x", ["bench", "serve", "--concurrency", "x"], "--concurrency"),
    ("bench serve --requests 0", ["bench", "serve", "--requests", "0"], "--requests"),
    ("bench serve --prompt-tokens 256-64", ["bench", "serve", "--prompt-tokens", "256-64"], "--prompt-tokens"),
    ("bench serve --prompt-tokens x", ["bench", "serve", "--prompt-tokens", "x"], "--prompt-tokens"),
    ("bench kernels --batch 0", ["bench", "kernels", "--batch", "0"], "--batch"),
    ("bench kernels --context 0", ["bench", "kernels", "--context", "0"], "--context"),
    ("bench kernels --clock gpu", ["bench", "kernels", "--clock", "gpu"], "--clock"),
    ("bench sanitize --tokens 2", ["bench", "sanitize", "--tokens", "2"], "--tokens"),
    ("bench sanitize --rounds 0", ["bench", "sanitize", "--rounds", "0"], "--rounds"),
    ("bench sanitize --sentences 0", ["bench", "sanitize", "--sentences", "0"], "--sentences"),
    ("bench sanitize --launches x", ["bench", "sanitize", "--launches", "x"], "--launches"),
    ("bench overhead --steps 0", ["bench", "overhead", "--steps", "0"], "--steps"),
    ("bench overhead --hidden 4", ["bench", "overhead", "--hidden", "4"], "--hidden"),
    ("bench overhead --rounds -1", ["bench", "overhead", "--rounds=-1"], "--rounds"),
    # prof
    ("prof without a command", ["prof"], "no command"),
    ("prof --output is a file", ["prof", "--output", "{binary}", "--", "true"], "--output"),
    # cluster, smi, demo, serve
    ("up --devices 0", ["up", "--devices", "0"], "--devices"),
    ("up --hbm-mb 0", ["up", "--hbm-mb", "0"], "--hbm-mb"),
    ("up --device-restarts -2", ["up", "--device-restarts=-2"], "--device-restarts"),
    ("up --device-restarts x", ["up", "--device-restarts", "x"], "--device-restarts"),
    ("up --config missing", ["up", "--config", "{missing}"], "missing.txt"),
    ("up --config binary", ["up", "--config", "{binary}"], "not text"),
    ("up --config latin-1", ["up", "--config", "{latin1}"], "UTF-8"),
    ("up --config not a cluster.yaml", ["up", "--config", "{good}"], "--config"),
    ("smi --devices 0", ["smi", "--devices", "0"], "--devices"),
    ("demo --devices 0", ["demo", "--devices", "0"], "--devices"),
    ("demo --max-new-tokens 0", ["demo", "--max-new-tokens", "0"], "--max-new-tokens"),
    ("serve --port 70000", ["serve", "--port", "70000"], "--port"),
    ("serve --tp 0", ["serve", "--tp", "0"], "--tp"),
    ("serve --quantization awq", ["serve", "--quantization", "awq"], "--quantization"),
    ("bench serve -q int4", ["bench", "serve", "-q", "int4"], "--quantization"),
    ("serve --device-restarts -5", ["serve", "--device-restarts=-5"], "--device-restarts"),
    ("serve --host not an address", ["serve", "--host", "256.1.2.3"], "--host"),
    ("serve --host of another machine", ["serve", "--host", "192.0.2.254"], "--host"),
    ("serve --devices 0", ["serve", "--devices", "0"], "--devices"),
    ("serve --config binary", ["serve", "--config", "{binary}"], "not text"),
]


@pytest.mark.parametrize("name,argv,word", BAD, ids=[b[0] for b in BAD])
def test_bad_argument_exits_2_with_one_line_before_any_work(name, argv, word, files, tripwires, capsys):
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]
    rc, out, err = _cli(argv, capsys)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert word in err, err
    assert err.startswith("vnpu"), err


def test_bad_alloc_conf_exits_2_with_one_line_before_any_work(tripwires, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_ALLOC_CONF", "expandable_segments:True")
    rc, out, err = _cli(["bench", "memory", "--pairs", "1"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, (rc, out, err)
    assert err.startswith("vnpu: error 107000") and "VNPU_ALLOC_CONF: expandable_segments" in err, err


def test_help_still_works(capsys):
    rc, out, _ = _cli(["chaos", "--help"], capsys)
    assert rc == 0 and "--duration" in out


def test_long_inputs_are_reported_not_silently_cut(tmp_path):
    """``run embed`` with an input longer than MiniLM's context: one stderr line says how many inputs were
    cut at which length; the job still runs and returns one embedding per input."""
    src = tmp_path / "in.txt"
    long_text = " ".join(["word"] * 600)
    src.write_text(f"a short sentence\n{long_text}\nanother one\n{long_text} again\n")
    out = tmp_path / "emb.npy"
    env = dict(os.environ, VNPU_BACKEND="local", VNPU_DEVICES="1", VNPU_HBM_BYTES=str(256 << 20),
               OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "run", "embed", "--input", str(src), "--output",
                        str(out), "--json"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if "cut" in ln]
    assert len(lines) == 1, p.stderr
    assert "2 of 4 inputs" in lines[0] and "256 tokens" in lines[0], lines[0]
    doc = json.loads(p.stdout)
    assert doc["count"] == 4 and doc["truncated"] == 2
    assert np.load(out).shape[0] == 4
