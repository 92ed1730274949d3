"""Small ONNX models built with onnx.helper for the compiler and offline-model tests (random weights,
fixed seeds), and the tolerance rule the tests compare against onnxruntime with."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
EPS32 = float(np.finfo(np.float32).eps)


def assert_close(got, ref, k: int, depth: int = 1, what: str = "") -> None:
    """float32 results of ``depth`` chained reductions of length up to ``k`` agree with a reference
    within 4 eps * sqrt(k) * depth of the values' magnitude (accumulation order differs; the error of a
    length-k float32 dot product grows like sqrt(k) ulps of its magnitude)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
    atol = 4 * EPS32 * math.sqrt(k) * depth * scale
    np.testing.assert_allclose(got, ref, rtol=0, atol=atol, err_msg=what)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def make_model(nodes, inputs, outputs, inits, opset: int = OPSET, name: str = "test"):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="vnpu-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def cnn(seed: int = 0, batch="N", hw: int = 16, classes: int = 10):
    """conv+BN+relu, max pool, grouped conv+BN+relu with a residual add, dilated conv+relu, avg pool,
    global avg pool, flatten, Gemm, softmax: x [N, 3, hw, hw] -> probs [N, classes]."""
    r = np.random.default_rng(seed)

    def w(*s, scale=0.3):
        return (r.standard_normal(s) * scale).astype(np.float32)

    def bn(prefix, c):
        return [_init(f"{prefix}_s", 1 + 0.1 * r.standard_normal(c).astype(np.float32)),
                _init(f"{prefix}_b", w(c, scale=0.1)), _init(f"{prefix}_m", w(c, scale=0.1)),
                _init(f"{prefix}_v", (0.5 + r.random(c)).astype(np.float32))]
    inits = [_init("c1_w", w(8, 3, 3, 3)), _init("c1_b", w(8, scale=0.1)), *bn("bn1", 8),
             _init("c2_w", w(8, 4, 3, 3)), *bn("bn2", 8),
             _init("c3_w", w(16, 8, 3, 3, scale=0.2)), _init("c3_b", w(16, scale=0.1)),
             _init("fc_w", w(classes, 16, scale=0.5)), _init("fc_b", w(classes, scale=0.1))]
    bn_in = lambda p: [f"{p}_s", f"{p}_b", f"{p}_m", f"{p}_v"]  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1"] + bn_in("bn1"), ["n1"], name="bn1", epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "c2_w"], ["c2"], name="conv2", pads=[1, 1, 1, 1], group=2),
        helper.make_node("BatchNormalization", ["c2"] + bn_in("bn2"), ["n2"], name="bn2"),
        helper.make_node("Relu", ["n2"], ["r2"], name="relu2"),
        helper.make_node("Add", ["r2", "p1"], ["res"], name="residual"),
        helper.make_node("Conv", ["res", "c3_w", "c3_b"], ["c3"], name="conv3", pads=[2, 2, 2, 2],
                         dilations=[2, 2]),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("AveragePool", ["r3"], ["p2"], name="pool2", kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], count_include_pad=0),
        helper.make_node("GlobalAveragePool", ["p2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, hw, hw])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, classes])
    return make_model(nodes, [x], [y], inits, name="cnn")


def images(batch: int, seed: int = 0, hw: int = 16) -> np.ndarray:
    """Random float32 inputs for :func:`cnn`: [batch, 3, hw, hw]."""
    return np.random.default_rng(seed).standard_normal((batch, 3, hw, hw)).astype(np.float32)


def layernorm_decomposed(d: int = 24, seed: int = 1):
    """x [2, 5, d] -> the LayerNorm pattern of older exporters (ReduceMean, Sub, Pow, ReduceMean, Add eps,
    Sqrt, Div, Mul gamma, Add beta), opset 13 (ReduceMean axes as an attribute)."""
    r = np.random.default_rng(seed)
    inits = [_init("two", np.array(2.0, np.float32)), _init("eps", np.array(1e-5, np.float32)),
             _init("gamma", (1 + 0.1 * r.standard_normal(d)).astype(np.float32)),
             _init("beta", (0.1 * r.standard_normal(d)).astype(np.float32))]
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], name="ln/mean", axes=[-1]),
        helper.make_node("Sub", ["x", "mu"], ["d"], name="ln/sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="ln/pow"),
        helper.make_node("ReduceMean", ["d2"], ["var"], name="ln/var", axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="ln/add_eps"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="ln/sqrt"),
        helper.make_node("Div", ["d", "sd"], ["nrm"], name="ln/div"),
        helper.make_node("Mul", ["nrm", "gamma"], ["sc"], name="ln/mul"),
        helper.make_node("Add", ["sc", "beta"], ["y"], name="ln/add"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, d])
    return make_model(nodes, [x], [y], inits, opset=13, name="layernorm")


def gelu_mlp(d: int = 16, h: int = 32, half_first: bool = False, seed: int = 2):
    """x [4, d] -> MatMul + Add bias -> GELU as Div/Erf/Add/Mul/Mul (or with the 0.5 multiplied first) ->
    MatMul [h, d]."""
    r = np.random.default_rng(seed)
    inits = [_init("w1", (r.standard_normal((d, h)) * 0.4).astype(np.float32)),
             _init("b1", (r.standard_normal(h) * 0.1).astype(np.float32)),
             _init("w2", (r.standard_normal((h, d)) * 0.3).astype(np.float32)),
             _init("sqrt2", np.array(math.sqrt(2.0), np.float32)), _init("one", np.array(1.0, np.float32)),
             _init("half", np.array(0.5, np.float32))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["mm"], name="fc1/matmul"),
             helper.make_node("Add", ["b1", "mm"], ["hpre"], name="fc1/add"),
             helper.make_node("Div", ["hpre", "sqrt2"], ["dv"], name="gelu/div"),
             helper.make_node("Erf", ["dv"], ["er"], name="gelu/erf"),
             helper.make_node("Add", ["er", "one"], ["e1"], name="gelu/add")]
    if half_first:
        nodes += [helper.make_node("Mul", ["hpre", "half"], ["xh"], name="gelu/half"),
                  helper.make_node("Mul", ["xh", "e1"], ["g"], name="gelu/mul")]
    else:
        nodes += [helper.make_node("Mul", ["hpre", "e1"], ["xg"], name="gelu/mul"),
                  helper.make_node("Mul", ["xg", "half"], ["g"], name="gelu/half")]
    nodes.append(helper.make_node("MatMul", ["g", "w2"], ["y"], name="fc2/matmul"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, d])
    return make_model(nodes, [x], [y], inits, name="gelu_mlp")


def shape_arith():
    """x [3, 6, 8] -> Reshape to [3, 48] through Shape -> Gather -> Unsqueeze -> Concat, and a bias
    broadcast through Shape -> ConstantOfShape -> Mul -> Equal -> Where -> Expand, Slice and Cast of
    shape values (the arithmetic of exporters' dynamic-shape code, all foldable) -> Add -> Relu."""
    inits = [_init("i0", np.array(0, np.int64)), _init("minus1", np.array([-1], np.int64)),
             _init("ax0", np.array([0], np.int64)), _init("s0", np.array([0], np.int64)),
             _init("s1", np.array([2], np.int64)), _init("bias", np.array([[0.25]], np.float32))]
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "i0"], ["b"], name="gather_batch", axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="unsq"),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"], name="reshape"),
        helper.make_node("Shape", ["target"], ["tshape"], name="shape_of_target"),
        helper.make_node("ConstantOfShape", ["tshape"], ["ones"], name="cos",
                         value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
        helper.make_node("Mul", ["ones", "minus1"], ["neg"], name="neg"),
        helper.make_node("Equal", ["target", "neg"], ["eq"], name="equal"),
        helper.make_node("Where", ["eq", "ones", "target"], ["eshape"], name="where"),
        helper.make_node("Expand", ["bias", "eshape"], ["bias_e"], name="expand"),
        helper.make_node("Slice", ["target", "s0", "s1"], ["tgt3"], name="slice"),
        helper.make_node("Cast", ["tgt3"], ["tgt4"], name="cast", to=TensorProto.INT64),
        helper.make_node("Reshape", ["flat", "tgt4"], ["flat2"], name="reshape2"),
        helper.make_node("Add", ["flat2", "bias_e"], ["biased"], name="add_bias"),
        helper.make_node("Relu", ["biased"], ["y"], name="relu"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 48])
    return make_model(nodes, [x], [y], inits, name="shape_arith")


def single_op(op: str, name: str = "the_node", domain: str = ""):
    """x [2, 3] -> one node of type ``op`` -> y: for the unsupported-operator errors."""
    node = helper.make_node(op, ["x"], ["y"], name=name, domain=domain or None)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([node], "one", [x], [y])
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    return m


def bad_matmul():
    """x [2, 3] @ W [4, 5]: inner dims differ (an unsupported shape, node 'mm_bad')."""
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm_bad")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    g = helper.make_graph([node], "bad", [x], [y], [_init("w", np.ones((4, 5), np.float32))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    return m


def ort_run(model, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    blob = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def misc_ops(seed: int = 7):
    """Many lowering paths in one graph: x [2, 3, 4, 5] float and idx [2] int64 (run-time indices).

    Slices as a view and as strided_slice, Concat, Transpose, Softmax over axis 1, ReduceMean/ReduceSum
    over inner axes, Clip, Sigmoid, Tanh, Equal + Where (a leaky relu), Gather with run-time indices,
    Pow 3, Sqrt, LayerNormalization over the last 2 axes, Squeeze/Unsqueeze, a 1-D conv and max pool,
    Gemm with transA, alpha, beta and a [M, N] C, then Relu; Gemm with a run-time B and transB."""
    r = np.random.default_rng(seed)

    def c(name, arr):
        return _init(name, np.asarray(arr))
    inits = [c("s_a", [1]), c("e_a", [3]), c("ax1", [1]), c("s_b", [0]), c("e_b", [1]), c("ax0", [0]),
             c("lo", np.float32(-0.5)), c("hi", np.float32(0.7)), c("tenth", np.float32(0.1)),
             c("three", np.float32(3.0)), c("one", np.float32(1.0)), c("axes12", [1, 2]),
             c("ln_g", (1 + 0.1 * r.standard_normal((4, 5))).astype(np.float32)),
             c("ln_b", (0.1 * r.standard_normal((4, 5))).astype(np.float32)),
             c("w1d", (0.4 * r.standard_normal((6, 4, 3))).astype(np.float32)),
             c("gA", (0.2 * r.standard_normal((60, 6))).astype(np.float32)),
             c("gC", (0.3 * r.standard_normal((6, 2))).astype(np.float32)),
             c("sq_ax", [0]), c("shape_2_60", np.array([2, 60], np.int64)), c("shape_3_4_5", [3, 4, 5])]
    n = helper.make_node
    nodes = [
        n("Slice", ["x", "s_a", "e_a", "ax1"], ["sl_mid"], name="slice_strided"),          # [2, 2, 4, 5]
        n("Slice", ["x", "s_b", "e_b", "ax0"], ["sl_first"], name="slice_view"),            # [1, 3, 4, 5]
        n("Transpose", ["sl_first"], ["tr"], name="transpose", perm=[1, 0, 2, 3]),          # [3, 1, 4, 5]
        n("Concat", ["sl_mid", "x"], ["cat"], name="concat", axis=1),                       # [2, 5, 4, 5]
        n("Softmax", ["cat"], ["sm"], name="softmax_axis1", axis=1),
        n("ReduceSum", ["sm", "axes12"], ["rs"], name="reduce_sum", keepdims=0),            # [2, 5]
        n("ReduceMean", ["x"], ["rm"], name="reduce_mean", axes=[2, 3], keepdims=1),        # [2, 3, 1, 1]
        n("Clip", ["x", "lo", "hi"], ["cl"], name="clip"),
        n("Sigmoid", ["cl"], ["sg"], name="sigmoid"),
        n("Tanh", ["sg"], ["th"], name="tanh"),
        n("Relu", ["x"], ["rl"], name="relu"),
        n("Equal", ["rl", "x"], ["pos"], name="equal"),
        n("Mul", ["x", "tenth"], ["neg"], name="scale_neg"),
        n("Where", ["pos", "x", "neg"], ["leaky"], name="where"),
        n("Gather", ["leaky", "idx"], ["gat"], name="gather_rt", axis=3),                   # [2, 3, 4, 2]
        n("Pow", ["th", "three"], ["p3"], name="pow3"),
        n("Add", ["rl", "one"], ["rl1"], name="add_one"),
        n("Sqrt", ["rl1"], ["sq"], name="sqrt"),
        n("LayerNormalization", ["sq", "ln_g", "ln_b"], ["ln"], name="ln_2axes", axis=-2, epsilon=1e-4),
        n("Add", ["ln", "p3"], ["mix"], name="mix"),
        n("Add", ["mix", "rm"], ["mix2"], name="mix2"),
        n("Unsqueeze", ["tr", "sq_ax"], ["tr5"], name="unsqueeze"),                        # [1, 3, 1, 4, 5]
        n("Squeeze", ["tr5"], ["tr3"], name="squeeze"),                                     # [3, 4, 5]
        n("Reshape", ["tr3", "shape_3_4_5"], ["c_in"], name="to_1d", allowzero=0),
        n("Conv", ["c_in", "w1d"], ["c1d"], name="conv1d", pads=[1, 1]),                    # [3, 6, 5]
        n("MaxPool", ["c1d"], ["mp1d"], name="maxpool1d", kernel_shape=[2], strides=[2]),   # [3, 6, 2]
        n("Reshape", ["mix2", "shape_2_60"], ["m2"], name="flat_2_60"),                     # [2, 60]
        n("Gemm", ["gA", "m2", "gC"], ["g1"], name="gemm_transA", transA=1, transB=1, alpha=0.5, beta=2.0),
        n("Relu", ["g1"], ["g1r"], name="gemm_relu"),                                       # [6, 2]
        n("Gemm", ["m2", "m2"], ["g2"], name="gemm_rt_b", transB=1),                        # [2, 2]
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [2])
    outs = [helper.make_tensor_value_info(nm, TensorProto.FLOAT, shape)
            for nm, shape in (("rs", [2, 5]), ("gat", [2, 3, 4, 2]), ("mp1d", [3, 6, 2]), ("g1r", [6, 2]),
                              ("g2", [2, 2]), ("mix2", [2, 3, 4, 5]))]
    return make_model(nodes, [x, idx], outs, inits, name="misc")


def softmax_opset11():
    """Softmax of opset 11 over axis 1 of a 3-D input: it flattens [N, C*L] (the pre-13 meaning)."""
    n = helper.make_node("Softmax", ["x"], ["y"], name="sm11", axis=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])
    return make_model([n], [x], [y], [], opset=11, name="sm11")


def hw_cnn(seed: int = 0, classes: int = 5):
    """A fully convolutional front and a classifier, for image-size gears: x [1, 3, H, W] ->
    feat [1, 4, H/2, W/2] (3x3 conv + bias, relu, 2x2 max pool) and logits [1, classes] (global average
    pool, Gemm).  H and W are symbolic."""
    r = np.random.default_rng(seed)
    inits = [_init("w1", (r.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)),
             _init("b1", (r.standard_normal(4) * 0.1).astype(np.float32)),
             _init("fw", r.standard_normal((classes, 4)).astype(np.float32)),
             _init("fb", (r.standard_normal(classes) * 0.1).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("MaxPool", ["r1"], ["feat"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["feat"], ["gap"], name="gap"),
             helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
             helper.make_node("Gemm", ["flat", "fw", "fb"], ["logits"], name="fc", transB=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])
    feat = helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 4, "H2", "W2"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])
    return make_model(nodes, [x], [feat, logits], inits, name="hw_cnn")
