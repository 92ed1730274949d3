"""Compiled models served with dynamic batching over the Open Inference Protocol (serve tier): one real
server in this process -- uvicorn on a free loopback port and the gRPC ``inference.GRPCInferenceService``
on another -- over a model repository in Triton's layout, driven by the official ``tritonclient`` (HTTP and
gRPC, sync and asyncio, binary and JSON data).  Devices: three in-process devices (what is under test is
the engine, the batcher and the protocol, not the cluster); the ``cpu`` end of a chain runs on the host.

The repository (each .om compiled once for the module):

- ``cnn``: a CNN (tests/onnx_models.py) compiled with batch gears 1, 2, 4, 8; two instances on npu 0;
- ``minilm``: MiniLM-L3 from the wheel's ONNX through ``vnpu atc`` (gears 1, 2, 4; 16 tokens), npu 1;
- ``strict``: the CNN with one instance on npu 1, two priority levels, a queue of 2 per level and per-
  request timeouts allowed -- the model the tests hold with ``paused()`` to make batches deterministic;
- ``shared``: the CNN with two instances on npu 0 and a queue of 3 for the model (Triton's max_queue_size
  bounds the model, not each instance);
- ``hot``: the CNN, reloaded with a new version while a client loops; ``chaos``: the CNN alone on npu 2,
  whose device the test kills (the instance goes down its chain to ``cpu``).

Results are compared with onnxruntime on the same inputs within the float32 rule of tests/onnx_models.py.
No sleeps: every wait is on a condition, an event or a future, with a deadline.
"""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
import tritonclient.http.aio as tha
from tritonclient.utils import InferenceServerException

from devices.device import DeviceConfig
from devices.errors import DeviceLostError
from onnx_models import assert_close, cnn, images, ort_run
from runtime.api import Runtime
from runtime.atc import compile_model, make_options
from runtime.backend import LocalBackend
from runtime.models.weights import minilm_l3_onnx
from runtime.observe.metrics_store import History
from runtime.serve.metrics_sampler import Sampler
from runtime.serve.config import ConfigError, ServeConfig
from runtime.serve.modelrepo import scan_repository
from runtime.serve.reconfigure import Reconfigurer
from runtime.serve.server import Server, Service
from runtime.serve.tenants import Quota, Tenant, key_digest
from serve_http import call

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[2]
WAIT = 120.0                                   #: the deadline of every wait (seconds)
CNN_K, CNN_DEPTH = 72, 4                       #: the CNN's longest reduction and chained reductions
KEYS = {"ops": "sk-ops-000000000000001", "user": "sk-user-00000000000002", "metered": "sk-metered-000000003"}
STRICT = """
dynamic_batching:
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy: {max_queue_size: 2, allow_timeout_override: true}
instance_group: [{count: 1, devices: [1]}]
"""
CONFIGS = {"cnn": "max_batch_size: 8\ndynamic_batching: {max_queue_delay_microseconds: 1000}\n"
                  "instance_group: [{count: 2, kind: KIND_GPU, gpus: [0]}]\n",
           "minilm": "instance_group: [{count: 1, devices: [1]}]\n",
           "strict": STRICT,
           "hot": "instance_group: [{count: 1, devices: [0]}]\n",
           "chaos": "instance_group: [{count: 1, devices: [2]}]\nfallback: [cpu]\n",
           "shared": "dynamic_batching: {default_queue_policy: {max_queue_size: 3}}\n"
                     "instance_group: [{count: 2, devices: [0]}]\n"}


class FakeClock:
    """The quotas' clock (a minute never passes unless a test says so)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Served:
    rt: Runtime
    srv: Server
    svc: Service
    clock: FakeClock
    sampler: Sampler
    root: Path
    cnn: object                                 #: the CNN's ONNX model (seed 4)
    cnn2: Path                                  #: a second CNN's .om (seed 5): the new version of ``hot``
    minilm: str                                 #: the MiniLM ONNX file

    @property
    def http(self) -> str:
        return self.srv.url.removeprefix("http://")

    def engines(self, model: str) -> list:
        return self.svc.compiled.instances(model)


def _atc_minilm(out: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "atc", f"--model={minilm_l3_onnx()}", "--framework=5",
                        f"--output={out}", "--input_shape=input_ids:-1,16;attention_mask:-1,16",
                        "--dynamic_batch_size=1,2,4", "--soc_version=Ascend910B3"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def _repository(tmp: Path) -> tuple[Path, object, Path]:
    root = tmp / "models"
    model = cnn(seed=4)
    blob = compile_model(model, make_options("x:-1,3,16,16", "1,2,4,8")).to_bytes()
    for name, text in CONFIGS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.yaml").write_text(text)
        if name != "minilm":
            (root / name / "1" / "model.om").write_bytes(blob)
    _atc_minilm(tmp / "minilm")
    shutil.move(tmp / "minilm.om", root / "minilm" / "1" / "model.om")
    cnn2 = tmp / "cnn2.om"
    compile_model(cnn(seed=5), make_options("x:-1,3,16,16", "1,2,4,8")).save(str(cnn2))
    return root, model, cnn2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root, model, cnn2 = _repository(tmp_path_factory.mktemp("om"))
    d = lambda n: (key_digest(KEYS[n]),)                                                        # noqa: E731
    tenants = (Tenant("ops", d("ops"), 0, admin=True), Tenant("user", d("user"), 0, models=("cnn", "minilm")),
               Tenant("metered", d("metered"), 0, Quota(tokens_per_minute=8), models=("cnn",)))
    rt = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=256 << 20)))
    repo = scan_repository(root)
    repo.check()
    clock = FakeClock()
    svc = Service(rt, (), tenants, clock=clock, repositories=(repo,))
    history = History(root.parent / "history.sqlite")
    sampler = Sampler(svc, history)                              # ticked by the tests (no thread)
    srv = Server(svc, grpc_port=0).start()
    try:
        svc.load()
        yield Served(rt, srv, svc, clock, sampler, root, model, cnn2, str(minilm_l3_onnx()))
    finally:
        srv.stop()
        rt.close()
        history.close()


def H(who: str = "ops") -> dict:
    """Fresh headers per call (tritonclient.http adds its own to the dict it is given)."""
    return {"authorization": f"Bearer {KEYS[who]}"}


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


def x_input(mod, x: np.ndarray, binary: bool = True):
    i = mod.InferInput("x", list(x.shape), "FP32")
    if mod in (th, tha):
        i.set_data_from_numpy(x, binary_data=binary)
    else:
        i.set_data_from_numpy(x)
    return i


def check_cnn(served, got: np.ndarray, x: np.ndarray, model=None, what: str = "") -> None:
    ref = ort_run(model if model is not None else served.cnn, {"x": x})[0]
    assert_close(got, ref, k=CNN_K, depth=CNN_DEPTH, what=what)


def spawn(fn, *args, **kw) -> Future:
    """``fn(*args, **kw)`` on a thread of its own; a future of its result."""
    fut: Future = Future()

    def run():
        try:
            fut.set_result(fn(*args, **kw))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            fut.set_exception(e)
    threading.Thread(target=run, daemon=True).start()
    return fut


# ---------------------------------------------------------------------------------------------- results
def test_cnn_over_http_and_grpc_sync_and_async_equals_onnxruntime(served, hc, gc):
    meta = hc.get_model_metadata("cnn", headers=H())
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    assert meta["outputs"] == [{"name": "probs", "datatype": "FP32", "shape": [-1, 10]}] and meta["versions"] == ["1"]
    cfg = hc.get_model_config("cnn", headers=H())
    assert cfg["max_batch_size"] == 8 and cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert [(g["kind"], g["count"], g["gpus"]) for g in cfg["instance_group"]] == [("KIND_GPU", 2, [0])]
    for b, binary in ((1, True), (3, False), (8, True)):
        x = images(b, seed=20 + b)
        r = hc.infer("cnn", [x_input(th, x, binary)], headers=H("user"))
        assert r.get_response()["model_version"] == "1"
        check_cnn(served, r.as_numpy("probs"), x, what=f"http batch {b}")
        r = gc.infer("cnn", [x_input(tg, x)], headers=H("user"))
        check_cnn(served, r.as_numpy("probs"), x, what=f"grpc batch {b}")

    async def aio():
        x = images(5, seed=30)
        ha = tha.InferenceServerClient(served.http)
        ga = tga.InferenceServerClient(served.srv.grpc_url)
        try:
            return x, await asyncio.gather(ha.infer("cnn", [x_input(tha, x)], headers=H()),
                                           ga.infer("cnn", [x_input(tga, x)], headers=H()))
        finally:
            await ha.close()
            await ga.close()
    x, (r1, r2) = asyncio.run(aio())
    check_cnn(served, r1.as_numpy("probs"), x, what="http aio")
    check_cnn(served, r2.as_numpy("probs"), x, what="grpc aio")


def token_inputs(b: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 30000, (b, 16)).astype(np.int64)
    mask = np.ones((b, 16), np.int64)
    mask[b - 1, 9:] = 0                                          # one padded sequence
    return ids, mask


def test_minilm_compiled_by_vnpu_atc_equals_onnxruntime(served, hc, gc):
    meta = hc.get_model_metadata("minilm", headers=H())
    names = [o["name"] for o in meta["outputs"]]
    assert [i["name"] for i in meta["inputs"]] == ["input_ids", "attention_mask"] and meta["inputs"][0]["datatype"] == "INT64"
    for b, client, mod in ((3, hc, th), (4, gc, tg), (1, hc, th)):
        ids, mask = token_inputs(b, seed=b)
        ins = [mod.InferInput("input_ids", [b, 16], "INT64"), mod.InferInput("attention_mask", [b, 16], "INT64")]
        ins[0].set_data_from_numpy(ids)
        ins[1].set_data_from_numpy(mask)
        r = client.infer("minilm", ins, headers=H("user"))
        ref = ort_run(served.minilm, {"input_ids": ids, "attention_mask": mask})
        for name, want in zip(names, ref):
            got = r.as_numpy(name)
            if want.dtype.kind == "f":
                assert_close(got, want, k=1536, depth=3, what=f"{name} batch {b}")
            else:
                np.testing.assert_array_equal(got, want)


def test_concurrent_clients_with_mixed_batch_sizes_get_exactly_their_own_rows(served):
    """16 clients (HTTP and gRPC), 3 requests each of 1-5 rows: every request its own rows, and every row
    sent executed exactly once (the instances' executions add up to the rows sent)."""
    engines = served.engines("cnn")
    rows0 = sum(r for e in engines for r, _ in e.executions)
    plan = {c: [int(n) for n in np.random.default_rng(c).integers(1, 6, 3)] for c in range(16)}
    xs = {(c, k): images(n, seed=1000 + 10 * c + k) for c, sizes in plan.items() for k, n in enumerate(sizes)}
    got: dict = {}
    errors: list = []

    def client(c: int) -> None:
        mod = th if c % 2 else tg
        cl = mod.InferenceServerClient(served.http if mod is th else served.srv.grpc_url)
        try:
            for k in range(len(plan[c])):
                got[(c, k)] = cl.infer("cnn", [x_input(mod, xs[(c, k)])], headers=H()).as_numpy("probs")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            cl.close()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not errors, errors
    keys = sorted(xs)
    ref = ort_run(served.cnn, {"x": np.concatenate([xs[k] for k in keys])})[0]
    at = 0
    for k in keys:
        n = len(xs[k])
        assert got[k].shape == (n, 10), k
        assert_close(got[k], ref[at:at + n], k=CNN_K, depth=CNN_DEPTH, what=str(k))
        at += n
    assert sum(r for e in engines for r, _ in e.executions) - rows0 == at


def test_tenants_see_their_models_and_pay_one_quota_token_per_row(served, hc, gc):
    with pytest.raises(InferenceServerException) as e:
        hc.infer("strict", [x_input(th, images(1))], headers=H("user"))
    assert e.value.status() == "404"
    assert {m["name"] for m in hc.get_model_repository_index(headers=H("user"))} == {"cnn", "minilm"}
    with pytest.raises(InferenceServerException) as e:
        hc.load_model("cnn", headers=H("user"))
    assert e.value.status() == "403"
    x = images(8, seed=5)                                        # 8 rows: the tenant's 8 tokens a minute
    check_cnn(served, hc.infer("cnn", [x_input(th, x)], headers=H("metered")).as_numpy("probs"), x)
    with pytest.raises(InferenceServerException) as e:
        gc.infer("cnn", [x_input(tg, images(1))], headers=H("metered"))
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    served.clock.t += 61                                         # a minute later: served again
    check_cnn(served, gc.infer("cnn", [x_input(tg, x[:1])], headers=H("metered")).as_numpy("probs"), x[:1])


def test_a_reconfigured_tenant_may_name_a_compiled_model(served):
    text = (f"tenants:\n  - {{name: ops, api_keys: [{KEYS['ops']}], admin: true}}\n"
            f"  - {{name: vision, api_keys: [sk-vision-0000000009], models: [cnn]}}\n")
    rc = Reconfigurer(served.svc, ServeConfig(), "", health_check=False)
    try:
        cfg, _ = rc.propose(text)
        assert [t.models for t in cfg.tenants] == [None, ("cnn",)]
        with pytest.raises(ConfigError, match="nope is not served here"):
            rc.propose(text.replace("[cnn]", "[nope]"))
    finally:
        served.svc.reconfigurer = None


# ---------------------------------------------------------------------------------------------- the batcher
def _infer_bg(served, x: np.ndarray, model: str = "strict", **kw):
    """One HTTP request of ``x`` to ``model`` on its own client; returns (probs, model_version)."""
    c = th.InferenceServerClient(served.http)
    try:
        r = c.infer(model, [x_input(th, x)], headers=H(), **kw)
        return r.as_numpy("probs"), r.get_response()["model_version"]
    finally:
        c.close()


def test_held_requests_run_as_one_padded_batch_and_padding_never_leaks(served):
    """Requests of 2 and 1 rows queued while the instance is held run as ONE execution of 3 rows at gear 4
    (gears 1, 2, 4, 8): each gets its own rows, and the padding row reaches nobody."""
    eng, = served.engines("strict")
    n0 = len(eng.executions)
    a, b = images(2, seed=41), images(1, seed=42)
    with eng.paused(WAIT):
        fa = spawn(_infer_bg, served, a)
        assert eng.wait_until(lambda e: e.waiting == 1, WAIT)
        fb = spawn(_infer_bg, served, b)
        assert eng.wait_until(lambda e: e.waiting == 2, WAIT)
        assert len(eng.executions) == n0                         # held: nothing ran
    ya, yb = fa.result(WAIT)[0], fb.result(WAIT)[0]
    assert eng.executions[n0:] == [(3, 4)]
    assert ya.shape == (2, 10) and yb.shape == (1, 10)
    check_cnn(served, ya, a, what="request of 2")
    check_cnn(served, yb, b, what="request of 1")
    y3, _ = _infer_bg(served, images(3, seed=43))                # alone: 3 rows at gear 4, 3 rows back
    assert eng.executions[-1] == (3, 4) and y3.shape == (3, 10)


def test_a_higher_priority_request_runs_first(served):
    eng, = served.engines("strict")
    n0 = len(eng.executions)
    low, high = images(5, seed=51), images(4, seed=52)
    with eng.paused(WAIT):
        fl = spawn(_infer_bg, served, low)                       # default: level 2
        assert eng.wait_until(lambda e: e.waiting == 1, WAIT)
        fh = spawn(_infer_bg, served, high, priority=1)
        assert eng.wait_until(lambda e: e.waiting == 2, WAIT)
    check_cnn(served, fl.result(WAIT)[0], low)
    check_cnn(served, fh.result(WAIT)[0], high)
    assert eng.executions[n0:] == [(4, 4), (5, 8)]              # 9 rows do not fit max_batch 8: level 1 first


def test_a_queue_timeout_rejects_with_a_clear_error(served, gc):
    eng, = served.engines("strict")
    fail0 = served.svc.compiled.stats("strict", "1")[0].fail.count
    n0 = len(eng.executions)
    x = images(1, seed=61)
    with eng.paused(WAIT):
        f = spawn(_infer_bg, served, x, timeout=1)               # 1 us: past it once the instance resumes
        assert eng.wait_until(lambda e: e.waiting == 1, WAIT)
    with pytest.raises(InferenceServerException) as e:
        f.result(WAIT)
    assert e.value.status() == "503" and "request timeout expired" in e.value.message()
    assert len(eng.executions) == n0 and served.svc.compiled.stats("strict", "1")[0].fail.count == fail0 + 1
    y, _ = _infer_bg(served, x, timeout=60_000_000)              # a timeout it meets: served
    check_cnn(served, y, x)
    r = gc.infer("strict", [x_input(tg, x)], headers=H(), timeout=60_000_000)
    check_cnn(served, r.as_numpy("probs"), x)


def test_a_full_queue_is_a_503_and_the_queued_requests_are_served(served, gc):
    eng, = served.engines("strict")
    xs = [images(1, seed=71 + i) for i in range(2)]
    with eng.paused(WAIT):
        f0 = spawn(_infer_bg, served, xs[0])
        assert eng.wait_until(lambda e: e.waiting == 1, WAIT)
        f1 = spawn(_infer_bg, served, xs[1])
        assert eng.wait_until(lambda e: e.waiting == 2, WAIT)   # max_queue_size 2: full
        with pytest.raises(InferenceServerException) as e:
            _infer_bg(served, xs[0])
        assert e.value.status() == "503" and "maximum queue size" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            gc.infer("strict", [x_input(tg, xs[0])], headers=H())
        assert e.value.status() == "StatusCode.UNAVAILABLE"
    check_cnn(served, f0.result(WAIT)[0], xs[0])
    check_cnn(served, f1.result(WAIT)[0], xs[1])


def test_max_queue_size_bounds_the_model_over_all_its_instances(served, gc):
    """``shared``: two instances, max_queue_size 3.  With both held, three requests queue (spread over the
    two by the router); the fourth is refused (503 / UNAVAILABLE) though each instance holds fewer than 3
    -- the bound is the model's, as in Triton -- and the three queued ones are served with their own rows."""
    e0, e1 = served.engines("shared")
    xs = [images(1, seed=91 + i) for i in range(3)]
    with e0.paused(WAIT), e1.paused(WAIT):
        futs = []
        for x in xs:
            to = e0 if e0.waiting <= e1.waiting else e1          # the router's pick: the least loaded, first
            n = to.waiting
            futs.append(spawn(_infer_bg, served, x, "shared"))
            assert to.wait_until(lambda e: e.waiting == n + 1, WAIT)
        assert max(e0.waiting, e1.waiting) < 3 and e0.waiting + e1.waiting == 3
        with pytest.raises(InferenceServerException) as e:
            _infer_bg(served, xs[0], "shared")
        assert e.value.status() == "503" and "maximum queue size" in e.value.message()
        assert "model 'shared'" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            gc.infer("shared", [x_input(tg, xs[0])], headers=H())
        assert e.value.status() == "StatusCode.UNAVAILABLE" and "maximum queue size" in e.value.message()
    for f, x in zip(futs, xs):
        check_cnn(served, f.result(WAIT)[0], x)


def test_a_request_whose_client_went_away_is_dropped_before_its_batch(served, gc):
    eng, = served.engines("strict")
    n0 = len(eng.executions)
    x = images(2, seed=81)
    with eng.paused(WAIT):
        call = gc.async_infer("strict", [x_input(tg, x)], callback=lambda result, error: None, headers=H())
        assert eng.wait_until(lambda e: e.waiting == 1, WAIT)
        call.cancel()                                            # the gRPC call cancelled: out of the queue
        assert eng.wait_until(lambda e: e.waiting == 0 and not e.has_unfinished(), WAIT)
    y, _ = _infer_bg(served, x)
    check_cnn(served, y, x)
    assert eng.executions[n0:] == [(2, 2)]                       # only the second one ran


# ---------------------------------------------------------------------------------------------- faults, reloads
def _control(served, what: str, model: str) -> None:
    """``load`` / ``unload`` ``model`` on a client of this thread's own (tritonclient.http uses gevent)."""
    c = th.InferenceServerClient(served.http)
    try:
        getattr(c, f"{what}_model")(model, headers=H())
    finally:
        c.close()


def test_a_device_killed_mid_load_moves_the_instance_to_cpu_and_every_request_is_answered_once(served):
    """Four clients loop over ``chaos`` (npu 2, then cpu); npu 2 is killed once some answers came back: the
    instance re-binds to the host by itself, the batch in flight runs again there, every request gets one
    correct answer."""
    eng, = served.engines("chaos")
    stats0 = served.svc.compiled.stats("chaos", "1")[0]
    per, clients = 6, 4
    answered = threading.Semaphore(0)
    got: dict = {}
    errors: list = []
    xs = {(c, k): images(1 + (c + k) % 3, seed=2000 + 10 * c + k) for c in range(clients) for k in range(per)}

    def client(c: int) -> None:
        cl = th.InferenceServerClient(served.http)
        try:
            for k in range(per):
                got[(c, k)] = cl.infer("chaos", [x_input(th, xs[(c, k)])], headers=H()).as_numpy("probs")
                answered.release()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            cl.close()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for _ in range(3):
        assert answered.acquire(timeout=WAIT)
    with contextlib.suppress(DeviceLostError):
        served.rt.device(2).handle.inject_fault("kill")
    for t in threads:
        t.join(WAIT)
    assert not errors, errors
    assert sorted(got) == sorted(xs)
    for k, x in xs.items():
        check_cnn(served, got[k], x, what=str(k))
    assert str(eng.placement) == "cpu" and eng.error is None
    ev = [e for e in eng.events if e["kind"] == "fallback"]
    assert len(ev) == 1 and ev[0]["ok"] and ev[0]["reason"].startswith("automatic: device 2 is lost")
    st = served.svc.compiled.stats("chaos", "1")[0]
    assert st.success.count - stats0.success.count == clients * per and st.fail.count == stats0.fail.count
    assert st.inference_count - stats0.inference_count == sum(len(x) for x in xs.values())


def test_hot_reload_while_a_client_loops_drops_nothing(served, hc):
    """A client loops over ``hot`` (version 1); version 2 (another CNN) is put in the repository and the
    model loaded: traffic moves to version 2 without one failed request, each answer from the version it
    names; version 1 leaves the index as the version policy (latest) says."""
    cnn5 = cnn(seed=5)
    seen: list = []
    errors: list = []
    stop = threading.Event()
    v2_seen = threading.Semaphore(0)
    xs = [images(1 + k % 4, seed=3000 + k) for k in range(64)]

    def loop() -> None:
        cl = th.InferenceServerClient(served.http)
        k = 0
        try:
            while not stop.is_set():
                x = xs[k % len(xs)]
                r = cl.infer("hot", [x_input(th, x)], headers=H())
                version = r.get_response()["model_version"]
                seen.append((version, x, r.as_numpy("probs")))
                if version == "2":
                    v2_seen.release()
                k += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            cl.close()
    t = threading.Thread(target=loop)
    t.start()
    try:
        (served.root / "hot" / "2").mkdir()
        shutil.copy(served.cnn2, served.root / "hot" / "2" / "model.om")
        old, = served.engines("hot")
        with old.paused(WAIT):                                   # a request of the loop held on version 1
            assert old.wait_until(lambda e: e.waiting == 1, WAIT)
            loading = spawn(_control, served, "load", "hot")
            assert old.wait_until(lambda e: not e.accepting, WAIT)   # traffic moved; version 1 drains
        loading.result(WAIT)
        assert v2_seen.acquire(timeout=WAIT) and v2_seen.acquire(timeout=WAIT)
    finally:
        stop.set()
        t.join(WAIT)
    assert not errors, errors
    versions = [v for v, _, _ in seen]
    assert "1" in versions and versions[-1] == "2" and versions == sorted(versions)
    for v, x, y in seen:
        check_cnn(served, y, x, served.cnn if v == "1" else cnn5, what=f"version {v}")
    index = {(m["name"], m["version"]): m for m in hc.get_model_repository_index(headers=H()) if m["name"] == "hot"}
    assert index[("hot", "2")]["state"] == "READY"
    assert index[("hot", "1")]["state"] == "UNAVAILABLE" and "version_policy" in index[("hot", "1")]["reason"]
    assert hc.get_model_metadata("hot", headers=H())["versions"] == ["2"]
    assert all(s.fail.count == 0 for s in served.svc.compiled.stats("hot", None))


def test_unload_answers_what_is_in_flight_then_refuses_and_load_brings_it_back(served, hc):
    eng, = served.engines("hot")
    onnx = served.cnn if eng.version == "1" else cnn(seed=5)    # (after the reload test: version 2)
    x = images(2, seed=91)
    with eng.paused(WAIT):
        f = spawn(_infer_bg, served, x, "hot")
        assert eng.wait_until(lambda e: e.waiting == 1, WAIT)
        unloading = spawn(_control, served, "unload", "hot")
        assert eng.wait_until(lambda e: not e.accepting, WAIT)   # the unload drains: waits for the request
    unloading.result(WAIT)
    y, version = f.result(WAIT)                                  # answered before the instance went
    assert version == eng.version
    check_cnn(served, y, x, onnx)
    assert not hc.is_model_ready("hot", headers=H())
    with pytest.raises(InferenceServerException) as e:
        hc.infer("hot", [x_input(th, x)], headers=H())
    assert e.value.status() == "503" and "not loaded (unloaded)" in e.value.message()
    index = [m for m in hc.get_model_repository_index(headers=H()) if m["name"] == "hot"]
    assert index and all(m["state"] == "UNAVAILABLE" for m in index)
    hc.load_model("hot", headers=H())
    assert hc.is_model_ready("hot", headers=H())
    check_cnn(served, hc.infer("hot", [x_input(th, x)], headers=H()).as_numpy("probs"), x, onnx)


def test_admin_fallback_restore_and_defragment_reach_every_instance(served, hc):
    x = images(3, seed=121)
    status, res = call(served.srv.url, "/admin/models/cnn/fallback", KEYS["ops"], {})
    assert status == 200 and res["moved"] and res["placement"] == "cpu", res
    assert [str(e.placement) for e in served.engines("cnn")] == ["cpu", "cpu"]
    check_cnn(served, hc.infer("cnn", [x_input(th, x)], headers=H()).as_numpy("probs"), x, what="on cpu")
    status, res = call(served.srv.url, "/admin/models/cnn/restore", KEYS["ops"], {})
    assert status == 200 and res["placement"] == "npu 0", res
    status, res = call(served.srv.url, "/admin/defragment", KEYS["ops"], {})
    assert status == 200 and {"npu:0", "npu:1"} <= {d["device"] for d in res["devices"]}, res
    check_cnn(served, hc.infer("cnn", [x_input(th, x)], headers=H()).as_numpy("probs"), x, what="back on npu 0")
    state = call(served.srv.url, "/admin/state", KEYS["ops"])[1]["compiled_models"]["cnn"]
    assert [i["placement"] for i in state["versions"]["1"]] == ["npu 0", "npu 0"]


# ---------------------------------------------------------------------------------------------- metrics
def scrape(served) -> dict:
    """``/metrics`` (an admin key: tenants are configured): {(name, labels...): value} of every sample."""
    req = urllib.request.Request(served.srv.url + "/metrics", headers=H())
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics_carry_tritons_names_and_agree_with_the_statistics(served, hc):
    for b in (1, 3):
        hc.infer("cnn", [x_input(th, images(b, seed=100 + b))], headers=H())
    st = {(d["name"], d["version"]): d for d in hc.get_inference_statistics(headers=H())["model_stats"]}
    m = scrape(served)
    lb = (("model", "cnn"), ("version", "1"))
    s = st[("cnn", "1")]
    assert m[("nv_inference_request_success", lb)] == s["inference_stats"]["success"]["count"] > 0
    assert m[("nv_inference_request_failure", lb)] == s["inference_stats"]["fail"]["count"]
    assert m[("nv_inference_count", lb)] == s["inference_count"] >= 4
    assert m[("nv_inference_exec_count", lb)] == s["execution_count"] > 0
    assert m[("nv_inference_queue_duration_us", lb)] == s["inference_stats"]["queue"]["ns"] // 1000
    assert m[("nv_inference_compute_infer_duration_us", lb)] == s["inference_stats"]["compute_infer"]["ns"] // 1000 > 0
    batches = {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}
    assert m[("vnpu:inference_batch_size_count", lb)] == sum(batches.values()) == s["execution_count"]
    assert m[("vnpu:inference_batch_size_sum", lb)] == sum(k * n for k, n in batches.items()) == s["inference_count"]
    assert m[("vnpu:inference_batch_size_bucket", (("le", "2.0"),) + lb)] == sum(n for k, n in batches.items() if k <= 2)
    strict = st[("strict", "1")]
    assert strict["inference_stats"]["fail"]["count"] >= 2       # a timeout and a full queue (earlier tests)
    assert m[("nv_inference_request_failure", (("model", "strict"), ("version", "1")))] == \
        strict["inference_stats"]["fail"]["count"]


def test_a_request_failing_after_admission_is_an_error_for_the_sampler(served, gc):
    """A queue timeout (503 after the tenant's quota admitted the request) counts in ``error_rate``, over
    REST and gRPC; a full queue is load shed (``shed_rate``), as for the generation models."""
    eng, = served.engines("strict")
    served.sampler.tick()                                        # a fresh window
    x = images(1, seed=111)
    with eng.paused(WAIT):
        late = [spawn(_infer_bg, served, x, timeout=1)]
        assert eng.wait_until(lambda e: e.waiting == 1, WAIT)
        late.append(spawn(gc.infer, "strict", [x_input(tg, x)], headers=H(), timeout=1))
        assert eng.wait_until(lambda e: e.waiting == 2, WAIT)
        with pytest.raises(InferenceServerException):            # full: shed
            _infer_bg(served, x)
    for f in late:
        with pytest.raises(InferenceServerException, match="request timeout expired"):
            f.result(WAIT)
    _infer_bg(served, x)
    gc.infer("strict", [x_input(tg, x)], headers=H())
    server, _ = served.sampler.tick()
    assert server["error_rate"] == 0.5 and server["shed_rate"] == 0.2
    # every request that ended was strict's (REST by its /v2 path, gRPC by model_name): its qps is the server's
    assert served.sampler.history.latest("model:strict")["qps"][1] == pytest.approx(server["qps"]) and server["qps"] > 0
