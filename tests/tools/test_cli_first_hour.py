"""The first hour of a new user with the ``vnpu`` command line (issue 30): every flag of every command says what
it does, every command's help ends with an example, a mistyped flag or command gets a "did you mean",
``vnpu --version`` answers, and what can be checked before a cluster starts or weights load is checked
first -- a bad ``run generate --parallel``, a port in use, serve.yaml devices out of range: exit 2, one line
that says what to do instead, and nothing started (the tripwires of tests/cli_checks.py, or a subprocess that
never imported Ray).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from cli_checks import cli
from cli_checks import tripwires  # noqa: F401 - a fixture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------------------------------------- the parser
def _commands(p, path=("vnpu",)):
    """(command path, parser) of ``p`` and of every subcommand below it (aliases once)."""
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            seen = set()
            for name, sp in a.choices.items():
                if id(sp) not in seen:
                    seen.add(id(sp))
                    yield from _commands(sp, path + (name,))


def _tree():
    from runtime.cli import build_parser
    return list(_commands(build_parser()))


def test_the_parser_walk_sees_every_command():
    """The walk below reaches the nested commands (bench's, serve reconfigure, chaos check), so a command
    without help cannot hide from it."""
    names = {" ".join(path) for path, _ in _tree()}
    assert {"vnpu smi", "vnpu bench mdl", "vnpu serve reconfigure", "vnpu chaos check", "vnpu token create",
            "vnpu run generate"} <= names, names
    assert len(names) > 30


def test_every_flag_of_every_command_has_help():
    missing = []
    for path, p in _tree():
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                continue
            if not (a.help and str(a.help).strip()):
                missing.append(f"{' '.join(path)} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, f"{len(missing)} flag(s) without help: {missing}"


def test_every_commands_help_ends_with_an_example():
    bad = []
    for path, p in _tree():
        text = p.format_help().rstrip().splitlines()
        head = [i for i, ln in enumerate(text) if ln in ("example:", "examples:")]
        if not head or not all(ln.startswith("  vnpu ") or ln.startswith("  VNPU_") for ln in text[head[-1] + 1:]):
            bad.append(" ".join(path))
        elif len(path) > 1 and not any(f"vnpu {' '.join(path[1:])}" in ln for ln in text[head[-1] + 1:]):
            bad.append(f"{' '.join(path)} (its example runs another command)")
    assert not bad, f"{len(bad)} command(s) whose help does not end with an example: {bad}"


def test_a_commands_help_says_what_it_does():
    """A subcommand's own help opens with the line its parent lists for it (argparse leaves it out)."""
    smi = dict(_tree())[("vnpu", "smi")].format_help()
    assert "npu-smi" in smi.split("options:")[0]


@pytest.mark.parametrize("argv,says", [
    (["run", "generate", "--devcies", "2", "--prompt", "hi"], "did you mean --devices?"),
    (["serve", "--prot", "8000"], "did you mean --port?"),
    (["smii"], "did you mean 'smi'?"),
    (["run", "generat", "--prompt", "hi"], "did you mean 'generate'?"),
    (["run", "generate", "--parallel", "tpp", "--prompt", "hi"], "did you mean 'tp'?"),
    (["bench", "hccl", "--op", "allreduc"], "allreduce"),
])
def test_a_mistyped_flag_or_command_gets_did_you_mean(argv, says, tripwires, capsys):  # noqa: F811
    rc, out, err = cli(argv, capsys)
    assert rc == 2, (rc, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert says in err, err


def test_far_off_flags_get_no_guess(tripwires, capsys):  # noqa: F811
    rc, _, err = cli(["smi", "--zzzzzz"], capsys)
    assert rc == 2 and "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err, err


def test_version():
    import importlib.metadata as md
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "--version"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"vnpu {md.version('vnpu')}"


def test_version_falls_back_to_pyproject(monkeypatch):
    import importlib.metadata as md
    import tomllib

    from runtime.cli import version

    def absent(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "version", absent)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert version() == tomllib.load(f)["project"]["version"]


# ---------------------------------------------------------------------------------------------- one vocabulary
#: the commands that write a report or a folder, and the rest of a valid command line for each
WRITERS = {"chaos": [], "stress-test": [], "diagnose": [], "postmortem": [], "prof": ["--", "true"]}


@pytest.mark.parametrize("cmd", sorted(WRITERS))
@pytest.mark.parametrize("flag", ["--output", "--report"])
def test_writers_take_output_and_report_as_one_flag(cmd, flag, tmp_path):
    from runtime.cli import build_parser
    target = str(tmp_path / ("prof" if cmd == "prof" else "r.json"))
    a = build_parser().parse_args([cmd, flag, target] + WRITERS[cmd])
    assert a.output == target and not hasattr(a, "report")


@pytest.mark.parametrize("cmd", sorted(WRITERS))
def test_writers_help_names_one_flag(cmd):
    help_text = dict((" ".join(p), sp) for p, sp in _tree())[f"vnpu {cmd}"].format_help()
    options = [ln.split()[0] for ln in help_text.splitlines() if ln.startswith("  -")]
    assert "--output" in options and "--report" not in options, options
    assert "--report is the same flag" in " ".join(help_text.split())


# ---------------------------------------------------------------------------------------------- benchmarks
#: benchmarks cheap enough to run in full here (text output), tiny sizes
TEXT_BENCHES = {
    "mdl": ["--batch", "1", "--seq", "8", "--rounds", "1", "--backend", "local"],
    "overhead": ["--steps", "2", "--layers", "1", "--tokens", "4", "--hidden", "64", "--ffn", "128", "--rounds", "0"],
}


@pytest.mark.parametrize("name", sorted(TEXT_BENCHES))
def test_benchmarks_print_ratios_not_verdicts_against_targets(name):
    """A benchmark prints what it measured (ratios, bounds, shares) -- no "bar 0.5x: NOT met", "goal ...: met"
    or "within +-5 pp" line judging the numbers against a target someone once wrote down."""
    import re
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env.pop("VNPU_BACKEND", None)
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "bench", name, *TEXT_BENCHES[name]], capture_output=True,
                       text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    judged = [ln for ln in p.stdout.splitlines() if re.search(r"\b(met|bar|goal|target)\b|NOT within", ln)]
    assert not judged, judged
    ratio = {"mdl": "acl.mdl.execute / onnxruntime:", "overhead": "graph replay: device compute"}[name]
    assert ratio in p.stdout, p.stdout


# ---------------------------------------------------------------------------------------------- fail fast
@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    """No cluster is up (an empty state directory), the cluster backend is the default."""
    monkeypatch.setenv("VNPU_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VNPU_BACKEND", raising=False)
    return tmp_path / "home"


def _one_line(rc, out, err, says):
    assert rc == 2, (rc, out, err)
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    for word in says:
        assert word in err, err


@pytest.mark.parametrize("argv,says", [
    (["run", "generate", "--prompt", "hi", "--devices", "2", "--parallel", "tp"],
     ["does not divide the 3 KV heads of smollm2", "use --devices 3 or --parallel pp"]),
    (["run", "generate", "--prompt", "hi", "--devices", "2"],              # tp is the default on 2 devices
     ["use --devices 3 or --parallel pp"]),
    (["run", "generate", "--prompt", "hi", "--devices", "31", "--parallel", "pp"],
     ["31 pipeline stages for the 30 layers of smollm2", "use --devices 30 or fewer"]),
    (["run", "generate", "--prompt", "hi", "--devices", "2", "--parallel", "none"],
     ["one device", "use --devices 1 or --parallel pp"]),
    (["run", "embed", "hi", "--devices", "5", "--parallel", "tp"],
     ["the 12 heads of minilm-l6", "use --devices 2, 3, 4, 6 or 12, or --parallel dp"]),
])
def test_run_checks_the_split_before_a_cluster_starts(argv, says, no_cluster, tripwires, capsys):  # noqa: F811
    """The model's shape comes from the weights' header (or the encoder registry), not from loading them;
    the tripwires prove no cluster, device or backend was started."""
    rc, out, err = cli(argv, capsys)
    _one_line(rc, out, err, says)
    assert not no_cluster.exists()


def test_a_split_that_works_passes_the_check(no_cluster, tripwires, capsys):  # noqa: F811
    """TP=3 divides SmolLM2's 3 KV heads: the command gets as far as starting the cluster (the tripwire)."""
    from cli_checks import WorkStarted
    with pytest.raises(WorkStarted):
        cli(["run", "generate", "--prompt", "hi", "--devices", "3", "--parallel", "tp"], capsys)


def test_run_asks_for_no_more_devices_than_there_are(no_cluster, tripwires, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VNPU_BACKEND", "local")
    monkeypatch.setenv("VNPU_DEVICES", "2")
    rc, out, err = cli(["run", "generate", "--prompt", "hi", "--devices", "3", "--parallel", "tp"], capsys)
    _one_line(rc, out, err, ["3 devices asked, only 2", "use --devices 2 or fewer"])


def test_the_job_refuses_what_the_command_line_refuses():
    """The jobs and the command line share one rule (runtime.models.parallel): a split the job would refuse
    after loading is the split the command refuses before."""
    from runtime.models import decoder_config, model_splits
    from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf  # noqa: F401
    s = model_splits("smollm2")
    assert s.tp_degrees() == [3] and s.layers == 30
    assert s.problem("tp", 2) and s.problem("tp", 3) is None and s.problem("pp", 30) is None
    assert decoder_config("smollm2").n_kv_heads == 3


def test_the_gguf_header_gives_the_shape_the_full_read_gives():
    """read_gguf_header (no tensors, array items skipped) yields the same config as gguf's full reader."""
    from runtime.models.weights import LlamaConfig, read_gguf_header, read_gguf_meta, smollm2_gguf
    path = smollm2_gguf()
    head = read_gguf_header(path)
    _, full = read_gguf_meta(path)
    assert LlamaConfig.from_gguf_meta(head) == LlamaConfig.from_gguf_meta(full)
    assert len(head["tokenizer.ggml.tokens"]) == len(full["tokenizer.ggml.tokens"])
    scalars = {k: v for k, v in head.items() if not isinstance(v, range)}
    assert scalars and all(full[k] == pytest.approx(v) if isinstance(v, float) else full[k] == v
                           for k, v in scalars.items())


SERVE_YAML = """\
server:
  port: 0
models:
  - model: minilm-l6@0
  - model: smollm2@1
    fallback: [5, cpu]
"""


def test_serve_yaml_devices_out_of_range_name_their_line(no_cluster, tripwires, tmp_path, capsys):  # noqa: F811
    cfg = tmp_path / "s.yaml"
    cfg.write_text(SERVE_YAML)
    rc, out, err = cli(["serve", "--config", cfg, "--devices", "3"], capsys)
    _one_line(rc, out, err, [f"{cfg}: line 5: models[1]", "fallback device 5 does not exist (3 devices)"])
    assert not no_cluster.exists()                                # not even the metrics history


@pytest.mark.parametrize("argv,says", [
    (["serve", "--tp", "2"], ["--tp: tensor parallel degree 2 does not divide the 3 KV heads of smollm2",
                              "give it 1 or 3 devices"]),
    (["serve", "--model", "smollm2@0-1"], ["--model smollm2@0-1: tensor parallel degree 2"]),
])
def test_serve_checks_the_split_before_a_cluster_starts(argv, says, no_cluster, tripwires, capsys):  # noqa: F811
    rc, out, err = cli(argv + ["--port", "0"], capsys)
    _one_line(rc, out, err, says)


def test_serve_on_a_port_in_use_exits_2_before_anything_starts(no_cluster, tripwires, capsys):  # noqa: F811
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, out, err = cli(["serve", "--model", "minilm-l6", "--port", port], capsys)
    _one_line(rc, out, err, [f"127.0.0.1:{port} is in use", "--port 0"])
    assert not no_cluster.exists()


def test_serve_on_a_free_port_passes_the_check(no_cluster, tripwires, capsys):  # noqa: F811
    """The probe leaves the port free: the command goes on to start the cluster (the tripwire)."""
    import socket

    from cli_checks import WorkStarted
    with socket.socket() as held:                 # bound, not listening, SO_REUSEADDR: uvicorn could bind it too,
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # and no other process takes it meanwhile
        held.bind(("127.0.0.1", 0))
        with pytest.raises(WorkStarted):
            cli(["serve", "--model", "minilm-l6", "--port", held.getsockname()[1]], capsys)


def test_placement_errors_after_discovery_name_the_line_too():
    """On a running cluster the devices are counted once it is discovered (before any weights load): the
    same check, with the same file and line."""
    from runtime.serve.config import ConfigError, parse_config, place
    cfg = parse_config(SERVE_YAML, "s.yaml")
    with pytest.raises(ConfigError) as e:
        place(cfg.models, 2)
    assert "s.yaml: line 5: models[1]: model smollm2: fallback device 5 does not exist (2 devices)" in str(e.value)


# ---------------------------------------------------------------------------------------------- smi
def test_smi_without_a_cluster_says_so_and_starts_nothing(no_cluster, tripwires, capsys):  # noqa: F811
    for argv in (["smi"], ["smi", "--json"], ["smi", "-l", "1"]):
        rc, out, err = cli(argv, capsys)
        _one_line(rc, out, err, ["no vnpu cluster is up", "vnpu up", "vnpu smi --embedded"])
        assert out == ""


def test_smi_without_a_cluster_never_imports_ray(tmp_path):
    """In a fresh process: the answer comes without Ray (no cluster can have started: nothing of Ray was
    even imported) -- the 51 s temporary cluster of before is opt-in (``--embedded``)."""
    code = ("import sys\nfrom runtime.cli import main\nrc = main(['smi'])\n"
            "print('ray imported' if 'ray' in sys.modules else 'no ray', rc)\n")
    env = dict(os.environ, VNPU_HOME=str(tmp_path / "home"))
    env.pop("VNPU_BACKEND", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert p.stdout.split() == ["no", "ray", "2"], (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and "vnpu up" in p.stderr, p.stderr
    assert not (tmp_path / "home").exists()


def test_smi_devices_needs_embedded(no_cluster, tripwires, capsys):  # noqa: F811
    rc, out, err = cli(["smi", "--devices", "2"], capsys)
    _one_line(rc, out, err, ["--embedded"])


HOLDER = """
import sys
from runtime.cluster import cluster_runtime
with cluster_runtime() as rt:
    t = rt.device(1).empty((3 << 20,), "uint8")      # 3 MiB on npu1
    print("ready", flush=True)
    sys.stdin.read()                                 # until the test closes stdin
    t.free()
"""


@pytest.fixture(scope="module")
def smi_cluster(tmp_path_factory):
    """A running 2-device cluster (``vnpu up``) and a runtime client process holding 3 MiB on npu1; both gone
    after the module (``vnpu down``: nothing left)."""
    home = tmp_path_factory.mktemp("smi") / "home"
    env = dict(os.environ, VNPU_HOME=str(home), OPENBLAS_NUM_THREADS="1")
    for k in ("VNPU_TOKEN", "VNPU_BACKEND", "RAY_ADDRESS"):
        env.pop(k, None)
    vnpu = lambda *a, **kw: subprocess.run([sys.executable, "-m", "runtime.cli", *a], capture_output=True,  # noqa: E731
                                           text=True, timeout=300, env=dict(env, **kw), cwd=ROOT)
    holder = None
    try:
        up = vnpu("up", "--devices", "2", "--hbm-mb", "64")
        assert up.returncode == 0, up.stderr
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        yield vnpu, env, holder.pid
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=120)
        down = vnpu("down")
        assert down.returncode == 0, down.stderr


@pytest.mark.cluster
def test_smi_json_carries_every_column_and_the_processes(smi_cluster):
    from runtime.cli.smi import DEVICE_COLUMNS, PROCESS_COLUMNS
    vnpu, _, pid = smi_cluster
    p = vnpu("smi", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["timestamp"] and doc["version"]
    rows = doc["devices"]
    assert [r["npu"] for r in rows] == [0, 1]
    assert all(c.key in r for c in DEVICE_COLUMNS for r in rows)
    procs = rows[1]["processes"]
    assert [q["pid"] for q in procs] == [pid] and rows[0]["processes"] == []
    assert procs[0]["hbm_mb"] >= 3 and procs[0]["allocations"] >= 1
    assert all(c.key in dict(q, npu=1) for c in PROCESS_COLUMNS for q in procs)


@pytest.mark.cluster
@pytest.mark.parametrize("width", [80, 200])
def test_smi_fits_the_terminal_with_a_real_clusters_data(smi_cluster, width):
    """The text at 80 and 200 columns: no line longer, nothing cut ("..." or an ellipsis), the columns left
    out at 80 named, every column at 200; the process holding HBM and a timestamp on the screen; the
    command itself honours the terminal's width ($COLUMNS when piped)."""
    from runtime.cli.smi import DEVICE_COLUMNS, render
    vnpu, _, pid = smi_cluster
    p = vnpu("smi", "--json")
    rows = json.loads(p.stdout)["devices"]
    text = render(rows, width)
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= width, text
    assert "…" not in text and "..." not in text, text
    assert lines[0].startswith("vnpu smi ") and "NPU(s)" in lines[0], lines[0]
    assert any(f"| {pid} |" in ln.replace("  ", " ") or f" {pid} " in ln for ln in lines), text
    headers = [c.header for c in DEVICE_COLUMNS]
    if width == 80:
        assert "left out for width" in text and "Node" in text.splitlines()[-1], text
    else:
        assert "left out" not in text and all(h in text for h in headers), text
        assert rows[1]["address"] in text and rows[0]["bus_id"] in text
    shown = vnpu("smi", COLUMNS=str(width))
    assert shown.returncode == 0, shown.stderr
    assert max(len(ln) for ln in shown.stdout.splitlines()) <= width, shown.stdout


def _sigint_default() -> None:
    """In the child before exec: SIGINT at its default action, as in a terminal.  A runner started in the
    background of a non-interactive shell has SIGINT ignored, Python keeps an ignored SIGINT ignored, and the
    watch would never see the Ctrl-C this test sends."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.cluster
@pytest.mark.parametrize("as_json", [False, True])
def test_smi_loop_redraws_until_ctrl_c(smi_cluster, as_json):
    """``-l 0.2``: frames keep coming (piped: appended; --json: one document per line) until SIGINT, which
    ends the watch with exit 0 and no traceback."""
    import signal
    _, env, _ = smi_cluster
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "smi", "-l", "0.2"] + (["--json"] if as_json else []),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env, COLUMNS="200"),
                         cwd=ROOT, preexec_fn=_sigint_default)
    try:
        frames = []
        for line in p.stdout:
            if as_json:
                frames.append(json.loads(line))
            elif line.startswith("vnpu smi "):
                frames.append(line)
            if len(frames) == 3:
                break
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert len(frames) == 3, err
    assert p.returncode == 0 and "Traceback" not in err, err
    if as_json:
        assert all([r["npu"] for r in f["devices"]] == [0, 1] for f in frames)
        assert len({f["timestamp"] for f in frames}) >= 1
