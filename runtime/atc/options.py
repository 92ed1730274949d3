"""What a conversion is asked to do: :class:`CompileOptions`, and the parsers of ATC's flag strings
(``--input_shape "a:1,128;b:1,128"``, ``--dynamic_batch_size "1,2,4,8"``, ``--dynamic_image_size
"224,224;448,448"``, ``--soc_version``) that raise the E-codes real ATC prints for the same mistakes.

Gears: a model has batch gears (``-1`` on axis 0 of the inputs that take it), image-size gears (``-1`` on
H and W, axes 2 and 3, of the NCHW inputs that take it: every such input gets the same (h, w)) or none;
the two flags are exclusive (E10009), as in ATC.  Without gears no dim may be -1 (E10011)."""
from __future__ import annotations

from dataclasses import dataclass

from devices.chip import CHIPS, chip_by_name
from devices.errors import ACL_ERROR_GE_PARAM_INVALID, AtcError

INPUT_SHAPE_SAMPLE = '"input_name1:n1,c1,h1,w1;input_name2:n2,c2,h2,w2"'
DEFAULT_SOC = "Ascend910B3"
#: ATC's limits on --dynamic_batch_size / --dynamic_image_size profiles
MIN_GEARS, MAX_GEARS = 2, 100
#: the axes of an NCHW input that --dynamic_image_size sets (H, W)
HW_AXES = (2, 3)
IMAGE_SIZE_REASON = 'the value must be formatted as "h1,w1;h2,w2": digits, \',\' and \';\' only'

#: weight quantizations ``vnpu atc --quant`` offers
QUANTS = ("none", "int8")
#: the extra input ATC adds to a model with gears (ACL_DYNAMIC_TENSOR_NAME): uint64 [1] (the batch) or
#: [2] (height, width)
DYNAMIC_INPUT_NAME = "ascend_mbatch_shape_data"


@dataclass(frozen=True)
class CompileOptions:
    """``input_shape``: name -> dims (-1 marks the dynamic axes); ``dynamic_batch``: the batch gears;
    ``dynamic_hw``: the image-size gears, (h, w) each (at most one of the two is set);
    ``soc_version``: the chip whose cost model prices the kernels and whose cores tile them;
    ``fuse``: run the fusion passes; ``fold_limit``: largest folded constant (bytes) that may grow
    beyond the constants it was computed from; ``quant``: one of :data:`QUANTS` (``int8``: every
    constant 2-D float32 MatMul/Gemm weight stored as int8 with one float32 scale per output channel and
    run by ``weight_quant_matmul``)."""
    input_shape: tuple[tuple[str, tuple[int, ...]], ...] = ()
    dynamic_batch: tuple[int, ...] = ()
    dynamic_hw: tuple[tuple[int, int], ...] = ()
    soc_version: str = DEFAULT_SOC
    fuse: bool = True
    fold_limit: int = 64 << 10
    reuse_memory: bool = True            #: False: ATC's --disable_reuse_memory 1
    aipp: tuple = ()                     #: AippConfig per input (ATC's --insert_op_conf; runtime.atc.aipp)
    quant: str = "none"                  #: "int8": weight-only per-channel int8 of constant 2-D matmul weights

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.input_shape)

    @property
    def gears(self) -> list:
        """The gear keys: batch sizes, (h, w) pairs, or ``[None]`` for a static model."""
        return list(self.dynamic_batch) or list(self.dynamic_hw) or [None]


def parse_input_shape(text: str | None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``"a:1,128;b:1,128"`` -> ``(("a", (1, 128)), ("b", (1, 128)))`` (E10002 on a malformed value).
    Names may themselves contain ':' (the last one separates the dims)."""
    if text is None or not text.strip():
        return ()
    out = []
    for part in text.strip().strip(";").split(";"):
        name, sep, dims = part.strip().rpartition(":")
        if not sep or not name:
            raise AtcError("E10002", ACL_ERROR_GE_PARAM_INVALID, shape=text, reason=f"'{part}' has no 'name:'",
                           sample=INPUT_SHAPE_SAMPLE)
        try:
            vals = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise AtcError("E10002", ACL_ERROR_GE_PARAM_INVALID, shape=text,
                           reason=f"dims '{dims}' of {name} are not integers", sample=INPUT_SHAPE_SAMPLE) from None
        if any(d < -1 or d == 0 for d in vals):
            bad = next(d for d in vals if d < -1 or d == 0)
            raise AtcError("E10011", ACL_ERROR_GE_PARAM_INVALID, shape=text, result=bad)
        if any(n == name for n, _ in out):
            raise AtcError("E10002", ACL_ERROR_GE_PARAM_INVALID, shape=text, reason=f"{name} is given twice",
                           sample=INPUT_SHAPE_SAMPLE)
        out.append((name, vals))
    return tuple(out)


def parse_dynamic_batch(text: str | None) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)``: 2 to 100 distinct positive sizes (E10035/E10036/E10038/E10039)."""
    if text is None or not text.strip():
        return ()
    try:
        vals = tuple(int(v) for v in text.strip().strip(",").split(","))
    except ValueError:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=text, parameter="--dynamic_batch_size",
                       reason="the batch sizes must be integers separated by ','") from None
    return check_gears(vals)


def check_gears(vals) -> tuple[int, ...]:
    vals = tuple(int(v) for v in vals)
    if len(vals) < MIN_GEARS:
        raise AtcError("E10035", ACL_ERROR_GE_PARAM_INVALID, shapesize=len(vals), minshapesize=MIN_GEARS)
    if len(vals) > MAX_GEARS:
        raise AtcError("E10036", ACL_ERROR_GE_PARAM_INVALID, shapesize=len(vals), maxshapesize=MAX_GEARS)
    for v in vals:
        if v <= 0:
            raise AtcError("E10038", ACL_ERROR_GE_PARAM_INVALID, dim=v)
    if len(set(vals)) != len(vals):
        raise AtcError("E10039", ACL_ERROR_GE_PARAM_INVALID)
    return vals


def parse_dynamic_image_size(text: str | None) -> tuple[tuple[int, int], ...]:
    """``"224,224;448,448"`` -> ``((224, 224), (448, 448))``: (height, width) gears, 2 to 100, distinct and
    positive (E10003 for other characters, E10020 for a gear without exactly two values, then
    E10035/E10036/E10038/E10039 as for batch gears).  A trailing ';' is ignored, as ATC does."""
    if text is None or not text.strip():
        return ()
    t = text.strip().rstrip(";")
    if any(not (c.isdigit() or c in ", ;") for c in t):
        raise AtcError("E10003", ACL_ERROR_GE_PARAM_INVALID, value=text, parameter="dynamic_image_size",
                       reason=IMAGE_SIZE_REASON)
    gears = []
    for part in t.split(";"):
        vals = [v.strip() for v in part.split(",")]
        if len(vals) != 2 or not all(vals):
            raise AtcError("E10020", ACL_ERROR_GE_PARAM_INVALID, dynamic_image_size=text)
        gears.append((int(vals[0]), int(vals[1])))
    return check_hw_gears(gears)


def check_hw_gears(vals) -> tuple[tuple[int, int], ...]:
    try:
        gears = tuple((int(h), int(w)) for h, w in vals)
    except (TypeError, ValueError):
        raise AtcError("E10020", ACL_ERROR_GE_PARAM_INVALID, dynamic_image_size=str(vals)) from None
    if len(gears) < MIN_GEARS:
        raise AtcError("E10035", ACL_ERROR_GE_PARAM_INVALID, shapesize=len(gears), minshapesize=MIN_GEARS)
    if len(gears) > MAX_GEARS:
        raise AtcError("E10036", ACL_ERROR_GE_PARAM_INVALID, shapesize=len(gears), maxshapesize=MAX_GEARS)
    for g in gears:
        for v in g:
            if v <= 0:
                raise AtcError("E10038", ACL_ERROR_GE_PARAM_INVALID, dim=v)
    if len(set(gears)) != len(gears):
        raise AtcError("E10039", ACL_ERROR_GE_PARAM_INVALID)
    return gears


def check_hw_shapes(shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
    """E10019 unless some input has -1 and every input with a -1 is 4-D with exactly H and W -1 (NCHW)."""
    dynamic = [dims for _, dims in shapes if -1 in dims]
    if not dynamic or any(len(d) != 4 or d.count(-1) != 2 or any(d[i] != -1 for i in HW_AXES) for d in dynamic):
        raise AtcError("E10019", ACL_ERROR_GE_PARAM_INVALID)


def check_soc(name: str | None) -> str:
    """The SoC name of a known chip spec (``Ascend910B3``); E10001 for an unknown one."""
    name = name or DEFAULT_SOC
    try:
        return chip_by_name(name).name
    except KeyError:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=name, parameter="--soc_version",
                       reason=f"unknown SoC; vnpu models {', '.join(sorted(CHIPS))}") from None


def make_options(input_shape=None, dynamic_batch_size=None, soc_version=None, fuse: bool = True,
                 reuse_memory: bool = True, quant: str | None = None,
                 insert_op_conf: str | None = None, dynamic_image_size=None) -> CompileOptions:
    """Options from ATC-style strings (or already parsed values); E10001 for a ``quant`` not in
    :data:`QUANTS`; ``insert_op_conf``: an AIPP config file; ``dynamic_image_size``: ``"h,w;h,w"`` or
    (h, w) pairs, exclusive with ``dynamic_batch_size`` (E10009) and checked in ATC's order (E10004
    without ``input_shape``, E10019 for its -1 dims, then the gears)."""
    quant = "none" if quant is None else quant
    if quant not in QUANTS:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=quant, parameter="--quant",
                       reason=f"the value must be one of {', '.join(QUANTS)}")
    given = [v for v in (dynamic_batch_size, dynamic_image_size) if not (v is None or (isinstance(v, str) and
                                                                                      not v.strip()))]
    if len(given) > 1:
        raise AtcError("E10009", ACL_ERROR_GE_PARAM_INVALID)
    shapes = parse_input_shape(input_shape) if isinstance(input_shape, (str, type(None))) else \
        tuple((str(k), tuple(int(d) for d in v)) for k, v in dict(input_shape).items())
    gears = parse_dynamic_batch(dynamic_batch_size) if isinstance(dynamic_batch_size, (str, type(None))) else \
        check_gears(dynamic_batch_size)
    hw: tuple = ()
    if given and dynamic_image_size is not None:
        if not shapes:
            raise AtcError("E10004", ACL_ERROR_GE_PARAM_INVALID, parameter="input_shape")
        check_hw_shapes(shapes)
        hw = parse_dynamic_image_size(dynamic_image_size) if isinstance(dynamic_image_size, str) else \
            check_hw_gears(dynamic_image_size)
    aipp: tuple = ()
    if insert_op_conf:
        from .aipp import load
        aipp = load(insert_op_conf)
    return CompileOptions(shapes, gears, hw, check_soc(soc_version), fuse, reuse_memory=reuse_memory, quant=quant,
                          aipp=aipp)
