"""Compiled models with image-size gears (``vnpu atc --dynamic_image_size``) served over the Open Inference
Protocol (serve tier): one real server in this process (HTTP on a free loopback port, gRPC on another) over
a model repository, driven by the official ``tritonclient``; one in-process device.

The repository (tests/onnx_models.py's ``hw_cnn``: conv, relu, max pool -> ``feat`` [N, 4, H/2, W/2];
global pool, Gemm -> ``logits`` [N, 5]; gears 8x12 and 16x16, non-square so a swapped H and W shows):

- ``hw``: compiled with a fixed batch of 1 (``x:1,3,-1,-1``), its config.yaml only places it: everything else
  from the .om;
- ``hw2``: compiled with a fixed batch of 2 (``x:2,3,-1,-1``), ``max_batch_size: 2`` -- the model the tests
  hold with ``paused()`` to see which requests share an execution;
- ``hw0``: as ``hw``, with ``max_batch_size: 0`` (no batch axis: the full shape [1, 3, -1, -1]).

Results are compared with onnxruntime at the same size within the float32 rule of tests/onnx_models.py.
No sleeps: every wait is on a condition or a future, with a deadline.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from om_server import repository_server
from onnx_models import assert_close, hw_cnn, ort_run
from runtime.atc import DYNAMIC_INPUT_NAME, compile_model, make_options
from runtime.serve.engine.om_runner import HostRunner
from runtime.serve.modelrepo import ModelConfigError, scan_repository, single_model
from runtime.serve.server import Server, Service

pytestmark = pytest.mark.serve

WAIT = 120.0                                   #: the deadline of every wait (seconds)
GEARS = ((8, 12), (16, 16))
GEAR_TEXT = ";".join(f"{h},{w}" for h, w in GEARS)
K, DEPTH = 80, 3                               #: longest reduction (3x3x3 conv, the pool of 8x8), chained ones


@dataclass
class Served:
    srv: Server
    svc: Service
    model: object                              #: the ONNX model (seed 4)
    om: Path                                   #: hw's .om

    @property
    def http(self) -> str:
        return self.srv.url.removeprefix("http://")

    def engine(self, name: str):
        eng, = self.svc.compiled.instances(name)
        return eng


def _repository(root: Path, model) -> Path:
    one = "instance_group: [{count: 1, devices: [0]}]\n"          # both on the one device
    for name, batch, config in (("hw", 1, one), ("hw2", 2, "max_batch_size: 2\n" + one),
                                ("hw0", 1, "max_batch_size: 0\n" + one)):
        (root / name / "1").mkdir(parents=True)
        compile_model(model, make_options(f"x:{batch},3,-1,-1", dynamic_image_size=GEAR_TEXT)).save(
            str(root / name / "1" / "model.om"))
        (root / name / "config.yaml").write_text(config)
    return root / "hw" / "1" / "model.om"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("hwrepo") / "models"
    model = hw_cnn(seed=4)
    om = _repository(root, model)
    with repository_server(root) as (srv, svc):
        yield Served(srv, svc, model, om)


@pytest.fixture(scope="module")
def hc(served):
    c = th.InferenceServerClient(served.http, concurrency=4)
    yield c
    c.close()


@pytest.fixture(scope="module")
def gc(served):
    c = tg.InferenceServerClient(served.srv.grpc_url)
    yield c
    c.close()


def image(h: int, w: int, seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, h, w)).astype(np.float32)


def infer(client, mod, name: str, x: np.ndarray):
    i = mod.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return client.infer(name, [i])


def check(served, feat: np.ndarray, logits: np.ndarray, x: np.ndarray, what: str) -> None:
    """Each row of ``x`` (the ONNX model takes one image) against onnxruntime at its size."""
    for r in range(len(x)):
        ref = ort_run(served.model, {"x": x[r:r + 1]})
        assert_close(feat[r:r + 1], ref[0], K, DEPTH, what=f"{what} feat row {r}")
        assert_close(logits[r:r + 1], ref[1], K, DEPTH, what=f"{what} logits row {r}")


def spawn(fn, *args) -> Future:
    fut: Future = Future()

    def run():
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            fut.set_exception(e)
    threading.Thread(target=run, daemon=True).start()
    return fut


# ---------------------------------------------------------------------------------------------- tests
def test_metadata_and_config_show_minus_one_dims_and_hide_the_gear_input(served, hc, gc):
    meta = hc.get_model_metadata("hw")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]
    assert meta["outputs"] == [{"name": "feat", "datatype": "FP32", "shape": [-1, 4, -1, -1]},
                               {"name": "logits", "datatype": "FP32", "shape": [-1, 5]}]
    cfg = hc.get_model_config("hw")
    assert cfg["max_batch_size"] == 1                               # the .om's fixed batch, honestly
    assert [(t["name"], t["dims"]) for t in cfg["input"]] == [("x", [3, -1, -1])]
    assert [(t["name"], t["dims"]) for t in cfg["output"]] == [("feat", [4, -1, -1]), ("logits", [5])]
    assert "dynamic_batching" in cfg
    assert hc.get_model_config("hw2")["max_batch_size"] == 2
    g = gc.get_model_metadata("hw", as_json=True)
    assert [(t["name"], [int(d) for d in t["shape"]]) for t in g["inputs"]] == [("x", [-1, 3, -1, -1])]
    assert DYNAMIC_INPUT_NAME not in str(meta) + str(cfg) + str(g)
    meta0 = hc.get_model_metadata("hw0")
    assert meta0["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1, 3, -1, -1]}]
    x = image(16, 16, 7)
    r = infer(hc, th, "hw0", x)
    check(served, r.as_numpy("feat"), r.as_numpy("logits"), x, "hw0 16x16")


def test_two_gears_over_http_and_grpc_equal_onnxruntime_at_that_size(served, hc, gc):
    for (h, w), seed in zip(GEARS, (1, 2)):
        x = image(h, w, seed)
        for client, mod in ((hc, th), (gc, tg)):
            r = infer(client, mod, "hw", x)
            feat, logits = r.as_numpy("feat"), r.as_numpy("logits")
            assert feat.shape == (1, 4, h // 2, w // 2) and logits.shape == (1, 5)
            check(served, feat, logits, x, f"{mod.__name__} {h}x{w}")


def test_a_size_that_is_not_a_gear_is_refused_before_any_device_work(served, hc, gc):
    eng = served.engine("hw")
    n0 = len(eng.executions)
    x = image(12, 12, 3)
    with pytest.raises(InferenceServerException) as e:
        infer(hc, th, "hw", x)
    assert e.value.status() == "400"
    assert "12x12" in e.value.message() and "8x12, 16x16 (height x width)" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        infer(gc, tg, "hw", image(16, 12, 3))                       # 12x16 is a gear, 16x12 is not
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "16x12" in e.value.message()
    assert len(eng.executions) == n0                                 # nothing ran
    x = image(8, 12, 4)
    r = infer(hc, th, "hw", x)                                       # the model serves on
    check(served, r.as_numpy("feat"), r.as_numpy("logits"), x, "after the refusals")


def test_concurrent_mixed_sizes_batch_only_with_their_own_size(served):
    """Held, ``hw2`` (fixed batch 2) queues 8x12, 8x12, 16x16, 8x12 from four clients: the first two share
    one execution (2 rows: full), the 16x16 one runs alone (a batch holds one size; the 8x12 behind it
    does not overtake it), then the last 8x12 alone (padded to 2) -- every client gets its own rows."""
    eng = served.engine("hw2")
    sizes = ((8, 12), (8, 12), (16, 16), (8, 12))
    xs = [image(h, w, 10 + i) for i, (h, w) in enumerate(sizes)]
    clients = [th.InferenceServerClient(served.http) for _ in xs]
    try:
        n0 = len(eng.executions)
        with eng.paused(WAIT):
            futs = []
            for i, (c, x) in enumerate(zip(clients, xs)):
                futs.append(spawn(infer, c, th, "hw2", x))
                assert eng.wait_until(lambda e, n=i + 1: e.waiting == n, WAIT)
        results = [f.result(WAIT) for f in futs]
    finally:
        for c in clients:
            c.close()
    assert eng.executions[n0:] == [(2, 2), (1, 2), (1, 2)]
    for (h, w), x, r in zip(sizes, xs, results):
        feat, logits = r.as_numpy("feat"), r.as_numpy("logits")
        assert feat.shape == (1, 4, h // 2, w // 2) and logits.shape == (1, 5)
        check(served, feat, logits, x, f"hw2 {h}x{w}")


def test_the_host_runner_of_the_cpu_fallback_runs_each_gear(served):
    """The ``cpu`` end of a fallback chain runs the same gears on the host."""
    r = HostRunner(served.om, [])
    assert r.input_names == ("x",) and r.image_sizes is not None and r.image_sizes.gears == GEARS
    for (h, w), seed in zip(GEARS, (5, 6)):
        x = image(h, w, seed)
        feat, logits = r.run([x], (h, w))
        check(served, feat, logits, x, f"host {h}x{w}")


def test_what_cannot_be_served_is_refused_at_load_with_one_line(served, tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("max_batch_size: 4\n")
    with pytest.raises(ModelConfigError) as e:
        single_model(served.om, "big", cfg).check()
    msg = str(e.value)
    assert "\n" not in msg and "max_batch_size" in msg and "image-size gears and a fixed batch of 1" in msg
    assert "use 0..1" in msg and "type" not in msg
    cfg.write_text("max_batch_size: 1\ninput: [{name: x, data_type: TYPE_FP32, dims: [3, 16, 16]}]\n")
    with pytest.raises(ModelConfigError) as e:
        single_model(served.om, "fixed", cfg).check()
    assert "[3, 16, 16]" in str(e.value) and "[3, -1, -1]" in str(e.value)
    cfg.write_text("max_batch_size: 0\n")                            # without the batch axis: [1, 3, -1, -1]
    repo = single_model(served.om, "flat", cfg)
    repo.check()
    assert [t.dims for t in repo.models[0].config.inputs] == [(1, 3, -1, -1)]


def test_a_version_without_the_image_size_gears_of_the_model_is_not_served(served, tmp_path):
    """Version 1 static at 8x12, version 2 with the gears: the model serves version 2 (-1 on H and W);
    version 1 could not take the other sizes, so it is UNAVAILABLE with the reason in one line."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "2").mkdir()
    compile_model(served.model, make_options("x:1,3,8,12")).save(str(tmp_path / "m" / "1" / "model.om"))
    (tmp_path / "m" / "2" / "model.om").write_bytes(served.om.read_bytes())
    (tmp_path / "m" / "config.yaml").write_text("version_policy: {all: {}}\n")
    m, = scan_repository(tmp_path).models
    assert [v.state for v in m.versions] == ["UNAVAILABLE", "READY"]
    why = m.versions[0].reason
    assert "\n" not in why and "version 2 has image-size gears, version 1 has none" in why
    assert [t.dims for t in m.config.inputs] == [(3, -1, -1)]
