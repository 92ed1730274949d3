"""The Open Inference Protocol (KServe v2) of ``vnpu serve`` (serve tier): the official ``tritonclient``
(HTTP and gRPC, sync and asyncio, JSON and binary tensor data) against one real server in this process --
uvicorn on a free loopback port with the server's guard, and the gRPC ``inference.GRPCInferenceService`` on
another -- over a real repository of numpy function models (tests/v2_models.py).  Every datatype round
trips on both transports; every bad tensor is a 400 / ``INVALID_ARGUMENT`` that never reaches the models
(the repository records every request it got) and the server keeps serving; tenants, keys, quotas and
client cancellation apply as on the OpenAI routes."""
from __future__ import annotations

import asyncio
import http.client
import json
import struct
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
import tritonclient.http as th
import tritonclient.http.aio as tha
from tritonclient.utils import InferenceServerException

from driver import wire
from runtime.cluster.failover import wait_polled
from runtime.serve.server import Frontend, Server
from runtime.serve.tenants import Quota, Tenant, key_digest
from v2_models import ECHO_TYPES, NumpyRepository

pytestmark = pytest.mark.serve

KEYS = {"ops": "sk-ops-000000000000001", "user": "sk-user-00000000000002", "limited": "sk-limited-000000003",
        "metered": "sk-metered-000000004"}


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class V2Frontend(Frontend):
    """A server whose only models are the repository's (nothing to load)."""

    def _load(self) -> None:
        pass


@dataclass
class Served:
    srv: Server
    svc: V2Frontend
    repo: NumpyRepository
    clock: FakeClock

    @property
    def http_url(self) -> str:
        return self.srv.url.removeprefix("http://")


@pytest.fixture(scope="module")
def served():
    repo, clock = NumpyRepository(), FakeClock()
    d = lambda n: (key_digest(KEYS[n]),)                                                        # noqa: E731
    tenants = (Tenant("ops", d("ops"), 0, admin=True), Tenant("user", d("user"), 0),
               Tenant("limited", d("limited"), 0, models=("add_sub",)),
               Tenant("metered", d("metered"), 0, Quota(tokens_per_minute=8)))
    svc = V2Frontend(None, (), tenants, clock=clock, model_repository=repo)
    srv = Server(svc, grpc_port=0).start()
    try:
        svc.load()
        yield Served(srv, svc, repo, clock)
    finally:
        srv.stop()
        repo.close()


def H(who: str = "ops") -> dict:
    """Fresh headers per call (tritonclient.http adds its own to the dict it is given)."""
    return {"authorization": f"Bearer {KEYS[who]}"}


@pytest.fixture(scope="module")
def hc(served):
    c = th.InferenceServerClient(served.http_url, concurrency=4)
    yield c
    c.close()


@pytest.fixture(scope="module")
def gc(served):
    c = tg.InferenceServerClient(served.srv.grpc_url)
    yield c
    c.close()


def raw(served, path: str, body: bytes | dict | None = None, headers: dict | None = None, who: str | None = "ops"):
    """(status, headers, body bytes) of one plain HTTP request."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    h = {"Content-Type": "application/json", **(headers or {})}
    if who is not None:
        h.update(H(who))
    req = urllib.request.Request(served.srv.url + path, data=data, method="POST" if data is not None else "GET",
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def add_sub_inputs(mod, a: np.ndarray, b: np.ndarray, binary: bool = True):
    ins = [mod.InferInput("INPUT0", list(a.shape), "FP32"), mod.InferInput("INPUT1", list(b.shape), "FP32")]
    if mod is th or mod is tha:
        ins[0].set_data_from_numpy(a, binary_data=binary)
        ins[1].set_data_from_numpy(b, binary_data=binary)
    else:
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
    return ins


def rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    return r.standard_normal((n, 4)).astype(np.float32), r.standard_normal((n, 4)).astype(np.float32)


def good_infer(served, hc) -> None:
    """The server still serves: one correct request."""
    a, b = rows(2, 99)
    res = hc.infer("add_sub", add_sub_inputs(th, a, b), headers=H())
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)


# ---------------------------------------------------------------------------------------------- health, metadata
def test_health_is_open_everything_else_needs_a_key(served, hc, gc):
    assert hc.is_server_live() and hc.is_server_ready()                  # probes: no key
    assert gc.is_server_live() and gc.is_server_ready()
    status, _, body = raw(served, "/v2", who=None)
    assert status == 401 and isinstance(json.loads(body)["error"], str) and "API key" in json.loads(body)["error"]
    with pytest.raises(InferenceServerException) as e:
        hc.get_server_metadata()
    assert e.value.status() == "401"
    with pytest.raises(InferenceServerException) as e:
        gc.get_server_metadata(headers={"authorization": "Bearer sk-wrong-0000000000"})
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    md = hc.get_server_metadata(headers=H())
    assert md == gc.get_server_metadata(headers=H(), as_json=True)
    assert md["name"] == "vnpu" and "binary_tensor_data" in md["extensions"] and "statistics" in md["extensions"]


def test_model_metadata_and_config_on_both_transports(served, hc, gc):
    md = hc.get_model_metadata("add_sub", headers=H())
    assert md["versions"] == ["1"] and md["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
    gmd = gc.get_model_metadata("add_sub", "1", headers=H(), as_json=True)
    assert [(t["name"], t["datatype"], [int(x) for x in t["shape"]]) for t in gmd["outputs"]] == \
        [(t["name"], t["datatype"], t["shape"]) for t in md["outputs"]]
    cfg = hc.get_model_config("add_sub", headers=H())
    gcfg = gc.get_model_config("add_sub", headers=H(), as_json=True)["config"]
    assert cfg["max_batch_size"] == gcfg["max_batch_size"] == 8
    assert cfg["input"][0]["dims"] == [4] and cfg["input"][0]["data_type"] == "TYPE_FP32"     # no batch dim
    assert [int(x) for x in gcfg["input"][0]["dims"]] == [4]
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [2, 4]
    assert int(gcfg["dynamic_batching"]["max_queue_delay_microseconds"]) == 500
    assert gcfg["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 16
    assert gcfg["instance_group"][0]["kind"] == cfg["instance_group"][0]["kind"] == "KIND_CPU"
    fixed = hc.get_model_config("fixed", headers=H())
    assert fixed["max_batch_size"] == 0 and fixed["input"][0]["dims"] == [2, 3]              # every dim
    for call in (lambda: hc.get_model_metadata("add_sub", "7", headers=H()),
                 lambda: hc.get_model_config("nope", headers=H())):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "404"
    with pytest.raises(InferenceServerException) as e:
        gc.get_model_metadata("nope", headers=H())
    assert e.value.status() == "StatusCode.NOT_FOUND"


# ---------------------------------------------------------------------------------------------- inference
@pytest.mark.parametrize("binary_in,binary_out", [(True, True), (False, False), (True, False), (False, True)])
def test_http_infer_json_and_binary(served, hc, binary_in, binary_out):
    a, b = rows(3, 1)
    outs = [th.InferRequestedOutput("OUTPUT1", binary_data=binary_out)]
    res = hc.infer("add_sub", add_sub_inputs(th, a, b, binary_in), outputs=outs, request_id="req-7", headers=H())
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    assert res.as_numpy("OUTPUT0") is None                                   # only what was asked for
    resp = res.get_response()
    assert resp["id"] == "req-7" and resp["model_name"] == "add_sub" and resp["model_version"] == "1"
    assert ("binary_data_size" in resp["outputs"][0].get("parameters", {})) == binary_out
    every = hc.infer("add_sub", add_sub_inputs(th, a, b, binary_in), headers=H())   # no outputs named: all, binary
    np.testing.assert_array_equal(every.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(every.as_numpy("OUTPUT1"), a - b)
    assert "id" not in every.get_response()


def test_grpc_infer_with_raw_and_typed_contents(served, gc):
    a, b = rows(4, 2)
    res = gc.infer("add_sub", add_sub_inputs(tg, a, b), outputs=[tg.InferRequestedOutput("OUTPUT0")],
                   request_id="g-1", headers=H())
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    assert res.as_numpy("OUTPUT1") is None and res.get_response().id == "g-1"
    # contents in the datatype's field instead of raw_input_contents (what other clients send)
    M = wire.inference
    req = M.ModelInferRequest(model_name="fixed")
    t = req.inputs.add(name="IN", datatype="INT32", shape=[2, 3])
    t.contents.int_contents.extend([1, -2, 3, -4, 5, 2**31 - 1])
    with grpc.insecure_channel(served.srv.grpc_url) as ch:
        resp = wire.GRPCInferenceServiceStub(ch).ModelInfer(req, metadata=tuple(H().items()), timeout=60)
    out = np.frombuffer(resp.raw_output_contents[0], dtype="<i4").reshape(list(resp.outputs[0].shape))
    np.testing.assert_array_equal(out, (np.array([1, -2, 3, -4, 5, 2**31 - 1], dtype=np.int32) * 2).reshape(2, 3))


def test_request_parameters_reach_the_model_with_the_tenant(served, hc, gc):
    a, b = rows(2, 8)
    hc.infer("add_sub", add_sub_inputs(th, a, b), priority=2, timeout=5000, request_id="p-1", headers=H("user"))
    r = served.repo.requests[-1]
    assert (r.priority, r.timeout_us, r.id, r.tenant.name, r.rows, r.outputs) == (2, 5000, "p-1", "user", 2, ())
    assert r.inputs["INPUT0"].dtype == np.float32 and r.inputs["INPUT0"].shape == (2, 4)
    gc.infer("add_sub", add_sub_inputs(tg, a, b), outputs=[tg.InferRequestedOutput("OUTPUT1")], priority=1,
             headers=H("limited"))
    r = served.repo.requests[-1]
    assert (r.priority, r.timeout_us, r.tenant.name, r.outputs, r.version) == (1, None, "limited", ("OUTPUT1",), None)


def _echo_data(dt: str) -> np.ndarray:
    if dt == "BYTES":
        return np.array([[b"abc", b"", "n\u00e4h".encode()], [b"x" * 40, b"0", b"\xe2\x82\xac"]], dtype=object)
    if dt == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    npt = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dt) or np.dtype(dt.lower())
    if np.dtype(npt).kind in "iu":
        info = np.iinfo(npt)
        return np.array([[info.min, 0, info.max], [1, info.max - 1, info.min + 1]], dtype=npt)
    return np.array([[-1.5, 0.0, 65504.0 if dt == "FP16" else 3.25e38], [0.1, -0.0, 7.0]], dtype=npt)


@pytest.mark.parametrize("transport", ["http-json", "http-binary", "grpc"])
@pytest.mark.parametrize("dt", ECHO_TYPES)
def test_every_datatype_round_trips(served, hc, gc, dt, transport):
    x = _echo_data(dt)
    if transport == "grpc":
        i = tg.InferInput("IN", list(x.shape), dt)
        i.set_data_from_numpy(x)
        got = gc.infer(f"echo_{dt.lower()}", [i], headers=H()).as_numpy("OUT")
    else:
        binary = transport == "http-binary"
        i = th.InferInput("IN", list(x.shape), dt)
        i.set_data_from_numpy(x, binary_data=binary)
        got = hc.infer(f"echo_{dt.lower()}", [i], outputs=[th.InferRequestedOutput("OUT", binary_data=binary)],
                       headers=H()).as_numpy("OUT")
    assert got.shape == x.shape
    if dt == "BYTES":
        got = np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(got)
        assert got.tolist() == x.tolist()
    else:
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, x)


def test_json_data_flat_or_nested(served):
    want = [2, 4, 6, 8, 10, 12]
    for data in ([1, 2, 3, 4, 5, 6], [[1, 2, 3], [4, 5, 6]]):
        body = {"id": "n1", "inputs": [{"name": "IN", "datatype": "INT32", "shape": [2, 3], "data": data}]}
        status, headers, out = raw(served, "/v2/models/fixed/versions/1/infer", body)
        assert status == 200 and headers["content-type"].startswith("application/json")
        doc = json.loads(out)
        assert doc["id"] == "n1" and doc["outputs"] == [{"name": "OUT", "datatype": "INT32", "shape": [2, 3],
                                                         "data": want}]


def test_bytes_that_are_not_utf8_cannot_be_json(served, hc):
    i = th.InferInput("IN", [1, 1], "BYTES")
    i.set_data_from_numpy(np.array([[b"\xff\xfe"]], dtype=object), binary_data=True)
    with pytest.raises(InferenceServerException) as e:
        hc.infer("echo_bytes", [i], outputs=[th.InferRequestedOutput("OUT", binary_data=False)], headers=H())
    assert e.value.status() == "400" and "binary" in e.value.message()
    got = hc.infer("echo_bytes", [i], headers=H()).as_numpy("OUT")             # as binary: fine
    assert got.tolist() == [[b"\xff\xfe"]]


def test_aio_clients_with_mixed_batch_sizes_get_their_own_rows(served):
    async def main():
        hcl, gcl = tha.InferenceServerClient(served.http_url), tga.InferenceServerClient(served.srv.grpc_url)
        try:
            data = [rows(n, 10 + n) for n in (1, 3, 8, 2, 5, 4)]
            calls = [(hcl if k % 2 else gcl).infer("add_sub", add_sub_inputs(tha if k % 2 else tga, a, b),
                                                    headers=H()) for k, (a, b) in enumerate(data)]
            for (a, b), res in zip(data, await asyncio.gather(*calls)):
                np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
            assert await hcl.is_model_ready("add_sub", headers=H()) and await gcl.is_model_ready("add_sub", headers=H())
        finally:
            await hcl.close()
            await gcl.close()
    asyncio.run(main())


# ---------------------------------------------------------------------------------------------- refusals
def _t(name="INPUT0", dt="FP32", shape=(1, 4), data=None, **params):
    t = {"name": name, "datatype": dt, "shape": list(shape)}
    if params:
        t["parameters"] = params
    elif data is not False:
        t["data"] = data if data is not None else [0.5] * int(np.prod(shape))
    return t


def _req(*inputs, **extra):
    return {"inputs": list(inputs) or [_t(), _t("INPUT1")], **extra}


def _f32(n: int) -> bytes:
    return np.arange(n, dtype="<f4").tobytes()


#: (case, model, request document or raw body, binary part, extra headers, status, what the error says)
BAD_HTTP = [
    ("wrong datatype", "add_sub", _req(_t(dt="INT32", data=[1, 2, 3, 4]), _t("INPUT1")), b"", {}, 400,
     "datatype INT32, the model takes FP32"),
    ("unknown datatype", "add_sub", _req(_t(dt="FP128"), _t("INPUT1")), b"", {}, 400, "unknown datatype"),
    ("shape and data disagree", "add_sub", _req(_t(data=[1.0, 2.0, 3.0]), _t("INPUT1")), b"", {}, 400,
     "holds 4 elements, data has 3"),
    ("fixed dimension", "add_sub", _req(_t(shape=(1, 5)), _t("INPUT1", shape=(1, 5))), b"", {}, 400,
     "does not match"),
    ("rank", "add_sub", _req(_t(shape=(4,)), _t("INPUT1", shape=(4,))), b"", {}, 400, "dimensions"),
    ("bad shape", "add_sub", _req(_t(shape=(1, -4)), _t("INPUT1")), b"", {}, 400, "non-negative integers"),
    ("unknown input", "add_sub", _req(_t(), _t("INPUT1"), _t("INPUT9")), b"", {}, 400, "has no input 'INPUT9'"),
    ("missing input", "add_sub", _req(_t()), b"", {}, 400, "needs input(s) INPUT1"),
    ("input twice", "add_sub", _req(_t(), _t(), _t("INPUT1")), b"", {}, 400, "more than once"),
    ("batch over max", "add_sub", _req(_t(shape=(9, 4)), _t("INPUT1", shape=(9, 4))), b"", {}, 400,
     "1 to 8 rows"),
    ("batch of zero", "add_sub", _req(_t(shape=(0, 4), data=[]), _t("INPUT1", shape=(0, 4), data=[])), b"", {},
     400, "out of range"),
    ("batch sizes differ", "add_sub", _req(_t(shape=(1, 4)), _t("INPUT1", shape=(2, 4))), b"", {}, 400,
     "one batch size"),
    ("not batching: fixed shape", "fixed", _req(_t("IN", "INT32", (1, 2, 3), [1] * 6)), b"", {}, 400,
     "dimensions"),
    ("float for INT32", "fixed", _req(_t("IN", "INT32", (2, 3), [1, 2, 3, 4, 5, 6.5])), b"", {}, 400,
     "must be integers"),
    ("INT8 out of range", "echo_int8", _req(_t("IN", "INT8", (1, 2), [1, 300])), b"", {}, 400, "out of the range"),
    ("string for FP32", "add_sub", _req(_t(data=["a", "b", "c", "d"]), _t("INPUT1")), b"", {}, 400,
     "must be numbers"),
    ("number for BOOL", "echo_bool", _req(_t("IN", "BOOL", (1, 2), [True, 1])), b"", {}, 400, "true/false"),
    ("number for BYTES", "echo_bytes", _req(_t("IN", "BYTES", (1, 2), ["a", 1])), b"", {}, 400, "must be strings"),
    ("data not a list", "add_sub", _req(_t(data="oops"), _t("INPUT1")), b"", {}, 400, "must be a (flat or nested) list"),
    ("binary sizes short of the body", "add_sub", _req(_t(data=False, binary_data_size=16), _t("INPUT1")),
     _f32(4) + b"xx", {}, 400, "add up to 16 bytes"),
    ("binary size past the body", "add_sub", _req(_t(data=False, binary_data_size=32), _t("INPUT1")), _f32(4), {},
     400, "does not fit"),
    ("binary size wrong for the shape", "add_sub", _req(_t(data=False, binary_data_size=12), _t("INPUT1")),
     _f32(3), {}, 400, "is 16 bytes"),
    ("binary without the header", "add_sub", _req(_t(data=False, binary_data_size=16), _t("INPUT1")), None, {},
     400, "does not fit"),
    ("header length not a number", "add_sub", _req(), _f32(4), {"Inference-Header-Content-Length": "x"}, 400,
     "Inference-Header-Content-Length"),
    ("header length past the body", "add_sub", _req(), _f32(4), {"Inference-Header-Content-Length": "999999"}, 400,
     "Inference-Header-Content-Length"),
    ("data and binary", "add_sub", _req(dict(_t(data=False, binary_data_size=16), data=[1, 2, 3, 4]), _t("INPUT1")),
     _f32(4), {}, 400, "both data and"),
    ("neither data nor binary", "add_sub", _req(_t(data=False), _t("INPUT1")), b"", {}, 400, "neither data nor"),
    ("BYTES lengths", "echo_bytes", _req(_t("IN", "BYTES", (1, 1), data=False, binary_data_size=7)),
     struct.pack("<I", 100) + b"abc", {}, 400, "declares 100 bytes"),
    ("BYTES trailing bytes", "echo_bytes", _req(_t("IN", "BYTES", (1, 1), data=False, binary_data_size=8)),
     struct.pack("<I", 1) + b"abcd", {}, 400, "bytes are left"),
    ("not JSON", "add_sub", b"{inputs: nope", b"", {}, 400, "not valid JSON"),
    ("not an object", "add_sub", b"[1, 2]", b"", {}, 400, "must be a JSON object"),
    ("no inputs", "add_sub", {"inputs": []}, b"", {}, 400, "non-empty list"),
    ("unknown output", "add_sub", _req(outputs=[{"name": "OUTPUT7"}]), b"", {}, 400, "has no output 'OUTPUT7'"),
    ("output twice", "add_sub", _req(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]), b"", {}, 400,
     "more than once"),
    ("classification", "add_sub", _req(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 3}}]), b"",
     {}, 400, "classification extension is not supported"),
    ("sequence batching", "add_sub", _req(parameters={"sequence_id": 5}), b"", {}, 400, "sequence batching"),
    ("negative priority", "add_sub", _req(parameters={"priority": -1}), b"", {}, 400, "non-negative integer"),
    ("shared memory", "add_sub", _req(_t(data=False, shared_memory_region="r0"), _t("INPUT1")), b"", {}, 400,
     "shared memory"),
    ("compressed body", "add_sub", _req(), b"", {"Content-Encoding": "gzip"}, 400, "Content-Encoding"),
    ("unknown model", "nope", _req(), b"", {}, 404, "nope"),
    ("unknown version", "add_sub/versions/7", _req(), b"", {}, 404, "version 7"),
]


def _post_body(doc, binary: bytes | None) -> tuple[bytes, dict]:
    head = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    if not binary:
        return head, {}
    return head + binary, {"Inference-Header-Content-Length": str(len(head))}


@pytest.mark.parametrize("case,model,doc,binary,headers,status,says", BAD_HTTP, ids=[c[0] for c in BAD_HTTP])
def test_bad_http_requests_are_refused_before_any_work(served, hc, case, model, doc, binary, headers, status, says):
    body, h = _post_body(doc, binary)
    before = len(served.repo.requests)
    got, resp_headers, out = raw(served, f"/v2/models/{model}/infer", body, {**h, **headers})
    err = json.loads(out)
    assert (got, set(err)) == (status, {"error"}), err
    assert isinstance(err["error"], str) and says in err["error"], err["error"]
    assert len(served.repo.requests) == before                               # never reached the models
    good_infer(served, hc)                                                   # and the server keeps serving


def _grpc_infer(served, req, who="ops"):
    with grpc.insecure_channel(served.srv.grpc_url) as ch:
        return wire.GRPCInferenceServiceStub(ch).ModelInfer(req, metadata=tuple(H(who).items()), timeout=60)


def _raw_req(model="add_sub", inputs=(("INPUT0", "FP32", (1, 4)), ("INPUT1", "FP32", (1, 4))), raws=None):
    req = wire.inference.ModelInferRequest(model_name=model)
    for name, dt, shape in inputs:
        req.inputs.add(name=name, datatype=dt, shape=list(shape))
    req.raw_input_contents.extend(raws if raws is not None else [_f32(4)] * len(inputs))
    return req


def _contents(req, field: str, values) -> wire.inference.ModelInferRequest:
    del req.raw_input_contents[:]
    getattr(req.inputs[0].contents, field).extend(values)
    return req


def _bad_grpc_cases():
    """(case, request, gRPC status, what the error says)"""
    S = grpc.StatusCode
    fixed = lambda dt="INT32": _raw_req("fixed", (("IN", dt, (2, 3)),))                         # noqa: E731
    return [
        ("raw count", _raw_req(raws=[_f32(4)]), S.INVALID_ARGUMENT, "raw_input_contents has 1 entries for 2"),
        ("raw size", _raw_req(raws=[_f32(4), _f32(3)]), S.INVALID_ARGUMENT, "is 16 bytes"),
        ("wrong datatype", _raw_req(inputs=(("INPUT0", "FP64", (1, 4)), ("INPUT1", "FP32", (1, 4)))),
         S.INVALID_ARGUMENT, "datatype FP64"),
        ("batch over max", _raw_req(inputs=(("INPUT0", "FP32", (9, 4)), ("INPUT1", "FP32", (9, 4))),
                                    raws=[_f32(36)] * 2), S.INVALID_ARGUMENT, "1 to 8 rows"),
        ("unknown input", _raw_req(inputs=(("INPUT0", "FP32", (1, 4)), ("X", "FP32", (1, 4)))),
         S.INVALID_ARGUMENT, "has no input 'X'"),
        ("contents in the wrong field", _contents(fixed(), "fp32_contents", [1.0] * 6), S.INVALID_ARGUMENT,
         "contents.int_contents"),
        ("contents count", _contents(fixed(), "int_contents", [1] * 5), S.INVALID_ARGUMENT, "the contents have 5"),
        ("INT8 out of range", _contents(_raw_req("echo_int8", (("IN", "INT8", (1, 1)),)), "int_contents", [128]),
         S.INVALID_ARGUMENT, "out of the range"),
        ("FP16 contents", _contents(_raw_req("echo_fp16", (("IN", "FP16", (1, 1)),)), "fp32_contents", [1.0]),
         S.INVALID_ARGUMENT, "raw_input_contents only"),
        ("unknown model", _raw_req("nope"), S.NOT_FOUND, "nope"),
    ]


def test_bad_grpc_requests_are_refused_before_any_work(served, gc):
    before = len(served.repo.requests)
    for case, req, code, says in _bad_grpc_cases():
        with pytest.raises(grpc.RpcError) as e:
            _grpc_infer(served, req)
        assert (e.value.code(), says in e.value.details()) == (code, True), (case, e.value.details())
    a, b = rows(2, 3)
    wrong = add_sub_inputs(tg, a, b)                                          # the official client, refused too
    with pytest.raises(InferenceServerException) as e:
        gc.infer("add_sub", wrong, outputs=[tg.InferRequestedOutput("OUTPUT0", class_count=2)], headers=H())
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "classification" in e.value.message()
    assert len(served.repo.requests) == before
    res = gc.infer("add_sub", add_sub_inputs(tg, a, b), headers=H())          # still serving
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)


# ---------------------------------------------------------------------------------------------- tenants, repository
def _status(call) -> str:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value.status()


def test_tenants_see_their_own_models_and_need_admin_keys_for_control(served, hc, gc):
    a, b = rows(1, 4)
    res = gc.infer("add_sub", add_sub_inputs(tg, a, b), headers=H("limited"))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    fixed = th.InferInput("IN", [2, 3], "INT32")
    fixed.set_data_from_numpy(np.ones((2, 3), np.int32))
    assert _status(lambda: hc.infer("fixed", [fixed], headers=H("limited"))) == "404"
    assert _status(lambda: hc.get_model_metadata("fixed", headers=H("limited"))) == "404"
    assert _status(lambda: gc.get_model_config("fixed", headers=H("limited"))) == "StatusCode.NOT_FOUND"
    assert not hc.is_model_ready("fixed", headers=H("limited"))
    assert [m["name"] for m in hc.get_model_repository_index(headers=H("limited"))] == ["add_sub"]
    assert [m.name for m in gc.get_model_repository_index(headers=H("limited")).models] == ["add_sub"]
    for who in ("limited", "user"):
        assert _status(lambda: hc.get_inference_statistics("add_sub", headers=H(who))) == "403"
        assert _status(lambda: gc.get_inference_statistics(headers=H(who))) == "StatusCode.PERMISSION_DENIED"
        assert _status(lambda: hc.load_model("cold", headers=H(who))) == "403"
        assert _status(lambda: gc.unload_model("add_sub", headers=H(who))) == "StatusCode.PERMISSION_DENIED"
    assert hc.is_model_ready("add_sub", headers=H("user"))


def _cold_input(mod, n: int = 2):
    x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    i = mod.InferInput("IN", [n, 2], "FP32")
    i.set_data_from_numpy(x)
    return x, [i]


def test_repository_load_and_unload_on_both_transports(served, hc, gc):
    state = lambda: {m["name"]: m["state"] for m in hc.get_model_repository_index(headers=H())}   # noqa: E731
    assert state()["cold"] == "UNAVAILABLE"
    assert not hc.is_model_ready("cold", headers=H()) and not gc.is_model_ready("cold", headers=H())
    x, ins = _cold_input(th)
    assert _status(lambda: hc.infer("cold", ins, headers=H())) == "503"
    assert _status(lambda: hc.load_model("cold", headers=H(), config='{"max_batch_size": 2}')) == "400"
    hc.load_model("cold", headers=H())
    assert hc.is_model_ready("cold", headers=H()) and state()["cold"] == "READY"
    np.testing.assert_array_equal(hc.infer("cold", ins, headers=H()).as_numpy("OUT"), -x)
    gc.unload_model("cold", headers=H())
    assert not gc.is_model_ready("cold", "1", headers=H())
    x, gins = _cold_input(tg)
    assert _status(lambda: gc.infer("cold", gins, headers=H())) == "StatusCode.UNAVAILABLE"
    gc.load_model("cold", headers=H())
    np.testing.assert_array_equal(gc.infer("cold", gins, headers=H()).as_numpy("OUT"), -x)
    hc.unload_model("cold", headers=H())
    assert state()["cold"] == "UNAVAILABLE"
    assert [m.name for m in gc.get_model_repository_index(headers=H()).models if m.state == "READY"] == \
        [m["name"] for m in hc.get_model_repository_index(headers=H()) if m["state"] == "READY"]


def test_statistics_in_tritons_shape_on_both_transports(served, hc, gc):
    def counts():
        h = hc.get_inference_statistics("echo_fp64", headers=H())["model_stats"][0]
        g = gc.get_inference_statistics("echo_fp64", headers=H(), as_json=True)["model_stats"][0]
        assert (int(g.get("inference_count", 0)), int(g.get("execution_count", 0))) == \
            (h["inference_count"], h["execution_count"])                  # (protobuf JSON leaves zeros out)
        return h["inference_count"], h["execution_count"], h["inference_stats"]["success"]["count"]
    before = counts()
    i = th.InferInput("IN", [3, 1], "FP64")
    i.set_data_from_numpy(np.ones((3, 1)))
    hc.infer("echo_fp64", [i], headers=H())
    hc.infer("echo_fp64", [i], headers=H())
    assert counts() == (before[0] + 6, before[1] + 2, before[2] + 2)
    every = {s["name"] for s in hc.get_inference_statistics(headers=H())["model_stats"]}
    assert {"add_sub", "echo_fp64", "cold"} <= every


def test_quota_charges_one_token_per_row(served, hc, gc):
    a, b = rows(8, 5)
    hc.infer("add_sub", add_sub_inputs(th, a, b), headers=H("metered"))        # 8 rows: the whole minute
    a1, b1 = rows(1, 6)
    assert _status(lambda: hc.infer("add_sub", add_sub_inputs(th, a1, b1), headers=H("metered"))) == "429"
    assert _status(lambda: gc.infer("add_sub", add_sub_inputs(tg, a1, b1), headers=H("metered"))) == \
        "StatusCode.RESOURCE_EXHAUSTED"
    served.clock.t += 61                                                      # a minute later
    res = gc.infer("add_sub", add_sub_inputs(tg, a1, b1), headers=H("metered"))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a1 - b1)


# ---------------------------------------------------------------------------------------------- clients that go away
def _gated_body() -> bytes:
    return json.dumps({"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}).encode()


def _open_gated_request(served) -> http.client.HTTPConnection:
    c = http.client.HTTPConnection(served.srv.host, served.srv.port, timeout=60)
    c.request("POST", "/v2/models/gated/infer", _gated_body(), {**H(), "Content-Type": "application/json"})
    return c


def test_a_client_that_goes_away_cancels_its_request(served, hc, gc):
    repo, quotas = served.repo, served.svc.quotas
    n0, cancelled0 = len(repo.requests), repo.cancelled
    repo.gate.opened.clear()
    running = _open_gated_request(served)                         # runs, held at the gate
    assert repo.gate.wait_started()
    queued = _open_gated_request(served)                          # waits behind it
    assert repo.wait_for(lambda r: len(r.requests) == n0 + 2)
    queued.close()                                                # HTTP client gone: dropped before it ran
    assert repo.wait_for(lambda r: r.cancelled == cancelled0 + 1)
    x = np.ones((1, 1), np.float32)
    g = tg.InferInput("IN", [1, 1], "FP32")
    g.set_data_from_numpy(x)
    call = gc.async_infer("gated", [g], callback=lambda result, error: None, headers=H())
    assert repo.wait_for(lambda r: len(r.requests) == n0 + 3)
    call.cancel()                                                 # gRPC call cancelled: dropped too
    assert repo.wait_for(lambda r: r.cancelled == cancelled0 + 2)
    running.close()                                               # gone while running: its slot freed at once
    assert quotas.wait_until("ops", lambda u: u["in_flight"] == 0, 30)
    repo.gate.opened.set()                                        # the batch ends; its charge is settled
    assert quotas.wait_until("ops", lambda u: u["unsettled"] == 0, 30)
    assert repo.models["gated"].calls == 1                        # the two that went away never ran
    res = hc.infer("gated", [th.InferInput("IN", [1, 1], "FP32").set_data_from_numpy(x)], headers=H())
    np.testing.assert_array_equal(res.as_numpy("OUT"), x)


def _tenant_requests(served, status: str, tenant: str = "ops") -> float:
    """``vnpu:tenant_requests_total`` of ``tenant`` with ``status``, from ``/metrics``."""
    _, _, body = raw(served, "/metrics")
    head = f'vnpu:tenant_requests_total{{status="{status}",tenant="{tenant}"}} '
    return next((float(ln[len(head):]) for ln in body.decode().splitlines() if ln.startswith(head)), 0.0)


def test_grpc_calls_past_their_deadline_walk_away_from_their_requests(served, gc):
    """On the thread-pool gRPC server a call whose deadline passes (the client's timeout) ends its request as a
    cancelled one does: dropped while queued, its tenant slot freed at once while running (charged once it
    ran), counted as 499; the workers go on serving."""
    repo, quotas = served.repo, served.svc.quotas
    n0, cancelled0, calls0 = len(repo.requests), repo.cancelled, repo.models["gated"].calls
    gone0 = _tenant_requests(served, "499")
    x = np.ones((1, 1), np.float32)
    g = tg.InferInput("IN", [1, 1], "FP32")
    g.set_data_from_numpy(x)
    repo.gate.opened.clear()
    ended: Future = Future()
    gc.async_infer("gated", [g], callback=lambda result, error: ended.set_result(error), headers=H(),
                   client_timeout=1.0)                            # runs, held at the gate past its deadline
    assert repo.gate.wait_started()
    with pytest.raises(InferenceServerException) as e:
        gc.infer("gated", [g], headers=H(), client_timeout=1.0)   # queued behind it until its deadline
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert repo.wait_for(lambda r: r.cancelled == cancelled0 + 1 and len(r.requests) == n0 + 2)
    err = ended.result(60)
    assert err is not None and err.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert quotas.wait_until("ops", lambda u: u["in_flight"] == 0, 30)   # freed while the batch still runs
    assert not repo.gate.opened.is_set()
    repo.gate.opened.set()
    assert quotas.wait_until("ops", lambda u: u["unsettled"] == 0, 30)
    assert repo.models["gated"].calls == calls0 + 1                 # the queued one never ran
    # both counted 499: by each call's handler thread once its wait ends (after the slot was freed, so polled)
    assert wait_polled(threading.Condition(), lambda: _tenant_requests(served, "499") == gone0 + 2, 30), \
        _tenant_requests(served, "499")
    res = gc.infer("gated", [g], headers=H(), client_timeout=60)
    np.testing.assert_array_equal(res.as_numpy("OUT"), x)
