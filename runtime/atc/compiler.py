"""The model compiler behind ``vnpu atc``: ONNX in, a :class:`CompiledModel` (an ``.om``) out.

Per gear (one for a static model; one per ``--dynamic_batch_size`` or ``--dynamic_image_size`` entry
otherwise, like ATC's multi-batch models) the pipeline is: instantiate the ONNX graph at concrete input shapes
(:mod:`.onnx_import`), infer shapes and fold constants (:mod:`.fold`), fuse operator patterns
(:mod:`.fuse`), lower to device kernels (:mod:`.lower`, through the op table of :mod:`.ops`) and plan
the workspace (:mod:`.memplan`).  The unfused graph is lowered too, only to report what fusion saved.
Constants of all gears are packed once into the weights blob (identical arrays are stored once).

The manifest (JSON, see :mod:`.om` for the container) holds::

    format, version, producer, name, soc_version, source {framework, file, opset, bytes}
    inputs  [{name, dtype, dims (-1: a dynamic axis), format}]   (+ ascend_mbatch_shape_data)
    outputs [{name, dtype, dims (-1 where the gears differ)}]
    dynamic_batch [gears]  (batch gears; empty for a static or image-size model)
    dynamic_hw [[h, w]]    (image-size gears; empty otherwise; a non-empty one makes the file format 2)
    weights {size, tensors [{name, offset, shape, dtype}]}
    workspace_size  (the largest gear's plan)
    gears [{batch, hw, workspace_size,           (batch: the batch gear or null; hw: [h, w] or null)
            inputs  [[region, offset, shape, dtype]]      model inputs staged in the workspace
            outputs [[region, offset, shape, dtype]]      where each output is after the steps
            buffers [[offset, nbytes, first, last]]       the memory plan (step lifetimes)
            steps   [{kernel, inputs, outputs, attrs, block_dim, node, modeled_us}],
                     (block_dim: the tiling for the SoC's cores that modeled_us is priced with)
            stats {...}}]
    report {...}

A view is ``[region, offset, shape, dtype]`` with region ``"ws"`` (the workspace allocation) or ``"w"``
(the weights allocation).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.errors import ACL_ERROR_GE_INTERNAL_ERROR, ACL_ERROR_GE_PARAM_INVALID, AclError, AtcError

from . import aipp, fold, fuse, lower, memplan, om
from .onnx_import import OnnxSource, instantiate, load_onnx, resolve_shapes
from .options import DYNAMIC_INPUT_NAME, HW_AXES, CompileOptions
from .program import WEIGHT, Program

PRODUCER = "vnpu atc 0.1"
FRAMEWORK_ONNX = 5


@dataclass
class GearBuild:
    key: int | tuple[int, int] | None     #: the batch size, the (h, w), or None (static)
    program: Program
    plan: memplan.MemoryPlan
    before: dict                      #: launches / intermediate bytes of the unfused graph
    folded: int
    pruned: int
    fused: dict


@dataclass
class CompiledModel:
    manifest: dict
    weights: bytes
    gears: list[GearBuild] = field(default_factory=list)

    @property
    def report(self) -> dict:
        return self.manifest["report"]

    def to_bytes(self) -> bytes:
        return om.write_om(self.manifest, self.weights)

    def save(self, path: str | Path) -> Path:
        """Write the .om (to a temporary name first, so a failed write leaves no partial file)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_bytes(self.to_bytes())
        tmp.replace(p)
        return p


# ---------------------------------------------------------------------------------------------- gears
def _gear_shapes(src: OnnxSource, opts: CompileOptions) -> tuple[dict, list]:
    """The inputs' dims (-1 on the dynamic axes) and the names of the inputs the gears set."""
    shapes = resolve_shapes(src, opts.shapes())
    dyn = [name for name, dims in shapes.items() if -1 in dims]
    if opts.dynamic_hw:                                   # make_options checked the axes (E10019)
        return shapes, dyn
    if not opts.dynamic_batch:
        if dyn:
            raise AtcError("E10011", ACL_ERROR_GE_PARAM_INVALID,
                           shape=f"{dyn[0]}:{','.join(map(str, shapes[dyn[0]]))}", result=-1)
        return shapes, dyn
    for name in dyn:
        if -1 in shapes[name][1:]:
            raise AtcError("E10018", ACL_ERROR_GE_PARAM_INVALID, shape=",".join(map(str, shapes[name])), index=name)
    if not dyn:
        raise AtcError("E10031", ACL_ERROR_GE_PARAM_INVALID)
    return shapes, dyn


def concrete(dims, key) -> tuple[int, ...]:
    """``dims`` at gear ``key``: -1 on axis 0 -> the batch, -1 on H and W -> the (h, w)."""
    if key is None:
        return tuple(dims)
    if isinstance(key, tuple):
        return tuple(key[HW_AXES.index(i)] if i in HW_AXES and d == -1 else d for i, d in enumerate(dims))
    return tuple(key if (i == 0 and d == -1) else d for i, d in enumerate(dims))


def _build_gear(src: OnnxSource, concrete_shapes: dict, key, opts: CompileOptions) -> GearBuild:
    g = instantiate(src, concrete_shapes)
    counts = fold.propagate(g, opts.fold_limit)
    unfused = lower.lower_graph(g, opts.soc_version, opts.quant)
    fused = {}
    prog = unfused
    if opts.fuse:
        fused = fuse.fuse(g)
        prog = lower.lower_graph(g, opts.soc_version, opts.quant)
    before = {"launches": unfused.launches, "intermediate_bytes": unfused.intermediate_bytes,
              "modeled_us": round(unfused.modeled_s * 1e6, 3)}
    return GearBuild(key, prog, memplan.plan_memory(prog, opts.reuse_memory), before, counts["folded"],
                     counts["pruned"], fused)


def _gear_sources(src: OnnxSource, shapes: dict, opts: CompileOptions) -> tuple[list, dict, list]:
    """Per gear (key, source, concrete input shapes); the declared shapes (-1 on dynamic axes) of the
    source's inputs; the manifest's AIPP entries.  AIPP is compiled once for a static or batch-gear model
    and per gear for an image-size model (its picture size is the gear's)."""
    if not opts.aipp:
        return [(k, src, {n: concrete(d, k) for n, d in shapes.items()}) for k in opts.gears], shapes, []
    if opts.dynamic_hw:
        per, entries = [], []
        for k in opts.gears:
            s_k, shapes_k, entries = aipp.apply(src, {n: concrete(d, k) for n, d in shapes.items()}, opts.aipp,
                                                False, dynamic_hw=True)
            per.append((k, s_k, shapes_k))
        declared = {n: d for n, d in shapes.items() if n not in {e["input"] for e in entries}}
        return per, declared, entries
    src, shapes, entries = aipp.apply(src, shapes, opts.aipp, bool(opts.dynamic_batch))
    return [(k, src, {n: concrete(d, k) for n, d in shapes.items()}) for k in opts.gears], shapes, entries


# ---------------------------------------------------------------------------------------------- weights
class _WeightPack:
    """The weights blob: each distinct constant once, 64-byte aligned."""

    def __init__(self):
        self.parts: list[bytes] = []
        self.size = 0
        self.index: dict[tuple, int] = {}
        self.tensors: list[dict] = []
        self._by_id: dict[int, tuple[np.ndarray, int]] = {}     # arrays shared by the gears: hashed once

    def add(self, arr: np.ndarray, name: str) -> int:
        seen = self._by_id.get(id(arr))
        if seen is not None and seen[0] is arr:
            return seen[1]
        off = self._add(arr, name)
        self._by_id[id(arr)] = (arr, off)
        return off

    def _add(self, arr: np.ndarray, name: str) -> int:
        a = np.asarray(arr, order="C")
        key = (a.dtype.name, a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest())
        off = self.index.get(key)
        if off is None:
            pad = -self.size % om.ALIGN
            if pad:
                self.parts.append(b"\0" * pad)
                self.size += pad
            off = self.size
            raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
            self.parts.append(raw)
            self.size += len(raw)
            self.index[key] = off
            self.tensors.append({"name": name, "offset": off, "shape": list(a.shape), "dtype": a.dtype.name})
        return off

    def blob(self) -> bytes:
        return b"".join(self.parts)


def _jsonable(v):
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _gear_manifest(gb: GearBuild, pack: _WeightPack) -> dict:
    prog, plan = gb.program, gb.plan
    woff = {bid: pack.add(arr, prog.buffers[bid].name) for bid, arr in prog.weights.items()}

    def view(v):
        kind = prog.buffers[v.buf].kind
        base = woff[v.buf] if kind == WEIGHT else plan.offset(v.buf)
        return ["w" if kind == WEIGHT else "ws", base + v.offset, list(v.shape), v.dtype]

    steps = [{"kernel": s.kernel, "inputs": [view(v) for v in s.inputs], "outputs": [view(v) for v in s.outputs],
              "attrs": {k: _jsonable(a) for k, a in s.attrs.items()}, "block_dim": s.block_dim, "node": s.node,
              "modeled_us": round(s.modeled_s * 1e6, 3)} for s in prog.steps]
    buffers = [[p.offset, p.nbytes, p.first, p.last] for p in sorted(plan.placements.values(), key=lambda p: p.buf)]
    stats = {
        "launches_before_fusion": gb.before["launches"], "launches": prog.launches,
        "intermediate_bytes_before_fusion": gb.before["intermediate_bytes"],
        "intermediate_bytes": prog.intermediate_bytes,
        "plan_peak_bytes": plan.size, "plan_no_reuse_bytes": plan.naive,
        "folded_nodes": gb.folded, "pruned_nodes": gb.pruned, "fused": gb.fused,
        "modeled_us_before_fusion": gb.before["modeled_us"], "modeled_us": round(prog.modeled_s * 1e6, 3),
        "kernels": prog.kernel_counts(),
    }
    hw = list(gb.key) if isinstance(gb.key, tuple) else None
    return {"batch": None if hw else gb.key, "hw": hw, "workspace_size": plan.size,
            "inputs": [view(v) for v in prog.inputs],
            "outputs": [view(v) for v in prog.outputs], "buffers": buffers, "steps": steps, "stats": stats}


def _io_dims(per_gear: list[tuple], declared: tuple | None = None) -> list[int]:
    """-1 where the gears differ or the declared dims say -1."""
    first = per_gear[0]
    dyn = declared if declared is not None and len(declared) == len(first) else ()
    return [-1 if (dyn and dyn[i] == -1) or any(s[i] != d for s in per_gear) else d for i, d in enumerate(first)]


# ---------------------------------------------------------------------------------------------- entry point
def compile_model(source, options: CompileOptions | None = None) -> CompiledModel:
    """Convert an ONNX model (path, bytes or ModelProto) with ``options``; raises :class:`AtcError`
    (an unexpected failure inside the compiler is E19999 / 545000, never a bare exception)."""
    try:
        return _compile(source, options or CompileOptions())
    except AclError:
        raise
    except Exception as e:  # noqa: BLE001
        raise AtcError("E19999", ACL_ERROR_GE_INTERNAL_ERROR, reason=f"{type(e).__name__}: {e}") from None


def _compile(source, opts: CompileOptions) -> CompiledModel:
    src = load_onnx(source)
    shapes, _ = _gear_shapes(src, opts)
    per_gear, declared, aipp_entries = _gear_sources(src, shapes, opts)
    builds = [_build_gear(s_k, shapes_k, k, opts) for k, s_k, shapes_k in per_gear]
    pack = _WeightPack()
    gears = [_gear_manifest(gb, pack) for gb in builds]
    src = per_gear[-1][1]
    dynamic = bool(opts.dynamic_batch or opts.dynamic_hw)
    inputs = []
    for spec in src.inputs:
        dims = _io_dims([shapes_k[spec.name] for _, _, shapes_k in per_gear], declared.get(spec.name))
        inputs.append({"name": spec.name, "dtype": spec.dtype, "dims": dims,
                       "format": "NCHW" if len(dims) == 4 else "ND"})
    if dynamic:
        inputs.append({"name": DYNAMIC_INPUT_NAME, "dtype": "uint64", "dims": [2 if opts.dynamic_hw else 1],
                       "format": "ND"})
    outputs = []
    for i, name in enumerate(src.outputs):
        per = [tuple(g["outputs"][i][2]) for g in gears]
        outputs.append({"name": name, "dtype": gears[0]["outputs"][i][3], "dims": _io_dims(per),
                        "format": "NCHW" if len(per[0]) == 4 else "ND"})
    g0 = builds[-1]
    report = {
        "soc_version": opts.soc_version, "gears": [g["hw"] or g["batch"] for g in gears],
        "launches_before_fusion": g0.before["launches"], "launches_after_fusion": g0.program.launches,
        "intermediate_bytes_before_fusion": g0.before["intermediate_bytes"],
        "intermediate_bytes_after_fusion": g0.program.intermediate_bytes,
        "plan_peak_bytes": g0.plan.size, "plan_no_reuse_bytes": g0.plan.naive,
        "workspace_bytes": max(g["workspace_size"] for g in gears), "weights_bytes": pack.size,
        "folded_nodes": g0.folded, "fused": g0.fused,
        "modeled_us": gears[-1]["stats"]["modeled_us"], "modeled_us_before_fusion": g0.before["modeled_us"],
    }
    dynamic_hw = [list(k) for k in opts.dynamic_hw]
    manifest = {
        "format": "vnpu-om", "version": om.format_version(dynamic_hw), "producer": PRODUCER, "name": src.name,
        "soc_version": opts.soc_version,
        "source": {"framework": FRAMEWORK_ONNX, "file": Path(src.origin).name, "opset": src.opset,
                   "bytes": src.nbytes},
        "inputs": inputs, "outputs": outputs, "dynamic_batch": list(opts.dynamic_batch), "dynamic_hw": dynamic_hw,
        "weights": {"size": pack.size, "tensors": pack.tensors},
        "workspace_size": max(g["workspace_size"] for g in gears),
        "gears": gears, "report": report,
    }
    if aipp_entries:
        manifest["aipp"] = aipp_entries
    return CompiledModel(manifest, pack.blob(), builds)
