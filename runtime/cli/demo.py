"""``vnpu demo``: the main job — a local cluster of virtual NPUs running multi-device inference.

One embedded cluster (or the running one): SmolLM2-135M-Instruct generates tensor-parallel over three
devices (activations all-reduced over HCCL), MiniLM-L6 embeds sentences data-parallel over the
devices, a small MLP block per device is checked against numpy, and the device table closes the run.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from runtime.cliargs import positive_int

PROMPTS = ["What is a neural processing unit? Answer in one sentence."]
SENTENCES = ["A virtual NPU runs kernels on emulated AI Cores.",
             "Emulated accelerators execute kernels on simulated cores.",
             "The cat sleeps on a warm windowsill.",
             "HCCL all-reduce sums tensors across devices.",
             "Collective communication adds arrays from every rank.",
             "Fresh bread smells wonderful in the morning."]


def run_mlp_check(rt, batch: int = 64, d_in: int = 256, d_hidden: int = 512, d_out: int = 64) -> list[dict]:
    """Every device runs matmul -> gelu -> matmul -> softmax on its slice; checked against numpy."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, d_in), dtype=np.float32)
    w1 = rng.standard_normal((d_in, d_hidden), dtype=np.float32) / np.float32(np.sqrt(d_in))
    w2 = rng.standard_normal((d_hidden, d_out), dtype=np.float32) / np.float32(np.sqrt(d_hidden))
    devs = rt.devices()
    jobs = []
    for dev, part in zip(devs, np.array_split(x, len(devs))):
        s = dev.stream()
        tx, t1, t2 = dev.from_numpy(part), dev.from_numpy(w1), dev.from_numpy(w2)
        h = dev.empty((len(part), d_hidden))
        o = dev.empty((len(part), d_out))
        s.launch("matmul", [tx, t1], [h])
        s.launch("gelu", [h], [h], {"approximate": "tanh"})
        s.launch("matmul", [h, t2], [o])
        s.launch("softmax", [o], [o], {"axis": -1})
        jobs.append((dev, s, part, [tx, t1, t2, h, o]))
    rows = []
    for dev, s, part, ts in jobs:
        got = ts[-1].numpy(stream=s)
        hh = part @ w1
        hh = 0.5 * hh * (1 + np.tanh(np.sqrt(2 / np.pi) * (hh + 0.044715 * hh ** 3)))
        ref = hh @ w2
        ref = np.exp(ref - ref.max(-1, keepdims=True))
        ref /= ref.sum(-1, keepdims=True)
        err = float(np.abs(got - ref).max())
        rows.append({"device": dev.index, "rows": len(part), "max_abs_err": err, "ok": err < 1e-4})
        for t in ts:
            t.free()
        s.destroy()
    return rows


def run_demo(rt, out=sys.stdout, max_new_tokens: int = 24) -> bool:
    from runtime.models.bert import EmbedJob
    from runtime.models.llama import GenerateJob
    from .smi import collect, render
    n = rt.device_count()
    ok = True
    tp = 3 if n >= 3 else 1
    print(f"== SmolLM2-135M-Instruct, {'tensor parallel over ' + str(tp) + ' devices' if tp > 1 else '1 device'}"
          f" (weights and KV cache in device HBM)", file=out)
    job = GenerateJob(rt, "smollm2", devices=tp, parallel="tp" if tp > 1 else "none", max_len=256)
    try:
        for p in PROMPTS:
            print(f"> {p}\n", end="", file=out)
            t0 = time.perf_counter()
            gens = job.generate([p], max_new_tokens=max_new_tokens,
                                on_token=lambda b, tok, piece: print(piece, end="", flush=True, file=out))
            dt = time.perf_counter() - t0
            st = job.last_stats
            per_dev = "/".join(f"{x:.0f}" for x in st.device_launches_per_token)
            print(f"\n  [{len(gens[0].token_ids)} tokens in {dt:.2f} s, {per_dev} launches per token on each "
                  f"device, {st.collectives} collectives]", file=out)
            ok &= len(gens[0].token_ids) > 0
    finally:
        job.close()
    dp = min(n, 4)
    print(f"\n== MiniLM-L6 sentence embeddings, data parallel over {dp} devices", file=out)
    ejob = EmbedJob(rt, "minilm-l6", devices=dp, parallel="dp", batch_size=2)
    try:
        emb = ejob.embed(SENTENCES)
    finally:
        ejob.close()
    sims = emb @ emb.T
    for i, s in enumerate(SENTENCES):
        j = int(np.argsort(-sims[i])[1])
        print(f"  {s[:52]:52s} ~ {SENTENCES[j][:40]:40s} (cos {sims[i, j]:.2f})", file=out)
    ok &= bool(np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4))
    print("\n== a small MLP block on every device, checked against numpy", file=out)
    for r in run_mlp_check(rt):
        print(f"  npu{r['device']}: {r['rows']} rows, max |err| {r['max_abs_err']:.1e} {'OK' if r['ok'] else 'WRONG'}",
              file=out)
        ok &= r["ok"]
    ok &= run_service_demo(rt, out)
    print(render(collect(rt)), file=out)
    return ok


def _post(url: str, body: dict, stream: bool = False):
    import json
    import urllib.request
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if not stream:
            return json.loads(r.read())
        return [json.loads(ln[6:]) for ln in r.read().decode().split("\n\n")
                if ln.startswith("data: ") and ln != "data: [DONE]"]


def run_service_demo(rt, out=sys.stdout, clients: int = 6, max_tokens: int = 16) -> bool:
    """``vnpu serve`` on this cluster: SmolLM2 (continuous batching, paged KV cache) and MiniLM (dynamic
    batching) behind the OpenAI routes on loopback, and (3 devices or more) MiniLM-L3 compiled by ``vnpu
    atc`` behind the Open Inference Protocol (REST and gRPC); concurrent chat, a streamed chat and
    embeddings over HTTP, tritonclient requests to the compiled model; throughput and a few /metrics lines;
    then a clean shutdown."""
    import tempfile
    import threading
    import urllib.request

    from runtime.cli.demo_om import ask_triton, compile_minilm
    from runtime.serve.config import model_spec
    from runtime.serve.engine import EngineConfig
    from runtime.serve.modelrepo import single_model
    from runtime.serve.server import Server, Service
    n = rt.device_count()
    specs = [model_spec("smollm2", (0,), None, EngineConfig(max_num_seqs=8, max_model_len=256))]
    if n > 1:
        specs.append(model_spec("minilm-l6", (1,), None))
    tmp = tempfile.TemporaryDirectory(prefix="vnpu-demo-")
    repos = (single_model(compile_minilm(tmp.name)),) if n > 2 else ()
    svc = Service(rt, tuple(specs), repositories=repos)
    srv = Server(svc, grpc_port=0 if repos else None).start()
    ok = True
    try:
        svc.load()
        url = srv.url
        print(f"\n== vnpu serve on {url} (OpenAI routes; SmolLM2 on npu0" + (", MiniLM-L6 on npu1" if n > 1 else "") +
              (f"; Open Inference Protocol, gRPC on {srv.grpc_url}: MiniLM-L3 .om on npu2)" if repos else ")"), file=out)
        questions = ["What is a neural processing unit?", "Name three colors.", "What is 7 times 8?",
                     "Say hello in French.", "What is the capital of Japan?", "Give me a fruit."]
        res: list = [None] * clients
        t0 = time.perf_counter()

        def chat(i):
            res[i] = _post(url + "/v1/chat/completions", {"model": "smollm2", "max_tokens": max_tokens,
                                                           "temperature": 0, "messages": [
                                                               {"role": "user", "content": questions[i % 6]}]})
        th = [threading.Thread(target=chat, args=(i,)) for i in range(clients)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        dt = time.perf_counter() - t0
        toks = sum(r["usage"]["completion_tokens"] for r in res if r)
        for i, r in enumerate(res[:3]):
            print(f"  > {questions[i]}\n    {r['choices'][0]['message']['content'].strip()[:90]!r}", file=out)
        print(f"  [{clients} concurrent chats: {toks} tokens in {dt:.2f} s = {toks / dt:.1f} tokens/s]", file=out)
        ok &= toks > 0
        chunks = _post(url + "/v1/chat/completions", {"model": "smollm2", "max_tokens": max_tokens, "temperature": 0,
                                                      "stream": True, "stream_options": {"include_usage": True},
                                                      "messages": [{"role": "user", "content": "Count to five."}]},
                       stream=True)
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        print(f"  streamed: {len(chunks)} chunks, {text.strip()[:80]!r}, usage {chunks[-1]['usage']}", file=out)
        ok &= bool(text)
        if n > 1:
            e = _post(url + "/v1/embeddings", {"model": "minilm-l6", "input": SENTENCES[:3]})
            print(f"  embeddings: {len(e['data'])} x {len(e['data'][0]['embedding'])}, usage {e['usage']}", file=out)
            ok &= len(e["data"]) == 3
        if repos:
            ok &= ask_triton(srv, SENTENCES, out)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=60).read().decode().splitlines()
        keep = ("vnpu:generation_tokens_total{", "vnpu:request_success_total{", "vnpu:kv_cache_usage_perc{",
                "vnpu:time_to_first_token_seconds_count{", "npu_chip_info_hbm_used_memory{")
        print("  /metrics:", file=out)
        for ln in metrics:
            if ln.startswith(keep):
                print(f"    {ln}", file=out)
    finally:
        srv.stop()
        tmp.cleanup()
    print("  server drained and stopped", file=out)
    return ok


def register(sub) -> None:
    demo = sub.add_parser("demo", help="the main job: multi-device inference on a local cluster, then smi",
                          example="vnpu demo --devices 4 --max-new-tokens 24")
    demo.add_argument("--devices", type=positive_int, default=4, help="devices of the demo's cluster (default 4)")
    demo.add_argument("--max-new-tokens", type=positive_int, default=24,
                      help="tokens the generation part writes (default 24)")
    demo.set_defaults(fn=_cmd_demo)


def _cmd_demo(a) -> int:
    from runtime.cluster import cluster_runtime
    with cluster_runtime(devices=a.devices) as rt:
        print(f"vnpu: {rt.device_count()} virtual NPUs up ({rt.backend.name} backend)")
        ok = run_demo(rt, max_new_tokens=a.max_new_tokens)
    return 0 if ok else 1
