"""SmolLM2-135M on the in-process runtime vs a plain numpy llama forward written here.

The reference works in Hugging Face layout (q/k rows un-permuted from llama.cpp's GGUF order, rotate-half
RoPE), the job in GGUF layout (interleaved RoPE): agreement checks the permutation handling as well."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import make_local_runtime
from devices.errors import AclError, InvalidDeviceError, InvalidParamError, MemoryAllocationError
from runtime.models import GenerateJob, sample_token
from runtime.models.common import hbm_used


def settled_hbm(devs) -> list[int]:
    """HBM in use once the caching pools gave back what they cached (a job's close empties the pool,
    also of what other jobs cached on the same device)."""
    for d in devs:
        d.empty_cache()
    return hbm_used(devs)
from runtime.models.tokenizer import gguf_tokenizer
from runtime.models.weights import LlamaConfig, load_gguf_cached, smollm2_gguf

ARENA = 1 << 30


# ---------------------------------------------------------------------------------------------- reference
class RefLlama:
    """Plain numpy llama forward (float32), weights in Hugging Face layout."""

    def __init__(self, g):
        self.cfg = c = LlamaConfig.from_gguf_meta(g.meta)
        t = g.tensors

        def unpermute(w, n_head):   # llama.cpp convert permutes rows (half -> interleaved); undo it
            dh = w.shape[0] // n_head
            return w.reshape(n_head, dh // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)

        self.layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            self.layers.append(dict(
                an=t[p + "attn_norm.weight"], wq=unpermute(t[p + "attn_q.weight"], c.n_heads),
                wk=unpermute(t[p + "attn_k.weight"], c.n_kv_heads), wv=t[p + "attn_v.weight"],
                wo=t[p + "attn_output.weight"], fn=t[p + "ffn_norm.weight"], wg=t[p + "ffn_gate.weight"],
                wu=t[p + "ffn_up.weight"], wd=t[p + "ffn_down.weight"]))
        self.emb = t["token_embd.weight"]
        self.out_norm = t["output_norm.weight"]
        self.inv = 1.0 / (c.rope_base ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(self.cfg.eps)) * w

    def _rope(self, x, pos):                              # x [S, H, D], rotate-half
        ang = pos[:, None].astype(np.float64) * self.inv
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def logits(self, ids, last: bool = False) -> np.ndarray:
        """Logits [S, V] (only the last position's with ``last``) of a full forward over ``ids``."""
        c = self.cfg
        S, dh = len(ids), c.head_dim
        g = c.n_heads // c.n_kv_heads
        x = self.emb[np.asarray(ids)]
        pos = np.arange(S)
        causal = np.triu(np.full((S, S), -np.inf, np.float32), 1)
        for L in self.layers:
            h = self._rms(x, L["an"])
            q = self._rope((h @ L["wq"].T).reshape(S, c.n_heads, dh), pos)
            k = self._rope((h @ L["wk"].T).reshape(S, c.n_kv_heads, dh), pos)
            v = (h @ L["wv"].T).reshape(S, c.n_kv_heads, dh)
            k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
            s = np.einsum("shd,thd->hst", q, k) / np.float32(np.sqrt(dh)) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            x = x + np.einsum("hst,thd->shd", s, v).reshape(S, -1) @ L["wo"].T
            h = self._rms(x, L["fn"])
            gg, u = h @ L["wg"].T, h @ L["wu"].T
            x = x + ((gg / (1 + np.exp(-gg))) * u) @ L["wd"].T
        if last:
            x = x[-1:]
        return self._rms(x, self.out_norm) @ self.emb.T

    def greedy(self, ids, n: int, stop: set) -> list[int]:
        """Greedy tokens by full recompute each step (no KV cache)."""
        ids, out = list(ids), []
        for _ in range(n):
            t = int(np.argmax(self.logits(ids, last=True)[-1]))
            out.append(t)
            ids.append(t)
            if t in stop:
                break
        return out


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def gg():
    return load_gguf_cached(str(smollm2_gguf()))


@pytest.fixture(scope="module")
def ref(gg):
    return RefLlama(gg)


@pytest.fixture(scope="module")
def tok():
    return gguf_tokenizer(str(smollm2_gguf()))


@pytest.fixture(scope="module")
def rt3():
    r = make_local_runtime(3, arena=ARENA)
    yield r
    r.close()


@pytest.fixture(scope="module")
def job1(rt3):
    j = GenerateJob(rt3, "smollm2", devices=1, parallel="none", max_len=256)
    yield j
    j.close()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.encode("Once upon a time, in a small village,"),
            tok.chat_prompt("What is the capital of France?")]


@pytest.fixture(scope="module")
def greedy_1dev(job1, prompts):
    return [job1.generate([p], max_new_tokens=16)[0].token_ids for p in prompts]


def _stops(tok):
    return {tok.eos_id, 0}


# ---------------------------------------------------------------------------------------------- numerics
def test_prefill_logits_match_numpy(job1, ref, prompts):
    emu = job1.score(prompts)                          # batched: the shorter prompt is left-padded
    for b, p in enumerate(prompts):
        want = ref.logits(p, last=True)[-1]
        scale = float(np.abs(want).max())
        err = float(np.abs(emu[b] - want).max())
        assert err <= 1e-4 * scale, (b, err, scale)
        assert int(np.argmax(emu[b])) == int(np.argmax(want))


def test_greedy_kv_cache_decode_matches_full_recompute(ref, tok, prompts, greedy_1dev):
    for p, got in zip(prompts, greedy_1dev):
        want = ref.greedy(p, 16, _stops(tok))
        assert got == want
    assert len(greedy_1dev[0]) == 16
    assert tok.decode(greedy_1dev[1]).startswith("The capital of France is Paris")


def test_batch_gives_the_same_tokens_as_unbatched(job1, prompts, greedy_1dev):
    res = job1.generate(prompts, max_new_tokens=16)
    assert [g.token_ids for g in res] == greedy_1dev
    st = job1.last_stats
    assert st.decode_steps == max(map(len, greedy_1dev)) - 1        # the first token comes from the prefill
    assert st.launches_per_token == 363                              # 30 layers x 12 + embed + norm + head (B > 1)


def test_launch_count_and_stats(job1, prompts):
    job1.generate([prompts[0]], max_new_tokens=4)
    st = job1.last_stats.as_dict()
    assert st["launches_per_token"] == 303                           # one sequence: 30 x 10 + 3
    assert st["items"] == 4 and st["decode_steps"] == 3
    assert st["devices"][0]["modeled_ms"] > 0 and st["devices"][0]["wall_ms"] > 0


def test_decode_graph_replay_matches_eager_launches(rt3, job1, prompts, greedy_1dev):
    """Decode steps are captured once per call and replayed (2 stream ops per step: the inputs write and
    the replay); launching every kernel instead gives the same tokens at 1 + 303 ops per step."""
    def ops(job, n):
        dev = job.devices[0]
        before = dev.queue.ops_sent
        res = job.generate([prompts[0]], max_new_tokens=n, stop_at_eos=False)
        return dev.queue.ops_sent - before, res[0].token_ids

    g4, t4 = ops(job1, 4)
    g12, t12 = ops(job1, 12)
    assert g12 - g4 == 8 * 2
    assert t12[:4] == t4 and t12 == greedy_1dev[0][:12]
    assert job1.last_stats.launches_per_token == 303                 # kernels inside the replays count
    assert len(rt3.device(0).handle.graphs) == 0                     # each call's graph is destroyed
    eager = GenerateJob(rt3, "smollm2", devices=[1], parallel="none", max_len=256, graphs=False)
    try:
        e4, _ = ops(eager, 4)
        e12, te = ops(eager, 12)
        assert e12 - e4 == 8 * (1 + 303)
        assert te == t12
        assert [g.token_ids for g in eager.generate(prompts, max_new_tokens=16)] == greedy_1dev
    finally:
        eager.close()


def test_sampling_is_seeded(job1, prompts):
    a = job1.generate([prompts[0]], max_new_tokens=6, temperature=0.9, top_k=40, top_p=0.9, seed=7)
    b = job1.generate([prompts[0]], max_new_tokens=6, temperature=0.9, top_k=40, top_p=0.9, seed=7)
    assert a[0].token_ids == b[0].token_ids
    g = job1.generate([prompts[0]], max_new_tokens=4)
    k1 = job1.generate([prompts[0]], max_new_tokens=4, temperature=1.0, top_k=1, seed=3)
    assert k1[0].token_ids == g[0].token_ids


def test_sample_token_filters():
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 5.0, 4.9, -3.0])
    assert sample_token(logits, rng, 0.0, 0, 1.0) == 1
    assert {sample_token(logits, rng, 1.0, 2, 1.0) for _ in range(50)} <= {1, 2}
    assert {sample_token(logits, rng, 1.0, 0, 0.5) for _ in range(50)} == {1}


# ---------------------------------------------------------------------------------------------- parallel
@pytest.mark.parametrize("parallel,n", [("tp", 3), ("pp", 2)])
def test_parallel_modes_give_identical_tokens(rt3, prompts, greedy_1dev, parallel, n):
    devs = rt3.devices()
    before = settled_hbm(devs)
    job = GenerateJob(rt3, "smollm2", devices=n, parallel=parallel, max_len=256)
    try:
        res = job.generate(prompts[:1], max_new_tokens=16)
        assert [g.token_ids for g in res] == greedy_1dev[:1]
        assert job.last_stats.collectives > 0
    finally:
        job.close()
    assert hbm_used(devs) == before


# ---------------------------------------------------------------------------------------------- memory
def test_generate_frees_its_buffers(rt3, job1, prompts):
    """A call's buffers go back to the caching pool (allocated bytes as before), and the next call of
    the same shape reuses them: nothing more is reserved from the driver."""
    dev = rt3.device(0)
    allocated = dev.memory_allocated()
    job1.generate(prompts, max_new_tokens=3)
    assert dev.memory_allocated() == allocated
    reserved, used, mallocs = dev.memory_reserved(), hbm_used([dev]), dev.memory_stats()["num_device_alloc"]
    job1.generate(prompts, max_new_tokens=3)
    assert dev.memory_allocated() == allocated
    assert (dev.memory_reserved(), hbm_used([dev]), dev.memory_stats()["num_device_alloc"]) == (reserved, used, mallocs)


def test_close_returns_hbm(rt3):
    devs = rt3.devices()
    before = settled_hbm(devs)
    job = GenerateJob(rt3, "smollm2", devices=[2], parallel="none", max_len=64)
    assert hbm_used(devs)[2] > before[2] + (400 << 20)
    job.generate(["hi"], max_new_tokens=2)
    job.close()
    job.close()
    assert hbm_used(devs) == before
    with pytest.raises(InvalidParamError):
        job.generate(["hi"], max_new_tokens=2)


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input(rt3, job1, tok):
    with pytest.raises(InvalidParamError) as e:
        GenerateJob(rt3, "gpt-17", devices=1)
    assert e.value.code == 107000
    with pytest.raises(InvalidDeviceError) as e:
        GenerateJob(rt3, "smollm2", devices=4, parallel="pp")
    assert e.value.code == 107001
    with pytest.raises(InvalidParamError, match="divide the 3 KV heads"):
        GenerateJob(rt3, "smollm2", devices=2, parallel="tp")
    with pytest.raises(InvalidParamError):
        GenerateJob(rt3, "smollm2", devices=1, parallel="dp")
    for bad in ([""], ["   "], [], "a string", [[]]):
        with pytest.raises(InvalidParamError):
            job1.generate(bad, max_new_tokens=2)
    with pytest.raises(InvalidParamError, match="context of 8192"):
        job1.generate([[5] * 8193], max_new_tokens=1)
    with pytest.raises(InvalidParamError, match="max length 256"):
        job1.generate([[5] * 250], max_new_tokens=10)
    for kw in ({"max_new_tokens": 0}, {"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(InvalidParamError):
            job1.generate(["hi"], **{"max_new_tokens": 2, **kw})
    with pytest.raises(InvalidParamError):
        job1.generate([[tok.vocab_size + 3]], max_new_tokens=1)


def test_out_of_memory_is_clean():
    small = make_local_runtime(2, arena=256 << 20)
    try:
        devs = small.devices()
        before = settled_hbm(devs)
        for parallel, n in (("none", 1), ("pp", 2)):
            with pytest.raises(MemoryAllocationError) as e:
                GenerateJob(small, "smollm2", devices=n, parallel=parallel)
            assert e.value.code == 207001
            assert hbm_used(devs) == before
    finally:
        small.close()


def test_kv_cache_that_does_not_fit_is_clean():
    small = make_local_runtime(1, arena=600 << 20)
    try:
        dev = small.device(0)
        before = settled_hbm([dev])
        job = GenerateJob(small, "smollm2", devices=1, max_len=2048)
        try:
            with pytest.raises(AclError) as e:
                job.generate(["x"] * 8, max_new_tokens=2000)
            assert e.value.code == 207001
            assert job.generate(["hi"], max_new_tokens=2)[0].token_ids    # still usable
        finally:
            job.close()
        assert hbm_used([dev]) == before
    finally:
        small.close()


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_generate(monkeypatch, capsys, greedy_1dev):
    import json

    from runtime.cli import main
    monkeypatch.setenv("VNPU_BACKEND", "local")
    monkeypatch.setenv("VNPU_DEVICES", "1")
    assert main(["run", "generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "6",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"][0]["token_ids"] == greedy_1dev[1][:6]
    assert doc["results"][0]["text"].startswith("The capital of France")
    assert doc["stats"]["launches_per_token"] == 303
    assert main(["run", "generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "6",
                 "--json", "--eager"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["token_ids"] == greedy_1dev[1][:6]
    assert main(["run", "generate", "--prompt", "hi", "--devices", "2", "--parallel", "none"]) == 2
    assert "use --devices 1" in capsys.readouterr().err                # refused before the job starts
    assert main(["run", "generate", "--prompt", "", "--max-new-tokens", "2"]) == 2


# ---------------------------------------------------------------------------------------------- the caching pool
def test_job_memory_is_placed_by_lifetime_and_survives_a_defragmentation(prompts, greedy_1dev):
    """The job allocates its weights (and each call's KV history) long-lived, packed at the top of HBM,
    and its activations short-lived, below them; a live defragmentation that moves the weights (a
    long-lived filler above them freed: a hole large enough for a copy) keeps the job working: it
    rebuilds its cached launch descriptors and gives the same greedy tokens."""
    small = make_local_runtime(1, arena=1536 << 20)                # room for the weights twice over
    try:
        dev = small.device(0)
        hi = dev.empty((600 << 20,), "uint8", lifetime="long")      # the top 600 MiB (never touched)
        job = GenerateJob(small, "smollm2", devices=[0], parallel="none", max_len=256)
        try:
            assert [g.token_ids for g in job.generate(prompts, max_new_tokens=16)] == greedy_1dev
            segs = dev.memory_snapshot()
            long_ = [s for s in segs if s["lifetime"] == "long" and s["address"] != hi.ptr]
            short = [s for s in segs if s["lifetime"] == "short"]
            assert sum(s["allocated_size"] for s in long_) > (400 << 20)           # the weights
            assert short and max(s["address"] + s["total_size"] for s in short) <= min(s["address"] for s in long_)
            weights = max(long_, key=lambda s: s["allocated_size"])
            hi.free()
            rep = dev.defragment()
            assert weights["address"] in {old for old, _, _ in rep.moves}           # the weights moved up
            assert rep.bytes_moved >= weights["requested_size"] and rep.arena_fragmentation_after == 0.0
            assert [g.token_ids for g in job.generate(prompts, max_new_tokens=16)] == greedy_1dev
        finally:
            job.close()
            hi.free()                                                # a no-op when already freed
        dev.empty_cache()
        assert dev.mem_info()[0] == dev.mem_info()[1]
    finally:
        small.close()


# ---------------------------------------------------------------------------------------------- the weight cache
def _write_gguf(path, scale: float) -> None:
    """A small GGUF with F32, F16 and Q8_0 tensors and the kinds of metadata a model file carries."""
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 1e5)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "Ġthe", "caf\u00e9", "\U0001F389", "a b"])
    w.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1, 1])
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")
    rng = np.random.default_rng(7)
    q8 = (rng.standard_normal((4, 64)) * scale).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_norm.weight", (rng.standard_normal(64) * scale).astype(np.float32))
    w.add_tensor("output.weight", (rng.standard_normal((3, 8)) * scale).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _same(a, b) -> None:
    """Bit for bit: the same names in order, shapes, float32 bits, metadata and tensor types."""
    assert list(a.tensors) == list(b.tensors) and a.meta == b.meta and a.types == b.types
    for k in a.tensors:
        assert a.tensors[k].dtype == b.tensors[k].dtype == np.float32 and a.tensors[k].shape == b.tensors[k].shape
        assert np.array_equal(a.tensors[k].view(np.uint32), b.tensors[k].view(np.uint32)), k


def test_the_weight_cache_maps_what_a_fresh_dequantisation_gives(tmp_path, monkeypatch):
    """The first load dequantises and writes the entry (directories 0700); every load -- the first too --
    returns read-only arrays over the entry's one mapping, bit-identical to a fresh ``load_gguf``; a
    second writer finds the entry there and succeeds too."""
    import stat

    from runtime.models import weight_cache, weights
    monkeypatch.setenv("VNPU_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "m.gguf"
    _write_gguf(src, 1.0)
    fresh = weights.load_gguf(src)
    assert weight_cache.load(src) is None                           # nothing cached yet
    first = weights.load_gguf_cached.__wrapped__(str(src))          # (around the per-process lru cache)
    entry = weight_cache.entry_dir(src)
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700 and stat.S_IMODE(entry.stat().st_mode) == 0o700
    again = weights.load_gguf_cached.__wrapped__(str(src))
    for g in (first, again):
        _same(g, fresh)
        assert not any(t.flags.writeable for t in g.tensors.values())
    assert first.types["blk.0.attn_q.weight"] == "Q8_0" and first.meta["tokenizer.ggml.tokens"][3] == "\U0001F389"
    assert weight_cache.store(src, fresh.tensors, fresh.meta, fresh.types)      # a racing writer: fine
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]             # one entry, no leftovers


def test_a_changed_file_or_a_damaged_entry_is_never_served_stale(tmp_path, monkeypatch):
    """A rewritten model file is a new entry (its size/mtime are in the key); a truncated blob is ignored,
    the file dequantised again and the entry replaced; an unwritable cache only means no cache."""
    import os

    from runtime.models import weight_cache, weights
    from runtime.models.weights import GgufModel
    monkeypatch.setenv("VNPU_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "m.gguf"
    _write_gguf(src, 1.0)
    old = weights.load_gguf_cached.__wrapped__(str(src))
    st = src.stat()
    _write_gguf(src, 2.0)                                           # same size, other values
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    new, fresh = weights.load_gguf_cached.__wrapped__(str(src)), weights.load_gguf(src)
    _same(new, fresh)
    assert not np.array_equal(new.tensors["blk.0.attn_norm.weight"], old.tensors["blk.0.attn_norm.weight"])
    blob = weight_cache.entry_dir(src) / weight_cache.BLOB
    with open(blob, "r+b") as f:                                    # (edited in place: mapped arrays see it)
        f.truncate(blob.stat().st_size - 4)
    assert weight_cache.load(src) is None
    _same(weights.load_gguf_cached.__wrapped__(str(src)), fresh)
    _same(GgufModel(*weight_cache.load(src)), fresh)                # and the entry was written anew
    (tmp_path / "plain-file").write_text("")
    monkeypatch.setenv("VNPU_CACHE_DIR", str(tmp_path / "plain-file" / "cache"))
    assert weight_cache.store(src, fresh.tensors, fresh.meta, fresh.types) is False
    _same(weights.load_gguf_cached.__wrapped__(str(src)), fresh)
