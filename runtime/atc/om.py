"""The vnpu ``.om`` container: a versioned, self-checking file holding one compiled model.

Layout (little-endian)::

    offset  size  field
    0       8     magic b"\\x93VNPU-OM"
    8       2     format version (1; 2 for a model with image-size gears, which older readers refuse)
    10      2     header size (64)
    12      4     flags (0)
    16      8     manifest offset (64)
    24      8     manifest length
    32      8     weights offset (64-byte aligned, after the manifest)
    40      8     weights length
    48      16    BLAKE2b-128 digest of every byte after the header
    64      ...   manifest: UTF-8 JSON (see runtime/atc/compiler.py for its fields)
    ...     ...   weights: the constant tensors, raw little-endian, 64-byte aligned each

Nothing in it is executable: the manifest is data (kernel names from the device's registry, views,
attributes) validated field by field on load, and the weights are raw arrays.  No pickle.

Refusals (each a :class:`~devices.errors.ModelError` with its CANN code, never a traceback):

- a file of Huawei's ATC (its ``ModelFileHeader`` starts with magic 0x444F4D49, bytes "IMOD"):
  100013 ACL_ERROR_PARSE_MODEL, saying so -- its TBE kernels are for real Ascend hardware;
- anything else without the vnpu magic, or shorter than its header, or whose header's lengths do not
  add up to the file's size (a truncated file): 145006 ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID, as
  GE's own header check reports it;
- a digest mismatch, bad JSON or a manifest field out of range (a corrupt file): 100012
  ACL_ERROR_DESERIALIZE_MODEL;
- a newer format version, or a kernel this vnpu does not have: 100013 ACL_ERROR_PARSE_MODEL.
"""
from __future__ import annotations

import hashlib
import json
import struct

import numpy as np

from devices.errors import (ACL_ERROR_DESERIALIZE_MODEL, ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID,
                            ACL_ERROR_INVALID_PARAM, ACL_ERROR_PARSE_MODEL, ModelError)
from devices.kernel import DTYPES, lookup

MAGIC = b"\x93VNPU-OM"
#: the newest format this vnpu reads and writes: 2 adds image-size gears (``dynamic_hw``, gears keyed by
#: ``hw``); a model without them is still written as format 1, readable by older vnpus
FORMAT_VERSION = 2
HEADER = struct.Struct("<8sHHIQQQQ16s")
HEADER_SIZE = 64
ALIGN = 64
#: Huawei ATC's ModelFileHeader magic (0x444F4D49, little-endian bytes "IMOD"), 256-byte header
ATC_MAGIC = b"IMOD"
ATC_HEADER_SIZE = 256

assert HEADER.size == HEADER_SIZE


def _pad(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _digest(body) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


def format_version(dynamic_hw) -> int:
    """The format a model needs: 2 with image-size gears, else 1."""
    return 2 if dynamic_hw else 1


def gear_key(gear: dict):
    """A manifest gear's key: its (h, w) on an image-size model, else its batch (None when static)."""
    hw = gear.get("hw")
    return (int(hw[0]), int(hw[1])) if hw else gear["batch"]


def write_om(manifest: dict, weights: bytes) -> bytes:
    """The container bytes of ``manifest`` (JSON-able) and the weights blob."""
    man = json.dumps(manifest, separators=(",", ":"), sort_keys=False).encode("utf-8")
    man_off = HEADER_SIZE
    w_off = _pad(man_off + len(man))
    body = bytearray(w_off - HEADER_SIZE + len(weights))
    body[:len(man)] = man
    body[w_off - HEADER_SIZE:] = weights
    header = HEADER.pack(MAGIC, format_version(manifest.get("dynamic_hw")), HEADER_SIZE, 0, man_off, len(man), w_off,
                         len(weights), _digest(body))
    return header + bytes(body)


def describe_atc_header(data: bytes) -> str:
    """What a Huawei ATC header says about its model (name, platform version), for the refusal message."""
    def text(a, b):
        return bytes(data[a:b]).split(b"\0", 1)[0].decode("ascii", "replace").strip() if len(data) >= b else ""
    name, platform = text(84, 116), text(160, 180)
    parts = [f"model name '{name}'" if name else "", f"platform version '{platform}'" if platform else ""]
    return ", ".join(p for p in parts if p)


def read_om(data) -> tuple[dict, memoryview]:
    """Parse and check a container: ``(manifest, weights)``; raises :class:`ModelError`."""
    try:
        mv = memoryview(data).cast("B")
    except TypeError:
        raise ModelError(f"a model is bytes, not {type(data).__name__}", code=ACL_ERROR_INVALID_PARAM) from None
    n = len(mv)
    if n >= 4 and bytes(mv[:4]) == ATC_MAGIC:
        info = describe_atc_header(bytes(mv[:ATC_HEADER_SIZE]))
        raise ModelError("this .om was built by Huawei's ATC for real Ascend hardware (ModelFileHeader magic "
                         f"0x444F4D49{', ' + info if info else ''}): its TBE kernels cannot run on vnpu. Convert "
                         "the source model with `vnpu atc --framework 5 --model m.onnx --output m` instead",
                         code=ACL_ERROR_PARSE_MODEL)
    if n < HEADER_SIZE or bytes(mv[:8]) != MAGIC:
        what = f"{n} bytes, too short for the {HEADER_SIZE}-byte header" if n < HEADER_SIZE else \
            f"magic {bytes(mv[:8])!r} is not vnpu's {MAGIC!r}"
        raise ModelError(f"not a vnpu .om file ({what})", code=ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)
    _, version, hsize, _flags, m_off, m_len, w_off, w_len, digest = HEADER.unpack(bytes(mv[:HEADER_SIZE]))
    if version > FORMAT_VERSION or version < 1:
        raise ModelError(f".om format version {version} is not readable by this vnpu (it reads version "
                         f"{FORMAT_VERSION}); rebuild the model with this vnpu's atc", code=ACL_ERROR_PARSE_MODEL)
    if hsize != HEADER_SIZE or m_off != HEADER_SIZE or w_off < m_off + m_len or w_off % ALIGN or w_off + w_len != n:
        raise ModelError(f".om header and file size disagree (header: manifest {m_len} B at {m_off}, weights "
                         f"{w_len} B at {w_off}, i.e. {w_off + w_len} B; the file has {n} B): truncated or not "
                         "an .om file", code=ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID)
    if _digest(mv[HEADER_SIZE:]) != digest:
        raise ModelError(".om is corrupt: its content does not match the digest in its header",
                         code=ACL_ERROR_DESERIALIZE_MODEL)
    try:
        manifest = json.loads(bytes(mv[m_off:m_off + m_len]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f".om manifest is not valid JSON: {e}", code=ACL_ERROR_DESERIALIZE_MODEL) from None
    weights = mv[w_off:w_off + w_len]
    validate_manifest(manifest, len(weights))
    return manifest, weights


# ---------------------------------------------------------------------------------------------- validation
class _Bad(Exception):
    pass


def _need(cond, where: str, msg: str) -> None:
    if not cond:
        raise _Bad(f"{where}: {msg}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shape(v, where):
    _need(isinstance(v, list) and len(v) <= 16 and all(_is_int(d) and 0 <= d < (1 << 40) for d in v), where,
          f"bad shape {v!r}")
    return tuple(v)


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _view(v, where, regions):
    _need(isinstance(v, list) and len(v) == 4, where, "a view is [region, offset, shape, dtype]")
    region, off, shape, dtype = v
    _need(region in regions, where, f"unknown region {region!r}")
    _need(_is_int(off) and off >= 0, where, f"bad offset {off!r}")
    _need(dtype in DTYPES, where, f"unknown dtype {dtype!r}")
    shape = _shape(shape, where)
    _need(off + _nbytes(shape, dtype) <= regions[region], where,
          f"{region}[{off}:{off + _nbytes(shape, dtype)}] is outside the region ({regions[region]} B)")


def _attr_ok(v) -> bool:
    scalar = (int, float, bool, str, type(None))
    return isinstance(v, scalar) or (isinstance(v, list) and len(v) <= 64 and all(isinstance(x, scalar[:4]) for x in v))


def _io(v, where, dynamic: bool):
    _need(isinstance(v, dict) and isinstance(v.get("name"), str), where, "needs a name")
    _need(v.get("dtype") in DTYPES or (dynamic and v.get("dtype") == "uint64"), where, f"bad dtype {v.get('dtype')!r}")
    _need(isinstance(v.get("dims"), list) and all(_is_int(d) and d >= -1 for d in v["dims"]), where, "bad dims")


def validate_manifest(m, weights_size: int) -> None:
    """Check every field a loader uses (types, ranges, offsets inside their regions, known kernels)."""
    try:
        _need(isinstance(m, dict) and m.get("format") == "vnpu-om", "manifest", "not a vnpu-om manifest")
        for key in ("soc_version", "name"):
            _need(isinstance(m.get(key), str), "manifest", f"{key} must be a string")
        ins, outs = m.get("inputs"), m.get("outputs")
        _need(isinstance(ins, list) and isinstance(outs, list) and outs, "manifest", "inputs/outputs lists")
        gears_b = m.get("dynamic_batch")
        _need(isinstance(gears_b, list) and all(_is_int(b) and b > 0 for b in gears_b), "manifest", "dynamic_batch")
        gears_hw = m.get("dynamic_hw", [])
        _need(isinstance(gears_hw, list) and all(isinstance(g, list) and len(g) == 2 and all(_is_int(v) and v > 0
                                                                                          for v in g)
                                                 for g in gears_hw), "manifest", "dynamic_hw")
        _need(not (gears_b and gears_hw), "manifest", "both batch and image-size gears")
        keys = gears_b or gears_hw
        for i, v in enumerate(ins):
            _io(v, f"inputs[{i}]", bool(keys))
        for i, v in enumerate(outs):
            _io(v, f"outputs[{i}]", False)
        w = m.get("weights")
        _need(isinstance(w, dict) and w.get("size") == weights_size, "weights", "size differs from the blob")
        ws = m.get("workspace_size")
        _need(_is_int(ws) and 0 <= ws < (1 << 40), "manifest", "workspace_size")
        gears = m.get("gears")
        _need(isinstance(gears, list) and len(gears) == max(1, len(keys)), "manifest",
              "one gear per dynamic batch size or image size (or one)")
        n_real_in = len(ins) - (1 if keys else 0)
        for gi, g in enumerate(gears):
            where = f"gears[{gi}]"
            _need(isinstance(g, dict), where, "not an object")
            _need(g.get("batch") == (gears_b[gi] if gears_b else None), where, "batch differs from dynamic_batch")
            _need(g.get("hw") == (gears_hw[gi] if gears_hw else None), where, "hw differs from dynamic_hw")
            gws = g.get("workspace_size")
            _need(_is_int(gws) and 0 <= gws <= ws, where, "workspace_size")
            regions = {"ws": gws, "w": weights_size}
            _need(isinstance(g.get("inputs"), list) and len(g["inputs"]) == n_real_in, where, "inputs")
            _need(isinstance(g.get("outputs"), list) and len(g["outputs"]) == len(outs), where, "outputs")
            for i, v in enumerate(g["inputs"]):
                _view(v, f"{where}.inputs[{i}]", {"ws": gws})
            for i, v in enumerate(g["outputs"]):
                _view(v, f"{where}.outputs[{i}]", regions)
            bufs = g.get("buffers")
            _need(isinstance(bufs, list), where, "buffers")
            for i, b in enumerate(bufs):
                _need(isinstance(b, list) and len(b) == 4 and all(_is_int(x) for x in b) and b[0] >= 0 and
                      b[1] >= 0 and b[0] + b[1] <= gws, f"{where}.buffers[{i}]", "bad [offset, nbytes, first, last]")
            steps = g.get("steps")
            _need(isinstance(steps, list), where, "steps")
            for si, s in enumerate(steps):
                sw = f"{where}.steps[{si}]"
                _need(isinstance(s, dict) and isinstance(s.get("kernel"), str), sw, "needs a kernel")
                for key in ("inputs", "outputs"):
                    _need(isinstance(s.get(key), list) and len(s[key]) <= 64, sw, key)
                    for vi, v in enumerate(s[key]):
                        _view(v, f"{sw}.{key}[{vi}]", regions)
                attrs = s.get("attrs")
                _need(isinstance(attrs, dict) and all(isinstance(k, str) and _attr_ok(v) for k, v in attrs.items()),
                      sw, "attrs must map names to scalars or flat lists")
                _need(_is_int(s.get("block_dim")) and 1 <= s["block_dim"] <= 65535, sw, "block_dim")
    except _Bad as e:
        raise ModelError(f".om manifest is corrupt: {e}", code=ACL_ERROR_DESERIALIZE_MODEL) from None
    for g in m["gears"]:
        for s in g["steps"]:
            try:
                lookup(s["kernel"])
            except Exception:  # noqa: BLE001 - KernelError: unknown name
                raise ModelError(f".om uses kernel {s['kernel']!r}, which this vnpu does not have (built by a newer "
                                 "vnpu?)", code=ACL_ERROR_PARSE_MODEL) from None
