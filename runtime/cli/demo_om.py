"""The compiled-model part of ``vnpu demo``: MiniLM-L3's ONNX (from the model wheel) compiled by ``vnpu atc``
into an ``.om`` with dynamic batch gears, served beside the LLM by the same server over the Open Inference
Protocol, and asked by the official ``tritonclient`` over REST and gRPC.

Blocking: :func:`compile_minilm` runs ``vnpu atc`` in a subprocess; :func:`ask_triton` sends its requests
one after another and waits for each."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np

SEQ = 16                                             #: tokens per sentence the .om is compiled for
GEARS = "1,2,4"


def compile_minilm(out_dir: str | Path) -> Path:
    """``vnpu atc`` of MiniLM-L3 into ``out_dir/minilm-l3.om`` (RuntimeError with atc's last line if it
    fails)."""
    from runtime.models.weights import minilm_l3_onnx
    out = Path(out_dir) / "minilm-l3"
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "atc", f"--model={minilm_l3_onnx()}", "--framework=5",
                        f"--output={out}", f"--input_shape=input_ids:-1,{SEQ};attention_mask:-1,{SEQ}",
                        f"--dynamic_batch_size={GEARS}"], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"vnpu atc failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return out.with_suffix(".om")


def _tokens(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from runtime.models.tokenizer import bert_tokenizer
    ids, mask = bert_tokenizer(SEQ).encode_batch(texts)
    pad = SEQ - ids.shape[1]
    return np.pad(ids, ((0, 0), (0, pad))), np.pad(mask, ((0, 0), (0, pad)))


def _infer(mod, client, texts: list[str]):
    ids, mask = _tokens(texts)
    ins = [mod.InferInput("input_ids", list(ids.shape), "INT64"), mod.InferInput("attention_mask", list(ids.shape), "INT64")]
    ins[0].set_data_from_numpy(ids)
    ins[1].set_data_from_numpy(mask)
    return client.infer("minilm-l3", ins)


def ask_triton(srv, sentences: list[str], out=sys.stdout) -> bool:
    """A few requests to the compiled model on ``srv`` (REST and gRPC); their sentence embeddings, the
    same sentence's from both agreeing, and the model's Triton metrics.  True when all went well."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    hc, gc = th.InferenceServerClient(srv.url.removeprefix("http://")), tg.InferenceServerClient(srv.grpc_url)
    try:
        name = hc.get_model_metadata("minilm-l3")["outputs"][-1]["name"]      # the pooled [batch, 384] output
        r1 = _infer(th, hc, sentences[:3])
        r2 = _infer(tg, gc, sentences[1:3])
    finally:
        hc.close()
        gc.close()
    a, b = r1.as_numpy(name), r2.as_numpy(name)
    same = bool(np.allclose(a[1:], b, rtol=0, atol=1e-4))
    u = a / np.linalg.norm(a, axis=1, keepdims=True)
    print(f"  compiled MiniLM-L3 (.om by vnpu atc, gears {GEARS}) over the Open Inference Protocol: REST batch 3 "
          f"-> {list(a.shape)}, gRPC batch 2 -> {list(b.shape)}, the same rows agree: {same}; cosine(s0, s1) = "
          f"{u[0] @ u[1]:.3f}, cosine(s0, s2) = {u[0] @ u[2]:.3f}", file=out)
    metrics = urllib.request.urlopen(srv.url + "/metrics", timeout=60).read().decode().splitlines()
    for ln in metrics:
        if ln.startswith(("nv_inference_request_success{", "nv_inference_exec_count{", "nv_inference_count{")):
            print(f"    {ln}", file=out)
    return same and a.shape == (3, 384) and b.shape == (2, 384)


__all__ = ["GEARS", "SEQ", "ask_triton", "compile_minilm"]
