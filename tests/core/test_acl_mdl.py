"""acl.mdl, acl data buffers / tensor descriptions and acl.app_log: offline models through the pyACL API.

- tests/samples/acl_model_sample.py, a program in the style of the public pyACL samples' model wrapper,
  runs in a subprocess with ONLY its ``import acl`` line changed, on MiniLM-L3 (an .om made by
  ``vnpu atc``) and on a CNN built with onnx.helper (loaded from host memory), at several dynamic batch
  sizes; its outputs match onnxruntime on the same ONNX files.
- In-process (a 2-device local runtime): the model description, execute / execute_async on streams,
  every misuse with its ACL/GE code (each followed by a correct execution checked against onnxruntime:
  the device keeps working), models released with their context and at finalize, the data-buffer and
  tensor-description calls, app_log.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from acl_checks import acl_session, ok
from conftest import installed, make_local_runtime
from onnx_models import assert_close, cnn, images, ort_run
from runtime import acl
from runtime.atc import DYNAMIC_INPUT_NAME, compile_model, make_options
from runtime.models.weights import minilm_l3_onnx
from test_atc import atc_header, token_inputs

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "samples" / "acl_model_sample.py"
CNN_K, CNN_DEPTH = 72, 4                       # longest reduction (3x3x8) and chained reductions of the CNN
MINILM_K, MINILM_DEPTH = 1536, 3
GEARS = (1, 2, 4)
SEQ = 16


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def cnn_model():
    return cnn(seed=11)


@pytest.fixture(scope="module")
def cnn_om(cnn_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("cnn") / "cnn.om"
    compile_model(cnn_model, make_options("x:-1,3,16,16", ",".join(map(str, GEARS)))).save(path)
    return path


@pytest.fixture(scope="module")
def minilm_om(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm") / "minilm"
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "atc", f"--model={minilm_l3_onnx()}", "--framework=5",
                        f"--output={out}", f"--input_shape=input_ids:-1,{SEQ};attention_mask:-1,{SEQ}",
                        "--dynamic_batch_size=1,2,4", "--soc_version=Ascend910B3"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return Path(f"{out}.om")


@pytest.fixture(scope="module")
def rt():
    with installed(make_local_runtime(count=2, arena=64 << 20)) as r:
        yield r


@pytest.fixture
def ctx(rt):
    """acl initialized on the module's runtime, device 0 set; finalized after (whatever the test did)."""
    with acl_session():
        c, ret = acl.rt.get_context()
        assert ret == 0
        yield c


# ---------------------------------------------------------------------------------------------- the sample
def run_sample(tmp_path, om: Path, feeds: dict, batches, load="file") -> tuple[dict, str]:
    """Run the sample with its ``import acl`` line (and nothing else) changed; -> (outputs, stdout)."""
    text = SAMPLE.read_text()
    lines = text.splitlines()
    assert lines.count("import acl") == 1 and "runtime" not in text
    patched = text.replace("\nimport acl\n", "\nfrom runtime import acl\n")
    changed = [(a, b) for a, b in zip(lines, patched.splitlines()) if a != b]
    assert changed == [("import acl", "from runtime import acl")]
    script = tmp_path / "acl_model_sample.py"
    script.write_text(patched)
    np.savez(tmp_path / "in.npz", **feeds)
    env = dict(os.environ, VNPU_DEVICES="1", VNPU_HBM_BYTES=str(256 << 20), OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=str(ROOT), ASCEND_SLOG_PRINT_TO_STDOUT="1", ASCEND_GLOBAL_LOG_LEVEL="1")
    env.pop("VNPU_BACKEND", None)
    p = subprocess.run([sys.executable, str(script), f"--model={om}", f"--inputs={tmp_path / 'in.npz'}",
                        f"--batches={','.join(map(str, batches))}", f"--output={tmp_path / 'out.npz'}",
                        f"--load={load}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as f:
        return {k: f[k] for k in f.files}, p.stdout


def test_sample_program_runs_minilm_from_vnpu_atc(tmp_path, minilm_om):
    onnx_path = str(minilm_l3_onnx())
    ids, mask = token_inputs(max(GEARS), SEQ, seed=3)
    batches = (2, 1, 4, 2)
    outs, stdout = run_sample(tmp_path, minilm_om, {"input_ids": ids, "attention_mask": mask}, batches)
    assert "run_mode 1 done" in stdout                       # ACL_HOST, read before acl.init
    assert "[INFO] APP(" in stdout and "dynamic batch gears [1, 2, 4]" in stdout      # acl.app_log lines
    for b in batches:
        ref = ort_run(onnx_path, {"input_ids": ids[:b], "attention_mask": mask[:b]})
        np.testing.assert_array_equal(outs[f"{b}/0"], ref[0])
        np.testing.assert_array_equal(outs[f"{b}/1"], ref[1])
        assert outs[f"{b}/2"].shape == (b, SEQ, 384)
        assert_close(outs[f"{b}/2"], ref[2], k=MINILM_K, depth=MINILM_DEPTH, what=f"token embeddings, batch {b}")
        assert_close(outs[f"{b}/3"], ref[3], k=MINILM_K, depth=MINILM_DEPTH, what=f"sentence embeddings, batch {b}")


def test_sample_program_runs_a_cnn_loaded_from_memory(tmp_path, cnn_model, cnn_om):
    x = images(max(GEARS), seed=21)
    batches = (4, 1, 2)
    outs, stdout = run_sample(tmp_path, cnn_om, {"x": x}, batches, load="mem")
    for b in batches:
        assert outs[f"{b}/0"].shape == (b, 10)
        assert_close(outs[f"{b}/0"], ort_run(cnn_model, {"x": x[:b]})[0], k=CNN_K, depth=CNN_DEPTH, what=f"batch {b}")


# ---------------------------------------------------------------------------------------------- in-process
class CnnIO:
    """The CNN's device buffers (largest gear) and one dataset per side, built the samples' way."""

    def __init__(self, model_id, desc):
        self.model_id, self.desc = model_id, desc
        self.in_size = acl.mdl.get_input_size_by_index(desc, 0)
        self.out_size = acl.mdl.get_output_size_by_index(desc, 0)
        self.x = ok(acl.rt.malloc(self.in_size))
        self.mb = ok(acl.rt.malloc(acl.mdl.get_input_size_by_index(desc, 1)))
        self.y = ok(acl.rt.malloc(self.out_size))
        self.bufs_in = [acl.create_data_buffer(self.x, self.in_size), acl.create_data_buffer(self.mb, 8)]
        self.bufs_out = [acl.create_data_buffer(self.y, self.out_size)]
        self.ins, self.outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
        for ds, bufs in ((self.ins, self.bufs_in), (self.outs, self.bufs_out)):
            for b in bufs:
                assert ok(acl.mdl.add_dataset_buffer(ds, b)) == ds

    def put(self, x, batch):
        ok(acl.rt.memcpy(self.x, self.in_size, acl.util.numpy_to_ptr(x), x.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE))
        ok(acl.mdl.set_dynamic_batch_size(self.model_id, self.ins, 1, batch))

    def get(self, batch):
        out = np.zeros((batch, 10), np.float32)
        ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, self.y, out.nbytes, acl.ACL_MEMCPY_DEVICE_TO_HOST))
        return out


def load_cnn(om):
    mid = ok(acl.mdl.load_from_file(str(om)))
    desc = acl.mdl.create_desc()
    ok(acl.mdl.get_desc(desc, mid))
    return mid, desc


def test_model_description(ctx, cnn_om):
    mid, desc = load_cnn(cnn_om)
    assert acl.mdl.get_num_inputs(desc) == 2 and acl.mdl.get_num_outputs(desc) == 1
    assert ok(acl.mdl.get_input_dims(desc, 0)) == {"name": "x", "dimCount": 4, "dims": [-1, 3, 16, 16]}
    assert ok(acl.mdl.get_input_dims(desc, 1))["name"] == DYNAMIC_INPUT_NAME == acl.ACL_DYNAMIC_TENSOR_NAME
    assert ok(acl.mdl.get_output_dims(desc, 0)) == {"name": "probs", "dimCount": 2, "dims": [4, 10]}
    assert acl.mdl.get_input_size_by_index(desc, 0) == 4 * 3 * 16 * 16 * 4
    assert acl.mdl.get_input_size_by_index(desc, 1) == 8 and acl.mdl.get_output_size_by_index(desc, 0) == 4 * 10 * 4
    assert acl.mdl.get_input_data_type(desc, 0) == acl.ACL_FLOAT
    assert acl.mdl.get_input_data_type(desc, 1) == acl.ACL_UINT64
    assert acl.mdl.get_input_format(desc, 0) == acl.ACL_FORMAT_NCHW
    assert acl.mdl.get_output_format(desc, 0) == acl.ACL_FORMAT_ND
    assert acl.mdl.get_input_name_by_index(desc, 0) == "x" and acl.mdl.get_output_name_by_index(desc, 0) == "probs"
    assert acl.mdl.get_input_index_by_name(desc, DYNAMIC_INPUT_NAME) == (1, 0)
    assert acl.mdl.get_output_index_by_name(desc, "probs") == (0, 0)
    assert ok(acl.mdl.get_dynamic_batch(desc)) == {"batchCount": 3, "batch": [1, 2, 4]}
    assert ok(acl.mdl.get_dynamic_hw(desc, -1)) == {"hwCount": 0, "hw": []}
    # out of range / absent: C's failure values, or 100000
    assert (acl.mdl.get_input_size_by_index(desc, 2), acl.mdl.get_input_data_type(desc, 5),
            acl.mdl.get_output_format(desc, 1), acl.mdl.get_output_name_by_index(desc, 3)) == \
        (0, acl.ACL_DT_UNDEFINED, acl.ACL_FORMAT_UNDEFINED, "")
    assert "out of range" in acl.get_recent_err_msg()
    assert acl.mdl.get_input_dims(desc, 2)[1] == acl.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.get_input_index_by_name(desc, "nope")[1] == acl.ACL_ERROR_INVALID_PARAM
    # the current output dims follow the gear set
    io = CnnIO(mid, desc)
    assert ok(acl.mdl.get_cur_output_dims(desc, 0))["dims"] == [4, 10]
    ok(acl.mdl.set_dynamic_batch_size(mid, io.ins, 1, 2))
    assert ok(acl.mdl.get_cur_output_dims(desc, 0)) == {"name": "probs", "dimCount": 2, "dims": [2, 10]}
    # an empty description, a static model
    empty = acl.mdl.create_desc()
    assert acl.mdl.get_num_inputs(empty) == 0 and "get_desc" in acl.get_recent_err_msg()
    static = compile_model(cnn(seed=1, batch=3), make_options()).to_bytes()
    sid = ok(acl.mdl.load_from_mem(acl.util.bytes_to_ptr(static), len(static)))
    ok(acl.mdl.get_desc(empty, sid))
    assert ok(acl.mdl.get_dynamic_batch(empty)) == {"batchCount": 0, "batch": []}
    assert acl.mdl.get_input_index_by_name(empty, DYNAMIC_INPUT_NAME)[1] == acl.ACL_ERROR_INVALID_PARAM
    assert ok(acl.mdl.get_cur_output_dims(empty, 0))["dims"] == [3, 10]
    # a description outlives its model, but the current dims need the model
    ok(acl.mdl.unload(mid))
    assert ok(acl.mdl.get_input_dims(desc, 0))["dims"] == [-1, 3, 16, 16]
    assert acl.mdl.get_cur_output_dims(desc, 0)[1] == acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    for d in (desc, empty):
        ok(acl.mdl.destroy_desc(d))
    ok(acl.mdl.unload(sid))


def test_execute_and_execute_async_match_onnxruntime(ctx, cnn_model, cnn_om):
    mid, desc = load_cnn(cnn_om)
    a, b = CnnIO(mid, desc), CnnIO(mid, desc)
    s1, s2 = ok(acl.rt.create_stream()), ok(acl.rt.create_stream())
    for batch in (4, 1, 2):
        x = images(batch, seed=batch)
        a.put(x, batch)
        ok(acl.mdl.execute(mid, a.ins, a.outs))
        assert_close(a.get(batch), ort_run(cnn_model, {"x": x})[0], k=CNN_K, depth=CNN_DEPTH, what=f"batch {batch}")
    # two streams at two gears, queued back to back; the model orders them on its workspace
    xa, xb = images(2, seed=7), images(4, seed=8)
    a.put(xa, 2)
    b.put(xb, 4)
    for _ in range(2):
        ok(acl.mdl.execute_async(mid, a.ins, a.outs, s1))
        ok(acl.mdl.execute_async(mid, b.ins, b.outs, s2))
    ok(acl.rt.synchronize_stream(s1))
    ok(acl.rt.synchronize_stream(s2))
    assert_close(a.get(2), ort_run(cnn_model, {"x": xa})[0], k=CNN_K, depth=CNN_DEPTH)
    assert_close(b.get(4), ort_run(cnn_model, {"x": xb})[0], k=CNN_K, depth=CNN_DEPTH)
    ok(acl.mdl.execute_async(mid, a.ins, a.outs, 0))                  # the default stream
    ok(acl.rt.synchronize_stream(0))


def test_every_misuse_returns_its_code_and_the_device_keeps_working(ctx, rt, cnn_model, cnn_om, tmp_path):
    mid, desc = load_cnn(cnn_om)
    io = CnnIO(mid, desc)
    x = images(2, seed=5)
    ref = ort_run(cnn_model, {"x": x})[0]
    small = ok(acl.rt.malloc(64))
    host = np.zeros(io.in_size, np.uint8)
    f64 = acl.create_tensor_desc(acl.ACL_DOUBLE, [2, 3, 16, 8], acl.ACL_FORMAT_NCHW)

    def dataset(*bufs):
        ds = acl.mdl.create_dataset()
        for b in bufs:
            ok(acl.mdl.add_dataset_buffer(ds, b))
        return ds

    x_buf, mb_buf, y_buf = io.bufs_in[0], io.bufs_in[1], io.bufs_out[0]
    small_in = dataset(acl.create_data_buffer(small, 64), mb_buf)
    small_out = dataset(acl.create_data_buffer(small, 64))
    host_in = dataset(acl.create_data_buffer(acl.util.numpy_to_ptr(host), host.nbytes), mb_buf)
    null_in = dataset(acl.create_data_buffer(0, io.in_size), mb_buf)
    typed_in = dataset(x_buf, mb_buf)
    ok(acl.mdl.set_dataset_tensor_desc(typed_in, f64, 0))
    one_in = dataset(x_buf)
    two_out = dataset(y_buf, y_buf)
    gone_ds = dataset(x_buf, mb_buf)
    ok(acl.mdl.destroy_dataset(gone_ds))
    gone_buf = acl.create_data_buffer(io.x, io.in_size)
    stale_in = dataset(gone_buf, mb_buf)
    ok(acl.destroy_data_buffer(gone_buf))
    short_mb = dataset(x_buf, acl.create_data_buffer(io.mb, 2))
    null_mb = dataset(x_buf, acl.create_data_buffer(0, 8))
    gone_desc = acl.mdl.create_desc()
    ok(acl.mdl.destroy_desc(gone_desc))
    unloaded = ok(acl.mdl.load_from_file(str(cnn_om)))
    ok(acl.mdl.unload(unloaded))
    ok(acl.rt.create_context(1))                         # a stream of device 1, and a context there
    ctx1 = ok(acl.rt.get_context())
    s_dev1 = ok(acl.rt.create_stream())
    ok(acl.rt.set_context(ctx))
    freed_host, _ = acl.rt.malloc_host(256)
    ok(acl.rt.free_host(freed_host))
    atc_file = tmp_path / "huawei.om"
    atc_file.write_bytes(atc_header())
    om_bytes = cnn_om.read_bytes()

    def in_ctx1(fn):
        def call():
            ok(acl.rt.set_context(ctx1))
            try:
                return fn()
            finally:
                ok(acl.rt.set_context(ctx))
        return call

    cases = {
        # buffer counts and sizes (GE's / acl's checks)
        "too few inputs": (lambda: acl.mdl.execute(mid, one_in, io.outs), acl.ACL_ERROR_MODEL_INPUT_NOT_MATCH),
        "too many outputs": (lambda: acl.mdl.execute(mid, io.ins, two_out), acl.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH),
        "input buffer too small": (lambda: acl.mdl.execute(mid, small_in, io.outs), acl.ACL_ERROR_GE_PARAM_INVALID),
        "output buffer too small": (lambda: acl.mdl.execute(mid, io.ins, small_out), acl.ACL_ERROR_GE_PARAM_INVALID),
        "wrong dtype (tensor desc)": (lambda: acl.mdl.execute(mid, typed_in, io.outs),
                                      acl.ACL_ERROR_GE_DATATYPE_INVALID),
        "host memory as an input": (lambda: acl.mdl.execute(mid, host_in, io.outs), acl.ACL_ERROR_INVALID_PARAM),
        "null input buffer": (lambda: acl.mdl.execute(mid, null_in, io.outs), acl.ACL_ERROR_INVALID_PARAM),
        # destroyed / unknown handles
        "destroyed dataset": (lambda: acl.mdl.execute(mid, gone_ds, io.outs), acl.ACL_ERROR_INVALID_PARAM),
        "destroyed data buffer in a dataset": (lambda: acl.mdl.execute(mid, stale_in, io.outs),
                                               acl.ACL_ERROR_INVALID_PARAM),
        "dataset handle 12345": (lambda: acl.mdl.execute(mid, 12345, io.outs), acl.ACL_ERROR_INVALID_PARAM),
        "destroyed desc": (lambda: acl.mdl.get_desc(gone_desc, mid), acl.ACL_ERROR_INVALID_PARAM),
        "destroyed desc dims": (lambda: acl.mdl.get_input_dims(gone_desc, 0)[1], acl.ACL_ERROR_INVALID_PARAM),
        "destroy a destroyed dataset": (lambda: acl.mdl.destroy_dataset(gone_ds), acl.ACL_ERROR_INVALID_PARAM),
        "destroy a destroyed buffer": (lambda: acl.destroy_data_buffer(gone_buf), acl.ACL_ERROR_INVALID_PARAM),
        "add a destroyed buffer": (lambda: acl.mdl.add_dataset_buffer(one_in, gone_buf)[1],
                                   acl.ACL_ERROR_INVALID_PARAM),
        # unloaded / unknown model ids (GE)
        "execute an unloaded model": (lambda: acl.mdl.execute(unloaded, io.ins, io.outs),
                                      acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID),
        "unload twice": (lambda: acl.mdl.unload(unloaded), acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID),
        "get_desc of an unloaded model": (lambda: acl.mdl.get_desc(desc, unloaded),
                                          acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID),
        "batch on an unloaded model": (lambda: acl.mdl.set_dynamic_batch_size(unloaded, io.ins, 1, 2),
                                       acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID),
        # dynamic batch
        "batch not a gear": (lambda: acl.mdl.set_dynamic_batch_size(mid, io.ins, 1, 3),
                             acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID),
        "batch 0": (lambda: acl.mdl.set_dynamic_batch_size(mid, io.ins, 1, 0), acl.ACL_ERROR_INVALID_PARAM),
        "batch index out of range": (lambda: acl.mdl.set_dynamic_batch_size(mid, io.ins, 5, 2),
                                     acl.ACL_ERROR_INVALID_PARAM),
        "batch into the image input": (lambda: acl.mdl.set_dynamic_batch_size(mid, io.ins, 0, 2),
                                       acl.ACL_ERROR_INVALID_PARAM),
        "batch into a null buffer": (lambda: acl.mdl.set_dynamic_batch_size(mid, null_mb, 1, 2),
                                     acl.ACL_ERROR_INVALID_PARAM),
        "batch into a 2-byte buffer": (lambda: acl.mdl.set_dynamic_batch_size(mid, short_mb, 1, 2),
                                       acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID),
        "execute with a 2-byte batch buffer": (lambda: acl.mdl.execute(mid, short_mb, io.outs),
                                               acl.ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID),
        # streams of another device
        "execute_async on device 1's stream": (lambda: acl.mdl.execute_async(mid, io.ins, io.outs, s_dev1),
                                               acl.ACL_ERROR_RT_STREAM_CONTEXT),
        "execute_async from device 1's context": (in_ctx1(lambda: acl.mdl.execute_async(mid, io.ins, io.outs, s_dev1)),
                                                  acl.ACL_ERROR_RT_STREAM_CONTEXT),
        "execute from device 1's context": (in_ctx1(lambda: acl.mdl.execute(mid, io.ins, io.outs)),
                                            acl.ACL_ERROR_RT_STREAM_CONTEXT),
        # loading
        "missing file": (lambda: acl.mdl.load_from_file(str(tmp_path / "no.om"))[1],
                         acl.ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID),
        "an .om of Huawei's ATC": (lambda: acl.mdl.load_from_file(str(atc_file))[1], acl.ACL_ERROR_PARSE_MODEL),
        "load_from_mem size 0": (lambda: acl.mdl.load_from_mem(acl.util.bytes_to_ptr(om_bytes), 0)[1],
                                 acl.ACL_ERROR_INVALID_PARAM),
        "load_from_mem of freed memory": (lambda: acl.mdl.load_from_mem(freed_host, 256)[1],
                                          acl.ACL_ERROR_INVALID_PARAM),
        "load_from_mem past the buffer": (lambda: acl.mdl.load_from_mem(acl.util.bytes_to_ptr(om_bytes),
                                                                        len(om_bytes) + 64)[1],
                                          acl.ACL_ERROR_INVALID_PARAM),
        "load_from_mem of a truncated .om": (lambda: acl.mdl.load_from_mem(acl.util.bytes_to_ptr(om_bytes),
                                                                           len(om_bytes) // 2)[1],
                                             acl.ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID),
    }
    free0 = rt.device(0).mem_info()[0]
    for what, (fn, code) in cases.items():
        got = fn()
        assert got == code, f"{what}: {got} ({acl.get_recent_err_msg()})"
        assert acl.get_recent_err_msg(), what
        io.put(x, 2)                                     # still works, and the device with it
        ok(acl.mdl.execute(mid, io.ins, io.outs))
        assert_close(io.get(2), ref, k=CNN_K, depth=CNN_DEPTH, what=what)
    assert rt.device(0).mem_info()[0] == free0          # no failed load left memory behind
    assert rt.device(0).health()[0] == "OK"
    ok(acl.mdl.unload(mid))


def test_models_go_with_their_context_and_with_finalize(ctx, rt, cnn_om):
    dev = rt.device(1)
    free0 = dev.mem_info()[0]
    c1 = ok(acl.rt.create_context(1))
    mid = ok(acl.mdl.load_from_file(str(cnn_om)))
    assert dev.mem_info()[0] < free0
    ok(acl.rt.destroy_context(c1))
    assert acl.mdl.unload(mid) == acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID
    assert dev.mem_info()[0] == free0
    ok(acl.rt.set_context(ctx))
    free0 = rt.device(0).mem_info()[0]
    mid = ok(acl.mdl.load_from_file(str(cnn_om)))
    desc = acl.mdl.create_desc()
    ok(acl.mdl.get_desc(desc, mid))
    ok(acl.finalize())
    assert rt.device(0).mem_info()[0] == free0           # finalize unloaded it
    assert acl.mdl.get_num_inputs(desc) == 0             # and forgot the description
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    assert acl.mdl.execute(mid, 1, 2) == acl.ACL_ERROR_GE_EXEC_MODEL_ID_INVALID


def test_onnx_path_compiles_on_load(ctx, tmp_path, cnn_model):
    """A vnpu extension: load_from_file of an .onnx with static shapes compiles it for the device."""
    m = cnn(seed=2, batch=2)
    path = tmp_path / "cnn.onnx"
    path.write_bytes(m.SerializeToString())
    mid = ok(acl.mdl.load_from_file(str(path)))
    desc = acl.mdl.create_desc()
    ok(acl.mdl.get_desc(desc, mid))
    assert ok(acl.mdl.get_input_dims(desc, 0))["dims"] == [2, 3, 16, 16] and acl.mdl.get_num_inputs(desc) == 1
    x = images(2, seed=9)
    dx, dy = ok(acl.rt.malloc(x.nbytes)), ok(acl.rt.malloc(80))
    ok(acl.rt.memcpy(dx, x.nbytes, acl.util.numpy_to_ptr(x), x.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE))
    ins, outs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
    ok(acl.mdl.add_dataset_buffer(ins, acl.create_data_buffer(dx, x.nbytes)))
    ok(acl.mdl.add_dataset_buffer(outs, acl.create_data_buffer(dy, 80)))
    ok(acl.mdl.execute(mid, ins, outs))
    y = np.zeros((2, 10), np.float32)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(y), 80, dy, 80, acl.ACL_MEMCPY_DEVICE_TO_HOST))
    assert_close(y, ort_run(m, {"x": x})[0], k=CNN_K, depth=CNN_DEPTH)
    assert acl.mdl.set_dynamic_batch_size(mid, ins, 0, 2) == acl.ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID  # static
    ok(acl.mdl.unload(mid))


# ---------------------------------------------------------------------------------------------- acl.*
def test_data_buffers(ctx):
    b = acl.create_data_buffer(0, 0)                     # the empty buffer is allowed
    assert b and acl.get_data_buffer_addr(b) == 0 and acl.get_data_buffer_size_v2(b) == 0
    ok(acl.update_data_buffer(b, 0x1234, (5 << 32) + 7))
    assert acl.get_data_buffer_addr(b) == 0x1234
    assert acl.get_data_buffer_size_v2(b) == (5 << 32) + 7
    assert acl.get_data_buffer_size(b) == 7              # the deprecated call returns a uint32
    ok(acl.destroy_data_buffer(b))
    assert (acl.get_data_buffer_addr(b), acl.get_data_buffer_size(b), acl.get_data_buffer_size_v2(b)) == (0, 0, 0)
    assert acl.destroy_data_buffer(b) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.update_data_buffer(b, 0, 0) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.get_recent_err_msg().startswith("acl.update_data_buffer: ")
    assert acl.create_data_buffer(0, -1) == 0
    ds = acl.mdl.create_dataset()
    assert acl.mdl.get_dataset_num_buffers(ds) == 0 and acl.mdl.get_dataset_buffer(ds, 0) == 0
    b1, b2 = acl.create_data_buffer(0x10, 4), acl.create_data_buffer(0x20, 8)
    for x in (b1, b2):
        assert acl.mdl.add_dataset_buffer(ds, x) == (ds, 0)
    assert acl.mdl.get_dataset_num_buffers(ds) == 2 and acl.mdl.get_dataset_buffer(ds, 1) == b2
    td = acl.create_tensor_desc(acl.ACL_FLOAT, [2, 2], acl.ACL_FORMAT_ND)
    assert acl.mdl.get_dataset_tensor_desc(ds, 0) == 0
    ok(acl.mdl.set_dataset_tensor_desc(ds, td, 0))
    assert acl.mdl.get_dataset_tensor_desc(ds, 0) == td
    assert acl.mdl.set_dataset_tensor_desc(ds, td, 2) == acl.ACL_ERROR_INVALID_PARAM
    ok(acl.mdl.destroy_dataset(ds))
    assert acl.get_data_buffer_addr(b1) == 0x10           # destroying a dataset keeps its buffers
    assert acl.mdl.get_dataset_num_buffers(ds) == 0 and acl.mdl.destroy_dataset(ds) == acl.ACL_ERROR_INVALID_PARAM


def test_tensor_descs_and_type_sizes(ctx):
    sizes = {acl.ACL_FLOAT: 4, acl.ACL_FLOAT16: 2, acl.ACL_INT8: 1, acl.ACL_INT32: 4, acl.ACL_UINT8: 1,
             acl.ACL_INT16: 2, acl.ACL_UINT16: 2, acl.ACL_UINT32: 4, acl.ACL_INT64: 8, acl.ACL_UINT64: 8,
             acl.ACL_DOUBLE: 8, acl.ACL_BOOL: 1, acl.ACL_STRING: 0, acl.ACL_COMPLEX64: 8, acl.ACL_COMPLEX128: 16,
             acl.ACL_BF16: 2, acl.ACL_DT_UNDEFINED: 0, acl.ACL_INT4: 1, 999: 8}       # 999: C's default branch
    assert {t: acl.data_type_size(t) for t in sizes} == sizes
    d = acl.create_tensor_desc(acl.ACL_FLOAT16, [2, 3, 5], acl.ACL_FORMAT_NCL)
    assert (acl.get_tensor_desc_type(d), acl.get_tensor_desc_format(d), acl.get_tensor_desc_num_dims(d)) == \
        (acl.ACL_FLOAT16, acl.ACL_FORMAT_NCL, 3)
    assert [acl.get_tensor_desc_dim(d, i) for i in range(3)] == [2, 3, 5]
    assert acl.get_tensor_desc_dim_v2(d, 2) == (5, 0)
    assert acl.get_tensor_desc_dim_v2(d, 3)[1] == acl.ACL_ERROR_INVALID_PARAM
    assert acl.get_tensor_desc_element_count(d) == 30 and acl.get_tensor_desc_size(d) == 60
    acl.set_tensor_desc_name(d, "logits")
    assert acl.get_tensor_desc_name(d) == "logits"
    dyn = acl.create_tensor_desc(acl.ACL_FLOAT, [-1, 4], acl.ACL_FORMAT_ND)
    assert acl.get_tensor_desc_size(dyn) == 0 and acl.get_tensor_desc_dim(dyn, 0) == -1
    unk = acl.create_tensor_desc(acl.ACL_FLOAT, [-2], acl.ACL_FORMAT_ND)
    assert acl.get_tensor_desc_num_dims(unk) == acl.ACL_UNKNOWN_RANK
    assert acl.create_tensor_desc(acl.ACL_FLOAT, [-3], acl.ACL_FORMAT_ND) == 0
    assert acl.destroy_tensor_desc(d) is None
    assert (acl.get_tensor_desc_type(d), acl.get_tensor_desc_format(d), acl.get_tensor_desc_num_dims(d),
            acl.get_tensor_desc_name(d)) == (acl.ACL_DT_UNDEFINED, acl.ACL_FORMAT_UNDEFINED, 0, "")
    assert acl.destroy_tensor_desc(d) is None              # a void call: nothing to report


def test_app_log(caplog, capsys, monkeypatch):
    """app_log needs no init; every line reaches the ``vnpu.acl.app`` logger, and stdout (plog format)
    when ASCEND_SLOG_PRINT_TO_STDOUT=1 and its level reaches ASCEND_GLOBAL_LOG_LEVEL (default ERROR)."""
    caplog.set_level(logging.DEBUG, logger="vnpu.acl.app")
    for var in ("ASCEND_SLOG_PRINT_TO_STDOUT", "ASCEND_LOG_PRINT_TO_STDOUT", "ASCEND_GLOBAL_LOG_LEVEL"):
        monkeypatch.delenv(var, raising=False)
    assert acl.app_log(acl.ACL_INFO, "quiet line") is None
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("ASCEND_SLOG_PRINT_TO_STDOUT", "1")
    acl.app_log(acl.ACL_INFO, "info line")                 # below the default print level
    acl.app_log(acl.ACL_ERROR, "error line")
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"[ERROR] APP({os.getpid()},") and out[0].endswith(" error line")
    monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", "0")
    acl.app_log(acl.ACL_DEBUG, "debug line")
    assert capsys.readouterr().out.startswith("[DEBUG] APP(")
    monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", "4")    # NULL: nothing printed
    acl.app_log(acl.ACL_ERROR, "muted")
    assert capsys.readouterr().out == ""
    assert acl.app_log(7, "bad level") is None
    assert "aclLogLevel 7" in acl.get_recent_err_msg()
    recs = [(r.levelno, r.getMessage(), r.acl_level) for r in caplog.records if r.name == "vnpu.acl.app"]
    assert recs == [(logging.INFO, "quiet line", 1), (logging.INFO, "info line", 1), (logging.ERROR, "error line", 3),
                    (logging.DEBUG, "debug line", 0), (logging.ERROR, "muted", 3)]
    assert (acl.ACL_DEBUG, acl.ACL_INFO, acl.ACL_WARNING, acl.ACL_ERROR) == (0, 1, 2, 3)
