"""``vnpu atc``: convert an ONNX model to a vnpu ``.om`` with ATC's flag names and console behaviour.

    vnpu atc --model m.onnx --framework 5 --output m [--input_shape "x:-1,3,224,224"]
             [--dynamic_batch_size "1,2,4,8"] [--soc_version Ascend910B3] [--log info]
    vnpu atc ... --input_shape "x:1,3,-1,-1" --dynamic_image_size "224,224;448,448"   # image-size gears
    vnpu atc --singleop op_list.json --output op_models [--soc_version ...]   # one .om per operator (acl.op)
    vnpu atc --mode 1 --om m.om --json m.json        # the model's manifest as JSON (no weights)
    vnpu atc --mode 6 --om m.om                      # model info

As ATC: "ATC start working now, please wait for a moment." first; "ATC run success, welcome to the
next use." and exit 0 on success; on failure "ATC run failed, Please check the detail log, Try 'atc
--help' for more information" on stdout, ONE line ``E<code>: <message>`` (ATC's E-codes and texts) on
stderr, and exit status 255 (ATC's ``main`` returns -1).  ``--output`` gets ".om" appended, as ATC does.
With ``--singleop`` (ATC's op-list JSON) ``--output`` is a directory that gets one single-operator model
per entry, named as ATC names them (``0_Add_3_2_8_16_...om``), for ``acl.op.set_model_dir``.
``--soc_version`` picks the chip spec of the cost model and the core count the kernels are tiled for
(default Ascend910B3; real ATC requires it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from devices.errors import (ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, ACL_ERROR_GE_PARAM_INVALID, AclError, AtcError,
                            atc_message)
from runtime.cliargs import output_dir_problem, output_problem

START = "ATC start working now, please wait for a moment."
SUCCESS = "ATC run success, welcome to the next use."
FAILED = "ATC run failed, Please check the detail log, Try 'atc --help' for more information"
FAILED_EXIT = 255
LOG_LEVELS = ("null", "debug", "info", "warning", "error")
FRAMEWORKS = "0(Caffe) or 1(MindSpore) or 3(TensorFlow) or 5(Onnx)"
MODES = {0: "generate an offline model", 1: "convert an .om to JSON", 6: "display model info"}
#: ATC flags vnpu atc knows but does not implement: given, they fail with E10001 instead of being ignored
UNSUPPORTED = {
    "weight": "Caffe weights (vnpu atc converts ONNX models)", "dynamic_dims": "dynamic dims gears",
    "input_shape_range": "shape ranges", "out_nodes": "choosing output nodes",
    "output_type": "changing output dtypes", "input_fp16_nodes": "fp16 input nodes",
    "keep_dtype": "per-op precision files",
}
#: the gear flags ATC takes one of at most (E10009)
EXCLUSIVE = ("dynamic_batch_size", "dynamic_image_size", "input_shape_range", "dynamic_dims")
#: --precision_mode values that mean what vnpu does (it keeps every op in the model's own dtype)
PRECISIONS = ("must_keep_origin_dtype", "force_fp32")


def register(sub) -> None:
    p = sub.add_parser("atc", help="convert an ONNX model to a vnpu .om (ATC's flags: --model --framework 5 "
                                   "--output [--input_shape --dynamic_batch_size | --dynamic_image_size "
                                   "--soc_version])",
                       example=("vnpu atc --model m.onnx --framework 5 --output m --input_shape 'x:-1,128' "
                                "--dynamic_batch_size '1,2,4,8' --soc_version Ascend910B3",
                                "vnpu atc --singleop op_list.json --output op_models",
                                "vnpu atc --mode 6 --om m.om"))
    p.add_argument("--mode", default="0", help="0 generate .om (default), 1 .om to JSON, 6 display model info")
    p.add_argument("--model", default="", help="source model (ONNX)")
    p.add_argument("--singleop", default="", help="an op-list JSON: compile one single-operator model per "
                                                  "entry into the --output directory (acl.op)")
    p.add_argument("--framework", default="", help="5 (ONNX)")
    p.add_argument("--output", default="", help="output path without suffix: .om is appended")
    p.add_argument("--input_shape", default=None,
                   help='"name:n,c,h,w;name2:n,c" (-1: the dynamic batch axis, or H and W with --dynamic_image_size)')
    p.add_argument("--dynamic_batch_size", default=None, help='"1,2,4,8": the batch gears')
    p.add_argument("--dynamic_image_size", default=None,
                   help='"h1,w1;h2,w2": the image-size gears, for the -1 H and W of NCHW inputs (exclusive with '
                        '--dynamic_batch_size)')
    p.add_argument("--soc_version", default=None, help="chip to compile for (default Ascend910B3)")
    p.add_argument("--input_format", default=None, help="NCHW (default) or ND")
    p.add_argument("--insert_op_conf", default=None,
                   help="an AIPP config (aipp_op { ... }): the model input takes pictures (static or dynamic AIPP)")
    p.add_argument("--log", default="null", help="debug|info|warning|error|null: info prints the compile report")
    p.add_argument("--disable_reuse_memory", default="0", help="1: give every intermediate its own memory")
    p.add_argument("--precision_mode", default=None,
                   help=f"{' or '.join(PRECISIONS)} (vnpu keeps the model's dtypes; ATC's default is force_fp16)")
    for flag in UNSUPPORTED:
        p.add_argument(f"--{flag}", default=None, help=argparse.SUPPRESS)
    p.add_argument("--quant", default=None, metavar="none|int8",
                   help="int8: weight-only quantization, every constant 2-D MatMul/Gemm weight stored as int8 "
                        "with a float32 scale per output channel (4x fewer weight bytes); none (default)")
    p.add_argument("--om", default="", help="--mode 1/6: the .om to read")
    p.add_argument("--json", default="", help="--mode 1: the JSON file to write")
    p.set_defaults(fn=_run)


def _fail(line: str) -> int:
    print(FAILED, flush=True)
    print(line, file=sys.stderr, flush=True)
    return FAILED_EXIT


def _run(a) -> int:
    print(START, flush=True)
    try:
        if a.log not in LOG_LEVELS:
            raise AtcError("E10010", ACL_ERROR_GE_PARAM_INVALID, loglevel=a.log)
        try:
            mode = int(a.mode)
        except ValueError:
            mode = -1
        if mode not in MODES:
            raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.mode, parameter="--mode",
                           reason="vnpu atc supports " + ", ".join(f"{k} ({v})" for k, v in MODES.items()))
        if mode == 0 and a.singleop:
            _singleop(a)
        elif mode == 0:
            _convert(a)
        else:
            _inspect(a, mode)
    except AtcError as e:
        return _fail(e.line)
    except AclError as e:                    # a model file refused on read (mode 1/6): GE's E10003
        return _fail(atc_message("E10003", value=a.om or a.model, parameter="om" if a.om else "model",
                                 reason=f"{e.name} ({e.code}): {e.detail}"))
    except Exception as e:  # noqa: BLE001 - a compiler bug: one line, never a traceback
        return _fail(atc_message("E19999", reason=f"{type(e).__name__}: {e}"))
    print(SUCCESS, flush=True)
    return 0


def _convert(a) -> None:
    from runtime.atc import compile_model, make_options
    if not a.model:
        raise AtcError("E10004", ACL_ERROR_GE_PARAM_INVALID, parameter="model")
    if not a.output:
        raise AtcError("E10004", ACL_ERROR_GE_PARAM_INVALID, parameter="output")
    if a.framework == "":
        raise AtcError("E10007", ACL_ERROR_GE_PARAM_INVALID, parameter="framework", support=FRAMEWORKS)
    if a.framework.strip() != "5":
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.framework, parameter="--framework",
                       reason="vnpu atc converts ONNX models only (--framework 5)" if a.framework.strip() in
                       ("0", "1", "3") else f"the value must be {FRAMEWORKS}")
    if a.input_format not in (None, "NCHW", "ND"):
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.input_format, parameter="--input_format",
                       reason="ONNX models support NCHW or ND")
    if sum(getattr(a, flag) is not None for flag in EXCLUSIVE) > 1:
        raise AtcError("E10009", ACL_ERROR_GE_PARAM_INVALID)
    if a.dynamic_image_size is not None and a.input_format == "ND":
        raise AtcError("E10003", ACL_ERROR_GE_PARAM_INVALID, value=a.input_format, parameter="input_format",
                       reason="When --dynamic_image_size is set, the input format only supports NCHW (NHWC: not for "
                              "ONNX models)")
    for flag, what in UNSUPPORTED.items():
        if getattr(a, flag) is not None:
            raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=getattr(a, flag), parameter=f"--{flag}",
                           reason=f"vnpu atc does not support {what}")
    if a.precision_mode is not None and a.precision_mode not in PRECISIONS:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.precision_mode, parameter="--precision_mode",
                       reason=f"vnpu keeps each op in the model's dtype: use {' or '.join(PRECISIONS)}")
    if a.disable_reuse_memory not in ("0", "1"):
        raise AtcError("E10006", ACL_ERROR_GE_PARAM_INVALID, value=a.disable_reuse_memory,
                       parameter="disable_reuse_memory")
    out = Path(a.output + ".om")
    if out.name == ".om" or a.output.endswith(("/", "\\")):
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.output, parameter="--output",
                       reason="the path has no file name")
    _check_output(str(out), "--output")
    if not Path(a.model).is_file():
        raise AtcError("E10001", ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, value=a.model, parameter="--model",
                       reason="the file does not exist or is not a regular file")
    opts = make_options(a.input_shape, a.dynamic_batch_size, a.soc_version,
                        reuse_memory=a.disable_reuse_memory == "0", quant=a.quant,
                        insert_op_conf=a.insert_op_conf, dynamic_image_size=a.dynamic_image_size)
    cm = compile_model(a.model, opts)
    try:
        cm.save(out)
    except OSError as e:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=str(out), parameter="--output",
                       reason=f"cannot write it ({e.strerror})") from None
    if a.log in ("info", "debug"):
        for line in report_lines(cm.manifest):
            print(f"[INFO] {line}", flush=True)


def _singleop(a) -> None:
    from runtime.atc.singleop import compile_op_list
    if a.model:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.model, parameter="--model",
                       reason="--singleop and --model are exclusive")
    if not a.output:
        raise AtcError("E10004", ACL_ERROR_GE_PARAM_INVALID, parameter="output")
    if not Path(a.singleop).is_file():
        raise AtcError("E10001", ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, value=a.singleop, parameter="--singleop",
                       reason="the file does not exist or is not a regular file")
    out = Path(a.output)
    problem = output_dir_problem(a.output)
    if problem:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.output, parameter="--output", reason=problem)
    from runtime.atc import make_options
    soc = make_options(None, None, a.soc_version).soc_version
    try:
        paths = compile_op_list(a.singleop, out, soc)
    except OSError as e:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.output, parameter="--output",
                       reason=f"cannot write it ({e.strerror})") from None
    if a.log in ("info", "debug"):
        for p in paths:
            print(f"[INFO] {p}", flush=True)


def _check_output(path: str, flag: str) -> None:
    """E10001 for ``flag`` unless ``path`` can be written (checked before the model is read or compiled)."""
    problem = output_problem(path)
    if problem:
        raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=path, parameter=flag, reason=problem)


def _inspect(a, mode: int) -> None:
    from runtime.atc import read_om
    if not a.om:
        raise AtcError("E10004", ACL_ERROR_GE_PARAM_INVALID, parameter="om")
    if mode == 1:
        if not a.json:
            raise AtcError("E10004", ACL_ERROR_GE_PARAM_INVALID, parameter="json")
        _check_output(a.json, "--json")
    p = Path(a.om)
    if not p.is_file():
        raise AtcError("E10001", ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID, value=a.om, parameter="--om",
                       reason="the file does not exist or is not a regular file")
    manifest, _ = read_om(p.read_bytes())
    if mode == 1:
        try:
            Path(a.json).write_text(json.dumps(manifest, indent=1))
        except OSError as e:
            raise AtcError("E10001", ACL_ERROR_GE_PARAM_INVALID, value=a.json, parameter="--json",
                           reason=f"cannot write it ({e.strerror})") from None
        return
    for line in report_lines(manifest):
        print(line, flush=True)


def _gears(m: dict) -> str:
    if m.get("dynamic_hw"):
        return "image sizes " + ", ".join(f"{h}x{w}" for h, w in m["dynamic_hw"])
    return str(m["dynamic_batch"] or "static")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def report_lines(m: dict) -> list[str]:
    """The compile report as console lines (``--log info`` after a conversion, ``--mode 6``)."""
    r = m["report"]
    io = lambda specs: "; ".join(f"{s['name']} {s['dtype']} {s['dims']}" for s in specs)  # noqa: E731
    fused = ", ".join(f"{k} {v}" for k, v in r["fused"].items() if v) or "none"
    return [
        f"model {m['name']} for {m['soc_version']}, gears {_gears(m)}",
        f"inputs: {io(m['inputs'])}",
        f"outputs: {io(m['outputs'])}",
        f"launches {r['launches_before_fusion']} -> {r['launches_after_fusion']} after fusion ({fused}); "
        f"{r['folded_nodes']} nodes folded",
        f"intermediates {_mb(r['intermediate_bytes_before_fusion'])} -> {_mb(r['intermediate_bytes_after_fusion'])}"
        f" after fusion; memory plan peak {_mb(r['plan_peak_bytes'])} (no reuse: {_mb(r['plan_no_reuse_bytes'])})",
        f"weights {_mb(r['weights_bytes'])}, workspace {_mb(r['workspace_bytes'])}; modeled device time "
        f"{r['modeled_us']:.1f} us (before fusion {r['modeled_us_before_fusion']:.1f} us)",
    ]
