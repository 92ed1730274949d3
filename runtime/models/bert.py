"""BERT sentence encoders (all-MiniLM-L6-v2, paraphrase-MiniLM-L3-v2) on virtual NPUs.

Per batch (right-padded to its longest sentence, ``T = B * S`` tokens), on each device's stream:

- embeddings: ``embedding`` (words) + ``add`` (position + token-type-0 rows, pre-summed at upload) +
  ``layernorm``;
- per layer: fused QKV ``matmul`` (bias), ``transpose`` ``[B,S,3,H,Dh] -> [3,B,H,S,Dh]`` (q, k and v become
  contiguous head-major views), ``attention`` with an additive ``[B,1,1,S]`` padding mask, ``transpose``
  back, output ``matmul`` (bias), ``add`` residual, ``layernorm``, FFN ``matmul`` (bias), ``gelu`` (erf),
  ``matmul`` (bias), ``add``, ``layernorm``: 12 launches;
- pooling: one ``batch_matmul`` of the mask weights ``[B,1,S]`` (1/n on real tokens, 0 on pads) with the
  token states ``[B,S,D]`` = the masked mean; L2 normalisation (L6) is one ``rmsnorm`` with eps 0 and
  gamma ``1/sqrt(D)`` (x / sqrt(sum x^2)).

Parallel modes: ``dp`` (each device holds all weights and takes its share of the batches) and ``tp``
(heads and FFN columns split over the devices; the partial sums of the output and FFN-down projections
are all-reduced, their biases added on rank 0 only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from devices.errors import AclError, InvalidParamError
from runtime import hccl
from runtime.stages import LOADING_WEIGHTS, UPLOADING, stage

from .common import (Block, Closer, JobBase, DeviceTimer, HostPack, JobStats, Launcher, now, pick_devices,
                     upload_block)
from .parallel import encoder_splits
from .tokenizer import BertTokenizer, bert_tokenizer
from .weights import load_onnx_initializers, load_safetensors, minilm_l3_onnx, minilm_l6_dir


@dataclass(frozen=True)
class BertConfig:
    n_layers: int
    d: int = 384
    heads: int = 12
    ff: int = 1536
    eps: float = 1e-12
    max_len: int = 256
    normalize: bool = True


#: each encoder's shape (known without its weights: the command line checks a split before loading them)
ENCODER_SHAPES = {"minilm-l6": BertConfig(n_layers=6, max_len=256, normalize=True),
                  "minilm-l3": BertConfig(n_layers=3, max_len=128, normalize=False)}


def _load_l6() -> tuple[BertConfig, dict]:
    w = load_safetensors(minilm_l6_dir() / "model.safetensors")
    return ENCODER_SHAPES["minilm-l6"], w


def _load_l3() -> tuple[BertConfig, dict]:
    raw = load_onnx_initializers(minilm_l3_onnx())
    pre = "model.0.auto_model."
    w = {k[len(pre):] if k.startswith(pre) else k: v for k, v in raw.items()}
    return ENCODER_SHAPES["minilm-l3"], w


ENCODER_MODELS: dict[str, Callable[[], tuple[BertConfig, dict]]] = {"minilm-l6": _load_l6, "minilm-l3": _load_l3}
_CACHE: dict[str, tuple[BertConfig, dict]] = {}


def load_encoder(model: str) -> tuple[BertConfig, dict]:
    if model not in ENCODER_MODELS:
        raise InvalidParamError(f"unknown encoder model {model!r} (known: {', '.join(ENCODER_MODELS)})")
    if model not in _CACHE:
        _CACHE[model] = ENCODER_MODELS[model]()
    return _CACHE[model]


class BertRank:
    """One device's weights (all of them, or its tensor-parallel slice) and its launches."""

    def __init__(self, dev, cfg: BertConfig, w: dict, rank: int = 0, size: int = 1, comm=None,
                 block_dim: int = 0):
        self.dev, self.cfg, self.rank, self.size, self.comm = dev, cfg, rank, size, comm
        self.hl = cfg.heads // size
        self.fl = cfg.ff // size
        self.lc = Launcher(dev, block_dim=block_dim)
        self.buf: Block | None = None
        self.cap_tokens = 0
        self.cap_batch = 0
        try:
            self.w = upload_block(dev, self._host(w))
        except BaseException:
            self.lc.close()
            raise

    def _host(self, w: dict) -> dict[str, np.ndarray]:
        cfg, r = self.cfg, self.rank
        dh = cfg.d // cfg.heads
        hs = slice(r * self.hl * dh, (r + 1) * self.hl * dh)
        fs = slice(r * self.fl, (r + 1) * self.fl)
        g = lambda k: np.asarray(w[k], np.float32)  # noqa: E731
        out = {
            "word": g("embeddings.word_embeddings.weight"),
            "pos": g("embeddings.position_embeddings.weight") + g("embeddings.token_type_embeddings.weight")[0],
            "eln.g": g("embeddings.LayerNorm.weight"), "eln.b": g("embeddings.LayerNorm.bias"),
        }
        for i in range(cfg.n_layers):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            out[f"{i}.wqkv"] = np.concatenate([g(a + n + ".weight")[hs] for n in ("query", "key", "value")])
            out[f"{i}.bqkv"] = np.concatenate([g(a + n + ".bias")[hs] for n in ("query", "key", "value")])
            out[f"{i}.wo"] = np.ascontiguousarray(g(p + "attention.output.dense.weight")[:, hs])
            if r == 0:
                out[f"{i}.bo"] = g(p + "attention.output.dense.bias")
                out[f"{i}.b2"] = g(p + "output.dense.bias")
            out[f"{i}.ln1.g"] = g(p + "attention.output.LayerNorm.weight")
            out[f"{i}.ln1.b"] = g(p + "attention.output.LayerNorm.bias")
            out[f"{i}.w1"] = np.ascontiguousarray(g(p + "intermediate.dense.weight")[fs])
            out[f"{i}.b1"] = g(p + "intermediate.dense.bias")[fs]
            out[f"{i}.w2"] = np.ascontiguousarray(g(p + "output.dense.weight")[:, fs])
            out[f"{i}.ln2.g"] = g(p + "output.LayerNorm.weight")
            out[f"{i}.ln2.b"] = g(p + "output.LayerNorm.bias")
        out["l2"] = np.full(cfg.d, 1.0 / math.sqrt(cfg.d), np.float32)
        return out

    # -------------------------------------------------------------- activations
    def ensure(self, B: int, S: int) -> None:
        """Activation buffers for batches up to ``B x S`` (re-allocated only when a batch needs more)."""
        T = B * S
        if self.buf is not None and T <= self.cap_tokens and B <= self.cap_batch:
            return
        self.release()
        T, B = max(T, self.cap_tokens), max(B, self.cap_batch)
        cfg = self.cfg
        b = Block(self.dev)
        b.add("x", (T, cfg.d))
        b.add("tmp", (T, cfg.d))
        b.add("qkv", (T, 3 * self.hl * (cfg.d // cfg.heads)))
        b.add("qkvT", (T, 3 * self.hl * (cfg.d // cfg.heads)))
        b.add("att", (T, self.hl * (cfg.d // cfg.heads)))
        b.add("att2", (T, self.hl * (cfg.d // cfg.heads)))
        b.add("ff", (T, self.fl))
        b.add("emb", (B, cfg.d))
        b.add("out", (B, cfg.d))
        # per-batch inputs (one host write): ids, additive mask, pooling weights
        b.add("ids", (T,), "int32")
        b.add("mask", (T,))
        b.add("poolw", (T,))
        b.allocate(self.lc.stream)                  # activations: short-lived, for work on the rank's stream
        self.buf = b
        self.pack = HostPack(b, ["ids", "mask", "poolw"])
        self.cap_tokens, self.cap_batch = T, B

    def release(self) -> None:
        if self.buf is not None:
            self.buf.free()
        self.buf = None
        self.cap_tokens = self.cap_batch = 0

    # -------------------------------------------------------------- one batch
    def run(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """Issue the forward pass of one batch (``ids``/``mask`` ``[B, S]``); result in :meth:`result`."""
        cfg, lc = self.cfg, self.lc
        B, S = ids.shape
        T = B * S
        H, dh, D = self.hl, cfg.d // cfg.heads, cfg.d
        self.ensure(B, S)
        bf, w = self.buf, self.w
        pk = self.pack
        cnt = mask.sum(1, keepdims=True).clip(min=1)
        pk.put("ids", ids.astype(np.int32))
        pk.put("mask", np.where(mask > 0, 0.0, -np.inf).astype(np.float32))
        pk.put("poolw", (mask / cnt).astype(np.float32))
        lc.write(pk)
        x = bf["x"].view((T, D))
        tmp = bf["tmp"].view((T, D))
        qkv = bf["qkv"].view((T, 3 * H * dh))
        qkvT = bf["qkvT"].view((3, B, H, S, dh))
        q = bf["qkvT"].view((B, H, S, dh))
        k = bf["qkvT"].view((B, H, S, dh), offset_bytes=T * H * dh * 4)
        v = bf["qkvT"].view((B, H, S, dh), offset_bytes=2 * T * H * dh * 4)
        att = bf["att"].view((B, H, S, dh))
        att2 = bf["att2"].view((T, H * dh))
        ff = bf["ff"].view((T, self.fl))
        m = bf["mask"].view((B, 1, 1, S))
        eps = float(cfg.eps)
        lc("embedding", [w["word"], bf["ids"].view((T,))], [x])
        lc("add", [x.view((B, S, D)), w["pos"].view((S, D))], [x.view((B, S, D))])
        lc("layernorm", [x, w["eln.g"], w["eln.b"]], [x], eps=eps)
        for i in range(cfg.n_layers):
            lc("matmul", [x, w[f"{i}.wqkv"], w[f"{i}.bqkv"]], [qkv], transpose_b=True)
            lc("transpose", [qkv.view((B, S, 3, H, dh))], [qkvT], perm=(2, 0, 3, 1, 4))
            lc("attention", [q, k, v, m], [att])
            lc("transpose", [att], [att2.view((B, S, H, dh))], perm=(0, 2, 1, 3))
            self._proj(att2, w[f"{i}.wo"], w.views.get(f"{i}.bo"), tmp)
            lc("add", [x, tmp], [x])
            lc("layernorm", [x, w[f"{i}.ln1.g"], w[f"{i}.ln1.b"]], [x], eps=eps)
            lc("matmul", [x, w[f"{i}.w1"], w[f"{i}.b1"]], [ff], transpose_b=True)
            lc("gelu", [ff], [ff], approximate="none")
            self._proj(ff, w[f"{i}.w2"], w.views.get(f"{i}.b2"), tmp)
            lc("add", [x, tmp], [x])
            lc("layernorm", [x, w[f"{i}.ln2.g"], w[f"{i}.ln2.b"]], [x], eps=eps)
        emb = bf["emb"].view((B, 1, D))
        lc("batch_matmul", [bf["poolw"].view((B, 1, S)), x.view((B, S, D))], [emb])
        self.out_view = emb.view((B, D))
        if cfg.normalize:
            lc("rmsnorm", [emb.view((B, D)), w["l2"]], [bf["out"].view((B, D))], eps=0.0)
            self.out_view = bf["out"].view((B, D))

    def _proj(self, a, wt, bias, out) -> None:
        ins = [a, wt] + ([bias] if bias is not None else [])
        self.lc("matmul", ins, [out], transpose_b=True)
        if self.comm is not None:
            self.comm.all_reduce(out, out, op="sum", stream=self.lc.stream)
            self.lc.collectives += 1

    def result(self) -> np.ndarray:
        return self.out_view.numpy(self.lc.stream)

    def close(self) -> None:
        c = Closer()
        c.push(self.lc.close)
        c.push(self.w.free)
        c.push(self.release)
        c.close()


class EmbedJob(JobBase):
    """Sentence embeddings on ``devices`` virtual NPUs.

    ``parallel="dp"``: batches spread over the devices (each holds all weights); ``"tp"``: every batch
    on all devices with heads and FFN columns split (needs HCCL).  ``batch_size`` sentences per device
    batch; sentences are sorted by length so that batches carry little padding (results come back in
    input order).  ``devices``: a count (the first ones), a list of device ids, or a list of
    :class:`runtime.api.Device` objects (``rt`` is then not used)."""

    def __init__(self, rt, model: str = "minilm-l6", devices: int | Sequence = 1, parallel: str = "dp",
                 batch_size: int = 32, block_dim: int = 0):
        with stage(LOADING_WEIGHTS, str(model)):
            cfg, w = load_encoder(model)
        if parallel not in ("dp", "tp"):
            raise InvalidParamError(f"parallel must be dp or tp for an encoder, got {parallel!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidParamError(f"batch_size must be a positive integer, got {batch_size!r}")
        devs = pick_devices(rt, devices)
        n = len(devs)
        problem = encoder_splits(model, cfg).problem(parallel, n)
        if problem:
            raise InvalidParamError(problem)
        self.model, self.cfg, self.parallel, self.devices = model, cfg, parallel, devs
        self.batch_size = batch_size
        self.tok: BertTokenizer = bert_tokenizer(cfg.max_len)
        self.ranks: list[BertRank] = []
        self._comms: list = []
        self._closed = False
        self.last_stats = JobStats()
        try:
            comms = None
            if parallel == "tp" and n > 1:
                comms = hccl.comm_init_all(devs)
                self._comms = list(comms)
            with stage(UPLOADING, f"{model} on {n} device(s)", total=n) as advance:
                for r, d in enumerate(devs):
                    if parallel == "tp":
                        self.ranks.append(BertRank(d, cfg, w, r, n, comms[r] if comms else None, block_dim))
                    else:
                        self.ranks.append(BertRank(d, cfg, w, block_dim=block_dim))
                    advance()
        except BaseException:
            self._teardown()
            raise

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), 384]`` float32 sentence embeddings (L2-normalised for minilm-l6)."""
        if self._closed:
            raise InvalidParamError("the job is closed")
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise InvalidParamError("texts must be a list of strings")
        if not texts:
            raise InvalidParamError("no texts given")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise InvalidParamError(f"text {i} is empty or not a string")
        t0 = now()
        cut: list[int] = []
        ids, mask = self.tok.encode_batch(list(texts), cut)
        lens = mask.sum(1)
        order = np.argsort(-lens, kind="stable")
        per = self.batch_size
        if self.parallel == "dp":                      # few sentences: still use every device
            per = max(1, min(per, -(-len(texts) // len(self.ranks))))
        batches = [order[i:i + per] for i in range(0, len(order), per)]
        out = np.zeros((len(texts), self.cfg.d), np.float32)
        launches0 = sum(r.lc.launches for r in self.ranks)
        timer = DeviceTimer([r.lc for r in self.ranks])
        try:
            timer.start()
            if self.parallel == "tp":
                for idx in batches:
                    s = int(lens[idx].max())
                    for r in self.ranks:
                        r.run(ids[idx, :s], mask[idx, :s])
                    out[idx] = self.ranks[0].result()
            else:
                n = len(self.ranks)
                for j in range(0, len(batches), n):
                    group = list(zip(self.ranks, batches[j:j + n]))
                    for r, idx in group:
                        s = int(lens[idx].max())
                        r.run(ids[idx, :s], mask[idx, :s])
                    for r, idx in group:
                        out[idx] = r.result()
            devices = timer.stop()
        finally:
            timer.destroy()
        st = JobStats(wall_s=now() - t0, items=len(texts), truncated=len(cut),
                      context=self.tok.max_length if cut else 0,
                      launches=sum(r.lc.launches for r in self.ranks) - launches0,
                      collectives=sum(r.lc.collectives for r in self.ranks), devices=devices)
        self.last_stats = st
        return out

