"""The server's start summary: what ``vnpu serve`` serves, where and within which limits, in a few lines
(vLLM's startup log gives the same facts: KV blocks, maximum concurrency, graphs captured)::

    model smollm2 (generation) on npu 0 -> npu 2 -> cpu
      KV cache: 1234 blocks x 16 tokens = 19744 tokens; max_model_len 1024 (19.3x concurrency)
      graphs: 5 decode graphs captured (batch sizes 1, 2, 4, 8, 16)
      batching: max_num_seqs 16, max_num_batched_tokens 256, max_queued_requests 64, scheduler adaptive (priority)
    model minilm-l6 (embedding) on npu 1 -> cpu
      batching: max_batch_size 32, max_wait_ms 5, max_queued_requests 256; max_len 512
    tenants: 3 (API key required)
    started in 11.5 s; serving on http://127.0.0.1:8000 (/v1/completions, /v1/chat/completions, /v1/embeddings, ...)

Every number is read from the running engines (:meth:`runtime.serve.server.Frontend.state_dict`: the KV
blocks the runner allocated, the graphs it captured), not from the config.  Host-only; never blocks.
"""
from __future__ import annotations

#: model kind -> the routes that serve it, in the order the last line names them
ROUTES = {"generate": ("/v1/completions", "/v1/chat/completions"), "embed": ("/v1/embeddings",),
          "compiled": ("/v2/models/{name}/infer",)}
#: routes every server has
COMMON_ROUTES = ("/v1/models", "/metrics", "/health")


def routes(service) -> list[str]:
    """The routes ``service`` answers for the kinds of models it serves, then :data:`COMMON_ROUTES`."""
    kinds = {s.kind for s in service.specs} | ({"compiled"} if service.compiled_names() else set())
    return [r for k in ROUTES if k in kinds for r in ROUTES[k]] + list(COMMON_ROUTES)


def _generation(name: str, m: dict) -> list[str]:
    cap = m["kv_blocks"] * m["block_size"]
    graphs = (f"{m['graphs']} decode graphs captured (batch sizes {', '.join(map(str, m['graph_buckets']))})"
              if m["graph_buckets"] else "none (eager: every decode step launches its kernels)")
    return [f"model {name} (generation) on {' -> '.join(m['chain'])}",
            f"  KV cache: {m['kv_blocks']} blocks x {m['block_size']} tokens = {cap} tokens; max_model_len "
            f"{m['max_model_len']} ({cap / m['max_model_len']:.1f}x concurrency)",
            f"  graphs: {graphs}",
            f"  batching: max_num_seqs {m['max_num_seqs']}, max_num_batched_tokens {m['max_num_batched_tokens']}, "
            f"max_queued_requests {m['max_queued_requests']}, scheduler {m['mode']} ({m['policy']})"]


def _embedding(name: str, m: dict) -> list[str]:
    return [f"model {name} (embedding) on {' -> '.join(m['chain'])}",
            f"  batching: max_batch_size {m['max_batch_size']}, max_wait_ms {m['max_wait_ms']:g}, "
            f"max_queued_requests {m['max_queued_requests']}; max_len {m['max_len']}"]


def _compiled(state: dict) -> list[str]:
    out = []
    for name, m in (state.get("compiled_models") or {}).items():
        for version, insts in m["versions"].items():
            where = "; ".join(" -> ".join(i["chain"]) for i in insts)
            out.append(f"model {name} version {version}: {len(insts)} instance(s) on {where} (compiled)")
    return out


def _by_spec(service) -> list[str]:
    """Models the state does not describe (Ray Serve replicas): their configured placement."""
    n = getattr(service, "replica_count", 1)
    out = []
    for spec in service.specs:
        where = " -> ".join([f"npu {','.join(map(str, spec.devices))}", *map(str, spec.fallback)])
        out.append(f"model {spec.name} ({'generation' if spec.kind == 'generate' else 'embedding'}) on "
                   + (f"{n} Ray Serve replicas, each on {where}" if n > 1 else where))
    return out


def start_summary(service, url: str, started_s: float, grpc_url: str | None = None) -> list[str]:
    """The summary lines of ``service`` (a :class:`runtime.serve.server.Frontend`, loaded) serving on
    ``url`` after ``started_s`` seconds."""
    state = service.state_dict()
    described = state.get("models", {})
    lines: list[str] = []
    for name, m in described.items():
        if "chain" in m:
            lines += _generation(name, m) if m["kind"] == "generate" else _embedding(name, m)
    if not any("chain" in m for m in described.values()):
        lines += _by_spec(service)
    lines += _compiled(state)
    n = len(service.tenants.tenants)
    lines.append(f"tenants: {n} (API key required)" if n else "tenants: none (open server: no API key asked)")
    if grpc_url is not None:
        lines.append(f"gRPC (Open Inference Protocol) on {grpc_url}")
    lines.append(f"started in {started_s:.1f} s; serving on {url} ({', '.join(routes(service))})")
    return lines
