"""A model configuration that says -1 (any size) where the compiled model has a fixed size (serve tier).

Triton accepts such a config; a request of another size is then an invalid argument.  Served here it is
a 400 (HTTP) / INVALID_ARGUMENT (gRPC) naming the compiled size, refused before anything is queued -- never
a failed execution (500) -- and the model keeps serving requests of the compiled size, equal to
onnxruntime.  One real server in this process (HTTP and gRPC on free loopback ports) over a repository
of two models, driven by the official ``tritonclient``; one in-process device:

- ``dyn``: tests/onnx_models.py's CNN compiled with batch gears 1, 2 (``x:-1,3,16,16``), its config
  ``dims: [3, -1, -1]``;
- ``static``: the CNN compiled for one image (``x [1, 3, 16, 16]``), ``max_batch_size: 0`` and
  ``dims: [1, 3, -1, -1]``.
"""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from om_server import repository_server
from onnx_models import assert_close, cnn, images, ort_run
from runtime.atc import compile_model, make_options

pytestmark = pytest.mark.serve

K, DEPTH = 144, 4                              #: longest reduction (3x3x16 conv), chained reductions


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixedrepo") / "models"
    one = "instance_group: [{count: 1, devices: [0]}]\n"
    for name, model, opts, config in (
            ("dyn", cnn(seed=5), make_options("x:-1,3,16,16", "1,2"),
             "max_batch_size: 2\ninput: [{name: x, data_type: TYPE_FP32, dims: [3, -1, -1]}]\n"),
            ("static", cnn(seed=5, batch=1), None,
             "max_batch_size: 0\ninput: [{name: x, data_type: TYPE_FP32, dims: [1, 3, -1, -1]}]\n")):
        (root / name / "1").mkdir(parents=True)
        compile_model(model, opts).save(str(root / name / "1" / "model.om"))
        (root / name / "config.yaml").write_text(config + one)
    with repository_server(root) as served:
        yield served


def _infer(client, mod, name: str, x: np.ndarray):
    i = mod.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return client.infer(name, [i])


@pytest.mark.parametrize("name,good,bad,dim", [("dyn", (2, 3, 16, 16), (2, 3, 8, 16), 2),
                                               ("static", (1, 3, 16, 16), (1, 3, 16, 12), 3)])
def test_a_size_the_om_fixes_is_a_400_and_the_compiled_size_still_serves(served, name, good, bad, dim):
    srv, svc = served
    hc = th.InferenceServerClient(srv.url.removeprefix("http://"))
    gc = tg.InferenceServerClient(srv.grpc_url)
    try:
        assert hc.get_model_metadata(name)["inputs"][0]["shape"][-2:] == [-1, -1]      # the config's -1
        eng, = svc.compiled.instances(name)
        before = list(eng.executions)
        x_bad = images(bad[0], seed=1, hw=16)[..., :bad[2], :bad[3]].copy()
        with pytest.raises(InferenceServerException) as e:
            _infer(hc, th, name, x_bad)
        assert e.value.status() == "400", e.value
        assert f"dimension {dim} is fixed at 16" in e.value.message() and "[" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            _infer(gc, tg, name, x_bad)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and f"dimension {dim}" in e.value.message()
        assert list(eng.executions) == before                    # refused before any execution
        x = images(good[0], seed=2, hw=16)
        model = cnn(seed=5)
        for client, mod in ((hc, th), (gc, tg)):
            got = _infer(client, mod, name, x).as_numpy("probs")
            assert_close(got, ort_run(model, {"x": x})[0], K, DEPTH, what=f"{name} probs")
        assert len(eng.executions) == len(before) + 2
    finally:
        hc.close()
        gc.close()
