"""``vnpu serve`` with compiled models, as operators run it (serve tier).

- Placement: compiled models' instances on the next free devices, beside generation models placed the
  same way (neither takes a device the other names); a device held by a generation model is refused.
- Fail fast: a ``--model`` .om that is missing or corrupt, a ``--model-repository`` that is not there, a
  ``config.yaml`` that disagrees with its .om (naming the file and line), two models of one name, an
  instance group on a device the server will not have, a ``--grpc-port`` out of range -- each exits 2
  with one line on stderr, before anything starts (the commands run in-process with tripwires on every
  way to start devices or a cluster).
- The main job's step (``vnpu demo``): MiniLM-L3 compiled by ``vnpu atc`` and asked by tritonclient.
- The real command in a subprocess (in-process devices, ``VNPU_BACKEND=local``): a repository and a bare
  ``.om`` served without any generation model, over REST and gRPC (the URL it prints), to a tenant of
  ``serve.yaml`` limited to a compiled model, answered as onnxruntime answers; SIGTERM drains, exit 0.
"""
from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from cli_checks import cli
from cli_checks import tripwires  # noqa: F401 - a fixture
from devices.device import DeviceConfig
from onnx_models import assert_close, cnn, images, ort_run
from runtime.api import Runtime
from runtime.atc import compile_model, make_options
from runtime.backend import LocalBackend
from runtime.cli.demo import SENTENCES
from runtime.cli.demo_om import ask_triton, compile_minilm
from runtime.serve.config import ConfigError, devices_needed, model_spec, place
from runtime.serve.modelrepo import scan_repository, single_model
from runtime.serve.omserve import compiled_needs, place_compiled
from runtime.serve.server import Server, Service

pytestmark = pytest.mark.serve

KEY = "sk-vision-0000000001"


@pytest.fixture(scope="module")
def om(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("om") / "cnn.om"
    compile_model(cnn(seed=4), make_options("x:-1,3,16,16", "1,2,4,8")).save(str(p))
    return p


def _repo(tmp: Path, om: Path, config: str = "") -> Path:
    root = tmp / "repo"
    (root / "vision" / "1").mkdir(parents=True)
    (root / "vision" / "1" / "model.om").write_bytes(om.read_bytes())
    if config:
        (root / "vision" / "config.yaml").write_text(config)
    return root


def test_compiled_instances_are_placed_like_every_other_model(om, tmp_path):
    root = tmp_path / "repo"
    for name, cfg in (("pinned", "instance_group: [{count: 2, devices: [0]}]\nfallback: [2, cpu]\n"),
                      ("auto", "instance_group: [{count: 1}, {count: 1, kind: KIND_CPU}]\n")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.om").write_bytes(om.read_bytes())
        (root / name / "config.yaml").write_text(cfg)
    models = scan_repository(root).models
    named, auto = compiled_needs(models)
    llm = (model_spec("smollm2", None, None),)
    assert (named, auto) == ({0, 2}, 1) and devices_needed(llm, named, auto) == 4
    specs = place(llm, 4, named)
    assert specs[0].devices == (1,)                              # not 0 (pinned) nor 2 (a fallback)
    placed = {n: [str(p) for p in ps] for n, ps in place_compiled(models, specs, 4).items()}
    assert placed == {"auto": ["npu 3 -> cpu", "cpu"], "pinned": ["npu 0 -> npu 2 -> cpu"] * 2}
    with pytest.raises(ConfigError, match="model auto: needs 1 free device"):
        place_compiled(models, specs, 3)
    with pytest.raises(ConfigError, match="model pinned: device 0 is used by model smollm2"):
        place_compiled(models, place((model_spec("smollm2", (0,), None),), 4), 4)


def test_bad_compiled_models_exit_2_with_one_line_before_anything_starts(om, tmp_path, tripwires, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path / "home"))
    bad = tmp_path / "bad.om"
    bad.write_bytes(om.read_bytes()[:1000])
    far = _repo(tmp_path / "far", om, "instance_group: [{count: 1, devices: [5]}]\n")
    wrong = _repo(tmp_path / "wrong", om, "max_batch_size: 4\ninput:\n  - {name: x, data_type: TYPE_INT32, dims: [3, 16, 16]}\n")
    cases = [(["--model", tmp_path / "nope.om"], "cannot read"),
             (["--model", bad], "truncated"),
             (["--model-repository", tmp_path / "missing"], "No such file"),
             (["--model-repository", wrong], "config.yaml: line 3: input[0].data_type"),
             (["--model", om, "--model", om], "model cnn is given twice"),
             (["--model-repository", far, "--devices", "2"], "device 5 does not exist"),
             (["--model", om, "--grpc-port", "70000"], "--grpc-port")]
    for argv, word in cases:
        rc, out, err = cli(["serve", "--port", "0", *argv], capsys)
        assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, (argv, rc, out, err)
        assert err.startswith("vnpu serve: error: ") and word in err, (argv, err)


class Serve:
    """``vnpu serve`` in a subprocess; its stdout lines in a queue."""

    def __init__(self, home: Path, *argv):
        env = dict(os.environ, VNPU_HOME=str(home), VNPU_BACKEND="local", VNPU_DEVICES="2", OPENBLAS_NUM_THREADS="1")
        self.p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", *map(str, argv)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for x in self.p.stdout:
            self.lines.put(x)
        self.lines.put(None)                                     # the server exited

    def wait_for(self, word: str, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            assert line is not None, f"vnpu serve exited ({self.p.wait()}): {self.p.stderr.read()}"
            self.seen.append(line)
            if word in line:
                return line

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(120)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()


def test_serve_a_repository_and_a_bare_om_without_a_generation_model(om, tmp_path):
    root = _repo(tmp_path, om, "dynamic_batching: {max_queue_delay_microseconds: 500}\n")
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"tenants:\n  - {{name: vision, api_keys: [{KEY}], models: [vision]}}\n")
    s = Serve(tmp_path / "home", "--model-repository", root, "--model", om, "--config", cfg, "--port", "0",
              "--grpc-port", "0")
    try:
        url = s.wait_for("listening on").rsplit(" ", 1)[1].strip().removeprefix("http://")
        grpc_url = s.wait_for("gRPC on").rsplit(" ", 1)[1].strip()
        s.wait_for("ready")
        assert any("vision version 1: 1 instance(s) on npu 0 -> cpu" in ln for ln in s.seen), s.seen
        assert any("cnn version 1: 1 instance(s) on npu 1 -> cpu" in ln for ln in s.seen), s.seen
        h = lambda: {"authorization": f"Bearer {KEY}"}                                         # noqa: E731
        x = images(3, seed=7)
        ref = ort_run(cnn(seed=4), {"x": x})[0]
        hc, gc = th.InferenceServerClient(url), tg.InferenceServerClient(grpc_url)
        try:
            i = th.InferInput("x", [3, 3, 16, 16], "FP32")
            i.set_data_from_numpy(x)
            assert_close(hc.infer("vision", [i], headers=h()).as_numpy("probs"), ref, k=72, depth=4)
            g = tg.InferInput("x", [3, 3, 16, 16], "FP32")
            g.set_data_from_numpy(x)
            assert_close(gc.infer("vision", [g], headers=h()).as_numpy("probs"), ref, k=72, depth=4)
            with pytest.raises(InferenceServerException) as e:            # the tenant sees only vision
                gc.infer("cnn", [g], headers=h())
            assert e.value.status() == "StatusCode.NOT_FOUND"
        finally:
            hc.close()
            gc.close()
    finally:
        rc = s.stop()
    err = s.p.stderr.read()
    assert rc == 0, err
    assert "Traceback" not in err


def test_the_main_jobs_step_compiles_minilm_with_vnpu_atc_and_asks_it_with_tritonclient(tmp_path):
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=256 << 20)))
    try:
        svc = Service(rt, (), repositories=(single_model(compile_minilm(tmp_path)),))
        srv = Server(svc, grpc_port=0).start()
        try:
            svc.load()
            out = io.StringIO()
            assert ask_triton(srv, SENTENCES, out), out.getvalue()
        finally:
            srv.stop()
    finally:
        rt.close()
    text = out.getvalue()
    assert "REST batch 3 -> [3, 384], gRPC batch 2 -> [2, 384], the same rows agree: True" in text, text
    assert 'nv_inference_request_success{model="minilm-l3",version="1"} 2.0' in text, text
