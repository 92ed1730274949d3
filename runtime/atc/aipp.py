"""AIPP in ``vnpu atc --insert_op_conf aipp.cfg``: the image stage compiled in front of a model input.

The config is ATC's (protobuf text): one ``aipp_op { key : value ... }`` block per model input it
applies to (``related_input_rank``, default 0).  ``aipp_mode : static`` fixes every parameter at compile
time; ``aipp_mode : dynamic`` (with ``max_src_image_size``) leaves them to execution time: the model gets
one more input, ``ascend_dynamic_aipp_data`` (last), which ``acl.mdl.set_input_aipp`` fills from an
``acl.mdl.create_aipp`` parameter set.

The transformed input takes the picture bytes instead of the tensor: uint8 ``[N, bytes]`` (``bytes`` =
one ``src_image_size_w`` x ``src_image_size_h`` picture in ``input_format``, or ``max_src_image_size``
when dynamic); the kernel :mod:`devices.ops.aipp` turns it into the model's NCHW tensor (crop, R/B or U/V
swap, colour-space conversion, padding, ``(pixel - mean_chn - min_chn) * var_reci_chn``).  Defaults are
those of CANN's ``insert_op.proto`` (the BT.601 video-range YUV->RGB matrix, biases 16/128/128,
``var_reci`` 1); ``src_image_size`` 0 means the model input's size and a crop size 0 the model's.
Refusals are ATC's: E10001 naming the key (an unknown key or value, a picture whose crop and padding do
not give the model input's H and W, odd YUV420SP sizes), E10055 for what vnpu does not do (``resize``
scaling, dynamic AIPP with a dynamic batch or dynamic image size).

With ``--dynamic_image_size`` a static AIPP is compiled once per gear at that gear's picture size: as
CANN requires, its ``src_image_size_w`` / ``src_image_size_h`` must be 0 (the gear's size) and crop and
padding off (E10001 naming the key otherwise); the model input then takes the gear's picture bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from devices.errors import ACL_ERROR_GE_PARAM_INVALID, AtcError
from devices.ops.aipp import COL, FIELDS, FORMATS, PARAMS, image_bytes

from .ir import Node
from .onnx_import import InputSpec, OnnxSource

#: the extra input a dynamic-AIPP model reads its parameters from (ACL_DYNAMIC_AIPP_NAME)
DYNAMIC_AIPP_NAME = "ascend_dynamic_aipp_data"
#: bytes of one picture's parameters in that input (float64 [PARAMS])
PARAMS_BYTES = PARAMS * 8
FORMAT_CODES = {name: code for code, (name, _) in FORMATS.items()}
#: insert_op.proto defaults (BT.601 video range YUV -> RGB)
DEFAULTS = {"matrix_r0c0": 298, "matrix_r0c1": 516, "matrix_r0c2": 0, "matrix_r1c0": 298, "matrix_r1c1": -100,
            "matrix_r1c2": -208, "matrix_r2c0": 298, "matrix_r2c1": 0, "matrix_r2c2": 409,
            "input_bias_0": 16, "input_bias_1": 128, "input_bias_2": 128,
            "output_bias_0": 16, "output_bias_1": 128, "output_bias_2": 128,
            "var_reci_chn_0": 1.0, "var_reci_chn_1": 1.0, "var_reci_chn_2": 1.0, "var_reci_chn_3": 1.0}
#: keys accepted only at these values (features vnpu's AIPP does not have)
ONLY = {"resize": ("false", "0"), "single_line_mode": ("false", "0"), "ax_swap_switch": ("false", "0")}
OTHER_KEYS = ("aipp_mode", "related_input_rank", "max_src_image_size", *ONLY)
_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\S+?)\s*$")


@dataclass(frozen=True)
class AippConfig:
    """One ``aipp_op`` block: the input it applies to, static or dynamic, and its parameters (FIELDS)."""
    related_input_rank: int = 0
    mode: str = "static"
    max_src_image_size: int = 0
    values: dict = field(default_factory=dict)

    def row(self, chw: tuple[int, int, int]) -> np.ndarray:
        """The kernel's parameter row (float64 [PARAMS]) for a model input of ``chw``."""
        v = dict(DEFAULTS, **self.values)
        c, h, w = chw
        v.setdefault("src_image_size_w", 0)
        v.setdefault("src_image_size_h", 0)
        v["src_image_size_w"] = v["src_image_size_w"] or w
        v["src_image_size_h"] = v["src_image_size_h"] or h
        if v.get("crop"):
            v["crop_size_w"] = v.get("crop_size_w") or w
            v["crop_size_h"] = v.get("crop_size_h") or h
        r = np.zeros(PARAMS, np.float64)
        for k, x in v.items():
            if k in COL:
                r[COL[k]] = float(x)
        return r


def parse(text: str, origin: str = "--insert_op_conf") -> tuple[AippConfig, ...]:
    """The ``aipp_op`` blocks of an AIPP config (E10001 naming what is wrong)."""
    blocks, cur = [], None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if re.fullmatch(r"aipp_op\s*\{", line):
            if cur is not None:
                raise _bad(origin, f"line {n}: aipp_op blocks do not nest")
            cur = {}
            continue
        if line == "}":
            if cur is None:
                raise _bad(origin, f"line {n}: '}}' without aipp_op {{")
            blocks.append(_config(origin, cur))
            cur = None
            continue
        m = _LINE.match(line)
        if cur is None or not m:
            raise _bad(origin, f"line {n}: expected 'key : value' inside aipp_op {{ ... }}, got {raw.strip()!r}")
        if m.group(1) in cur:
            raise _bad(origin, f"line {n}: {m.group(1)} is given twice")
        cur[m.group(1)] = m.group(2)
    if cur is not None or not blocks:
        raise _bad(origin, "the file must hold complete aipp_op { ... } blocks")
    ranks = [b.related_input_rank for b in blocks]
    if len(set(ranks)) != len(ranks):
        raise _bad(origin, f"two aipp_op blocks for the same related_input_rank ({ranks})")
    return tuple(blocks)


def _bad(origin: str, reason: str) -> AtcError:
    return AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=origin, parameter="--insert_op_conf", reason=reason)


def _number(origin: str, key: str, text: str, integer: bool):
    t = text.lower()
    if t in ("true", "false"):
        return int(t == "true")
    try:
        return int(t) if integer else float(t)
    except ValueError:
        raise _bad(origin, f"{key} : {text} is not {'an integer' if integer else 'a number'}") from None


def _config(origin: str, kv: dict) -> AippConfig:
    unknown = [k for k in kv if k not in COL and k not in OTHER_KEYS]
    if unknown:
        raise _bad(origin, f"vnpu AIPP has no key {unknown[0]} (it has {', '.join(FIELDS + OTHER_KEYS)})")
    for k, ok in ONLY.items():
        if k in kv and kv[k].lower() not in ok:
            raise AtcError("E10055", ACL_ERROR_GE_PARAM_INVALID, reason=f"AIPP {k} : {kv[k]} (vnpu's AIPP has no "
                                                                        f"{k.replace('_', ' ')})")
    mode = kv.get("aipp_mode", "static").lower()
    if mode not in ("static", "dynamic"):
        raise _bad(origin, f"aipp_mode : {kv['aipp_mode']} must be static or dynamic")
    values = {}
    for k, text in kv.items():
        if k == "input_format":
            if text not in FORMAT_CODES:
                raise _bad(origin, f"input_format : {text} is not one of {', '.join(FORMAT_CODES)}")
            values[k] = FORMAT_CODES[text]
        elif k in COL:
            values[k] = _number(origin, k, text, integer=not k.startswith(("mean", "min", "var")))
    if mode == "static" and "input_format" not in values:
        raise _bad(origin, "a static aipp_op needs input_format")
    rank = _number(origin, "related_input_rank", kv.get("related_input_rank", "0"), True)
    mx = _number(origin, "max_src_image_size", kv.get("max_src_image_size", "0"), True)
    if mode == "dynamic" and mx <= 0:
        raise _bad(origin, "a dynamic aipp_op needs max_src_image_size (bytes of the largest picture)")
    if mode == "dynamic" and set(values) - {"input_format"}:
        raise _bad(origin, "a dynamic aipp_op takes its parameters at execution (acl.mdl.set_input_aipp): only "
                           "aipp_mode, related_input_rank and max_src_image_size belong in it")
    return AippConfig(rank, mode, mx, values)


def load(path: str) -> tuple[AippConfig, ...]:
    p = Path(path)
    if not p.is_file():
        raise _bad(path, "the file does not exist or is not a regular file")
    return parse(p.read_text(errors="replace"), path)


def _check_dynamic_hw(cfg: AippConfig) -> None:
    """CANN's rules for AIPP with --dynamic_image_size (static only here; src size 0, no crop/padding)."""
    if cfg.mode == "dynamic":
        raise AtcError("E10055", ACL_ERROR_GE_PARAM_INVALID,
                       reason="vnpu does not combine dynamic AIPP with --dynamic_image_size (static AIPP only)")
    for key in ("src_image_size_w", "src_image_size_h"):
        if cfg.values.get(key):
            raise _bad("--insert_op_conf", f"{key} : {cfg.values[key]} with --dynamic_image_size: it must be 0 "
                                           "(each gear's picture is the gear's size)")
    for key in ("crop", "padding"):
        if cfg.values.get(key):
            raise _bad("--insert_op_conf", f"{key} : true with --dynamic_image_size: crop and padding must be off")


# ---------------------------------------------------------------------------------------------- the graph
def check_row(row: np.ndarray, chw: tuple[int, int, int], where: str) -> None:
    """ValueError unless the parameters ``row`` turn their picture into a ``chw`` input."""
    fmt, w, h = int(row[COL["input_format"]]), int(row[COL["src_image_size_w"]]), int(row[COL["src_image_size_h"]])
    c, mh, mw = chw
    if fmt not in FORMATS:
        raise ValueError(f"{where}: input format {fmt} is not one of {sorted(FORMATS)} (aclAippInputFormat)")
    if w <= 0 or h <= 0:
        raise ValueError(f"{where}: the source picture size {w}x{h} is not set (src_image_size)")
    if fmt == 1 and (w % 2 or h % 2 or (row[COL["crop"]] and (row[COL["load_start_pos_w"]] % 2 or
                                                                 row[COL["load_start_pos_h"]] % 2))):
        raise ValueError(f"{where}: YUV420SP_U8 needs even picture sizes and crop starts")
    if row[COL["crop"]]:
        x0, y0 = row[COL["load_start_pos_w"]], row[COL["load_start_pos_h"]]
        cw, ch = row[COL["crop_size_w"]], row[COL["crop_size_h"]]
        if x0 < 0 or y0 < 0 or cw <= 0 or ch <= 0 or x0 + cw > w or y0 + ch > h:
            raise ValueError(f"{where}: crop {cw:.0f}x{ch:.0f} at ({x0:.0f}, {y0:.0f}) does not fit the {w}x{h} "
                             "picture")
        w, h = int(cw), int(ch)
    if row[COL["padding"]]:
        w += int(row[COL["left_padding_size"]] + row[COL["right_padding_size"]])
        h += int(row[COL["top_padding_size"]] + row[COL["bottom_padding_size"]])
    channels = FORMATS[fmt][1]
    if (h, w) != (mh, mw) or channels != c:
        raise ValueError(f"{where}: the picture becomes {w}x{h} with {channels} channels after crop and padding; "
                         f"the model input is {mw}x{mh} with {c}")


def apply(src: OnnxSource, shapes: dict, configs: tuple[AippConfig, ...],
          dynamic_batch: bool, dynamic_hw: bool = False) -> tuple[OnnxSource, dict, list[dict]]:
    """``src`` with each configured input taking pictures (see the module docstring); -> (source, shapes,
    the manifest's ``aipp`` entries).  ``dynamic_hw``: ``shapes`` are one image-size gear's."""
    inputs, nodes, consts = list(src.inputs), [n.copy() for n in src.nodes], dict(src.consts)
    outputs, shapes, entries = list(src.outputs), dict(shapes), []
    for cfg in configs:
        if not 0 <= cfg.related_input_rank < len(src.inputs):
            raise _bad("--insert_op_conf", f"related_input_rank {cfg.related_input_rank} is not an input of the "
                                           f"model (it has {len(src.inputs)})")
        spec = src.inputs[cfg.related_input_rank]
        dims = shapes[spec.name]
        if len(dims) != 4 or spec.dtype not in ("float32", "float16"):
            raise _bad("--insert_op_conf", f"AIPP needs a float NCHW input; {spec.name} is {spec.dtype} {list(dims)}")
        chw = tuple(int(d) for d in dims[1:])
        tensor = f"{spec.name}:aipp"
        for n in nodes:
            n.inputs = [tensor if i == spec.name else i for i in n.inputs]
        outputs = [tensor if o == spec.name else o for o in outputs]
        if dynamic_hw:
            _check_dynamic_hw(cfg)
        if cfg.mode == "static":
            row = cfg.row(chw)            # type: ignore[arg-type]
            try:
                check_row(row, chw, f"aipp_op for input {cfg.related_input_rank}")  # type: ignore[arg-type]
            except ValueError as e:
                raise _bad("--insert_op_conf", str(e)) from None
            nbytes = image_bytes(int(row[COL["input_format"]]), int(row[COL["src_image_size_w"]]),
                                 int(row[COL["src_image_size_h"]]))
            params = f"{spec.name}:aipp_params"
            consts[params] = row.reshape(1, PARAMS)
        else:
            if dynamic_batch:
                raise AtcError("E10055", ACL_ERROR_GE_PARAM_INVALID,
                               reason="vnpu does not combine dynamic AIPP with --dynamic_batch_size")
            nbytes, params = cfg.max_src_image_size, DYNAMIC_AIPP_NAME
            inputs.append(InputSpec(DYNAMIC_AIPP_NAME, "uint8", (dims[0], PARAMS_BYTES)))
            shapes[DYNAMIC_AIPP_NAME] = (dims[0], PARAMS_BYTES)
        inputs[cfg.related_input_rank] = InputSpec(spec.name, "uint8", (dims[0], nbytes))
        shapes[spec.name] = (dims[0], nbytes)
        nodes.insert(0, Node("Aipp", f"aipp_{spec.name}", [spec.name, params], [tensor],
                             {"dtype": spec.dtype, "chw": list(chw)}, "vnpu", src.opset))
        entries.append({"input": spec.name, "index": cfg.related_input_rank, "mode": cfg.mode, "chw": list(chw),
                        "bytes": nbytes})
    return replace(src, inputs=inputs, nodes=nodes, consts=consts, outputs=outputs), shapes, entries
