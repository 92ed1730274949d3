"""Operator fusion: pattern rewrites on the folded IR, each a small pass in :data:`PASSES`.

- ``gelu``: Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5 (either Mul order) => Gelu(x);
- ``layernorm``: ReduceMean -> Sub -> Pow 2 (or Mul) -> ReduceMean -> Add eps -> Sqrt -> Div [-> Mul
  gamma -> Add beta] over the last axis => LayerNormalization;
- ``attention``: MatMul(q, k^T) [-> Div/Mul by a scalar] [-> Add mask] -> Softmax(last axis) -> MatMul v
  => Attention (k^T's Transpose is turned into k's, so the kernel reads k as [B, H, S, D]);
- ``conv_bn``: Conv -> BatchNormalization with constant parameters => FusedConv with the normalization
  folded into its weights and bias;
- ``matmul_bias``: MatMul(x, W) -> Add(bias) with a 2-D W and a [N] bias => FusedMatMul;
- ``activation``: FusedMatMul / Gemm / Conv / FusedConv -> Relu, Gelu, Tanh or Sigmoid => the
  activation applied inside the producing kernel.

A pattern is rewritten only when every intermediate value has exactly one reader and is not a graph
output, so fusion never changes what the graph computes.  The fused node takes the place of the
pattern's last node, which keeps the node list topologically sorted.
"""
from __future__ import annotations

import math

import numpy as np

from .ir import GRAPH_OUTPUT, Graph, Node, Value


class _Rewriter:
    """One pass's view of the graph: producers, readers, and the rewrites it collects."""

    def __init__(self, g: Graph):
        self.g = g
        self.cons = g.consumers()
        self.prod = g.producers()
        self.taken: set[int] = set()
        self.replace: dict[int, list[Node]] = {}
        self.count = 0

    def only_reader(self, name: str) -> Node | None:
        readers = self.cons.get(name, [])
        if len(readers) == 1 and readers[0] is not GRAPH_OUTPUT:
            return readers[0]
        return None

    def producer(self, name: str, *ops) -> Node | None:
        n = self.prod.get(name)
        return n if n is not None and n.op in ops and id(n) not in self.taken else None

    def scalar(self, name: str) -> float | None:
        v = self.g.value(name)
        if v is None or v.const is None or v.const.size != 1:
            return None
        return float(v.const.reshape(-1)[0])

    def const(self, name: str) -> np.ndarray | None:
        v = self.g.value(name)
        return None if v is None else v.const

    def new_const(self, name: str, arr: np.ndarray) -> str:
        arr = np.asarray(arr, order="C")
        arr.flags.writeable = False
        while name in self.g.values:
            name += "_"
        self.g.values[name] = Value(name, tuple(arr.shape), arr.dtype.name, arr)
        return name

    def rewrite(self, nodes: list[Node], new: list[Node]) -> None:
        """Replace ``nodes`` (the pattern; the last in graph order gets the new nodes) by ``new``."""
        order = {id(n): i for i, n in enumerate(self.g.nodes)}
        last = max(nodes, key=lambda n: order[id(n)])
        for n in nodes:
            self.taken.add(id(n))
        self.replace[id(last)] = new
        self.count += 1

    def apply(self) -> int:
        out = []
        for n in self.g.nodes:
            if id(n) in self.replace:
                out.extend(self.replace[id(n)])
            elif id(n) not in self.taken:
                out.append(n)
        self.g.nodes = out
        return self.count


def _among(node, nodes) -> bool:
    return any(node is n for n in nodes)


def _close(v: float | None, want: float, rel: float = 1e-3) -> bool:
    return v is not None and abs(v - want) <= rel * abs(want)


def _last_axis_only(r: _Rewriter, node: Node) -> bool:
    """A ReduceMean over exactly the last axis, keeping dims."""
    if int(node.attrs.get("keepdims", 1)) != 1:
        return False
    axes = node.attrs.get("axes")
    if axes is None and node.input(1):
        c = r.const(node.inputs[1])
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    rank = len(r.g.value(node.inputs[0]).shape)
    return axes is not None and len(axes) == 1 and axes[0] % rank == rank - 1


# ---------------------------------------------------------------------------------------------- passes
def fuse_gelu(g: Graph) -> int:
    r = _Rewriter(g)
    for e in list(g.nodes):
        if e.op != "Erf" or id(e) in r.taken:
            continue
        d = r.producer(e.inputs[0], "Div", "Mul")
        if d is None or r.only_reader(d.outputs[0]) is not e:
            continue
        x, c = d.inputs[0], r.scalar(d.inputs[1])
        if not (_close(c, math.sqrt(2.0)) if d.op == "Div" else _close(c, 1 / math.sqrt(2.0))):
            continue
        add = r.only_reader(e.outputs[0])
        if add is None or add.op != "Add" or not _close(r.scalar(add.inputs[1] if add.inputs[0] == e.outputs[0]
                                                                   else add.inputs[0]), 1.0):
            continue
        m1 = r.only_reader(add.outputs[0])
        if m1 is None or m1.op != "Mul":
            continue
        other = m1.inputs[1] if m1.inputs[0] == add.outputs[0] else m1.inputs[0]
        if other == x:
            m2 = r.only_reader(m1.outputs[0])
            if m2 is None or m2.op != "Mul" or not _close(r.scalar(m2.inputs[1] if m2.inputs[0] == m1.outputs[0]
                                                                  else m2.inputs[0]), 0.5):
                continue
            pattern, out = [d, e, add, m1, m2], m2.outputs[0]
        else:
            h = r.producer(other, "Mul")
            if h is None or r.only_reader(other) is not m1 or x not in h.inputs or \
                    not _close(r.scalar(h.inputs[1] if h.inputs[0] == x else h.inputs[0]), 0.5):
                continue
            pattern, out = [d, e, add, h, m1], m1.outputs[0]
        r.rewrite(pattern, [Node("Gelu", f"{e.name}/gelu", [x], [out], {"approximate": "none"}, "vnpu", e.opset)])
    return r.apply()


def fuse_layernorm(g: Graph) -> int:
    r = _Rewriter(g)
    for div in list(g.nodes):
        if div.op != "Div" or id(div) in r.taken:
            continue
        sub, sqrt = r.producer(div.inputs[0], "Sub"), r.producer(div.inputs[1], "Sqrt")
        if sub is None or sqrt is None:
            continue
        x = sub.inputs[0]
        rm1 = r.producer(sub.inputs[1], "ReduceMean")
        addeps = r.producer(sqrt.inputs[0], "Add")
        if rm1 is None or addeps is None or rm1.inputs[0] != x or not _last_axis_only(r, rm1):
            continue
        i_eps = 1 if r.scalar(addeps.inputs[1]) is not None else 0
        eps = r.scalar(addeps.inputs[i_eps])
        rm2 = r.producer(addeps.inputs[1 - i_eps], "ReduceMean")
        if eps is None or rm2 is None or not _last_axis_only(r, rm2):
            continue
        pw = r.producer(rm2.inputs[0], "Pow", "Mul")
        d = sub.outputs[0]
        if pw is None or pw.inputs[0] != d or (pw.op == "Pow" and not _close(r.scalar(pw.inputs[1]), 2.0)) or \
                (pw.op == "Mul" and pw.inputs[1] != d):
            continue
        if sorted(id(n) for n in r.cons.get(d, [])) != sorted([id(div)] + [id(pw)] * (2 if pw.op == "Mul" else 1)):
            continue
        if not all(r.only_reader(a.outputs[0]) is b for a, b in ((rm1, sub), (pw, rm2), (rm2, addeps),
                                                                  (addeps, sqrt), (sqrt, div))):
            continue
        dim = g.value(x).shape[-1]
        pattern, out, gamma, beta = [rm1, sub, pw, rm2, addeps, sqrt, div], div.outputs[0], "", ""
        mul = r.only_reader(div.outputs[0])
        if mul is not None and mul.op == "Mul":
            gi = 1 if mul.inputs[0] == div.outputs[0] else 0
            c = r.const(mul.inputs[gi])
            if c is not None and c.size == dim and c.shape[-1] == dim:
                gamma = r.new_const(f"{div.name}/gamma", c.reshape(dim))
                pattern.append(mul)
                out = mul.outputs[0]
                add = r.only_reader(mul.outputs[0])
                if add is not None and add.op == "Add":
                    bi = 1 if add.inputs[0] == mul.outputs[0] else 0
                    c = r.const(add.inputs[bi])
                    if c is not None and c.size == dim and c.shape[-1] == dim:
                        beta = r.new_const(f"{div.name}/beta", c.reshape(dim))
                        pattern.append(add)
                        out = add.outputs[0]
        r.rewrite(pattern, [Node("LayerNormalization", f"{div.name}/layernorm", [x, gamma, beta], [out],
                                 {"axis": -1, "epsilon": eps}, "vnpu", div.opset)])
    return r.apply()


def fuse_attention(g: Graph) -> int:
    r = _Rewriter(g)
    extra = 0
    for sm in list(g.nodes):
        if sm.op != "Softmax" or id(sm) in r.taken:
            continue
        rank = len(g.value(sm.inputs[0]).shape)
        axis = int(sm.attrs.get("axis", -1 if sm.opset >= 13 else 1))
        if rank != 4 or axis % rank != 3:
            continue
        mm2 = r.only_reader(sm.outputs[0])
        if mm2 is None or mm2.op != "MatMul" or mm2.inputs[0] != sm.outputs[0]:
            continue
        pattern, cur, mask, scale = [sm, mm2], sm.inputs[0], "", 1.0
        p = r.prod.get(cur)
        if p is not None and p.op == "Add" and r.only_reader(cur) is sm:
            for i in (0, 1):
                pp = r.producer(p.inputs[i], "Div", "Mul", "MatMul")
                if pp is not None and r.only_reader(p.inputs[i]) is p:
                    pattern.append(p)
                    cur, mask = p.inputs[i], p.inputs[1 - i]
                    p = pp
                    break
        if p is not None and p.op in ("Div", "Mul") and _among(r.only_reader(cur), pattern):
            ci = 1 if r.scalar(p.inputs[1]) is not None else (0 if p.op == "Mul" else None)
            c = None if ci is None else r.scalar(p.inputs[ci])
            if c is not None and c != 0:
                scale = 1.0 / c if p.op == "Div" else c
                pattern.append(p)
                cur = p.inputs[1 - ci]
                p = r.prod.get(cur)
        if p is None or p.op != "MatMul" or id(p) in r.taken or not _among(r.only_reader(cur), pattern):
            continue
        q, kt, v = p.inputs[0], p.inputs[1], mm2.inputs[1]
        qs, ks, vs = g.value(q).shape, g.value(kt).shape, g.value(v).shape
        if not (len(qs) == len(ks) == len(vs) == 4 and qs[:2] == ks[:2] == vs[:2] and qs[3] == ks[2]
                and ks[3] == vs[2]):
            continue
        if mask:
            mv = g.value(mask)
            full = (qs[0], qs[1], qs[2], ks[3])
            ms = (1,) * (4 - len(mv.shape)) + tuple(mv.shape)
            if len(mv.shape) > 4 or mv.dtype != g.value(q).dtype or any(a not in (1, b) for a, b in zip(ms, full)):
                continue
        pattern.append(p)
        new_nodes = []
        t = r.producer(kt, "Transpose")
        if t is not None and r.only_reader(kt) is p and t.attrs.get("perm") is not None:
            perm = [int(i) for i in t.attrs["perm"]]
            t.attrs["perm"] = perm[:2] + [perm[3], perm[2]]
            g.values[kt].shape = (ks[0], ks[1], ks[3], ks[2])
            k = kt
        else:
            k = f"{kt}/k"
            while k in g.values:
                k += "_"
            g.values[k] = Value(k, (ks[0], ks[1], ks[3], ks[2]), g.value(kt).dtype)
            new_nodes.append(Node("Transpose", f"{p.name}/k", [kt], [k], {"perm": [0, 1, 3, 2]}, "", p.opset))
            extra += 1
        new_nodes.append(Node("Attention", f"{sm.name}/attention", [q, k, v] + ([mask] if mask else []),
                              [mm2.outputs[0]], {"scale": scale}, "vnpu", sm.opset))
        r.rewrite(pattern, new_nodes)
    return r.apply()


def fuse_conv_bn(g: Graph) -> int:
    r = _Rewriter(g)
    for bn in list(g.nodes):
        if bn.op != "BatchNormalization" or id(bn) in r.taken or any(o in r.cons for o in bn.outputs[1:] if o):
            continue
        conv = r.producer(bn.inputs[0], "Conv", "FusedConv")
        if conv is None or r.only_reader(conv.outputs[0]) is not bn or conv.attrs.get("act", "none") != "none":
            continue
        w = r.const(conv.inputs[1])
        b = r.const(conv.input(2)) if conv.input(2) else None
        params = [r.const(n) for n in bn.inputs[1:5]]
        if w is None or (conv.input(2) and b is None) or any(p is None for p in params):
            continue
        scale, beta, mean, var = (p.astype(np.float64) for p in params)
        a = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        w2 = (w.astype(np.float64) * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        b0 = np.zeros(w.shape[0]) if b is None else b.astype(np.float64)
        b2 = ((b0 - mean) * a + beta).astype(w.dtype)
        wn = r.new_const(f"{conv.name}/bn_weight", w2)
        bnn = r.new_const(f"{conv.name}/bn_bias", b2)
        r.rewrite([conv, bn], [Node("FusedConv", f"{conv.name}/bn", [conv.inputs[0], wn, bnn], [bn.outputs[0]],
                                    dict(conv.attrs, act="none"), "vnpu", conv.opset)])
    return r.apply()


def fuse_matmul_bias(g: Graph) -> int:
    r = _Rewriter(g)
    for add in list(g.nodes):
        if add.op != "Add" or id(add) in r.taken:
            continue
        for i in (0, 1):
            mm = r.producer(add.inputs[i], "MatMul")
            if mm is None or r.only_reader(mm.outputs[0]) is not add:
                continue
            b = g.value(mm.inputs[1])
            bias = r.const(add.inputs[1 - i])
            if len(b.shape) != 2 or bias is None or len(g.value(mm.inputs[0]).shape) < 1:
                continue
            n = b.shape[1]
            if bias.size != n or bias.shape[-1] != n or bias.dtype != b.dtype or \
                    g.value(add.outputs[0]).shape != g.value(mm.outputs[0]).shape:
                continue
            bn = r.new_const(f"{mm.name}/bias", bias.reshape(n))
            r.rewrite([mm, add], [Node("FusedMatMul", f"{mm.name}/bias", [mm.inputs[0], mm.inputs[1], bn],
                                       [add.outputs[0]], {"act": "none"}, "vnpu", mm.opset)])
            break
    return r.apply()


_ACTS = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}
_FUSES_ACT = ("FusedMatMul", "Gemm", "Conv", "FusedConv")


def fuse_activation(g: Graph) -> int:
    r = _Rewriter(g)
    for act in list(g.nodes):
        name = _ACTS.get(act.op)
        if act.op == "Gelu":
            name = "gelu" if act.attrs.get("approximate", "none") == "none" else "gelu_tanh"
        if name is None or id(act) in r.taken:
            continue
        p = r.producer(act.inputs[0], *_FUSES_ACT)
        if p is None or r.only_reader(p.outputs[0]) is not act or p.attrs.get("act", "none") != "none":
            continue
        if p.op == "Gemm" and name == "gelu_tanh":
            continue
        fused = p.copy()
        fused.attrs["act"] = name
        fused.outputs = [act.outputs[0]] + fused.outputs[1:]
        if fused.op == "Conv":
            fused.op, fused.domain = "FusedConv", "vnpu"
        r.rewrite([p, act], [fused])
    return r.apply()


#: the passes, in the order they run (later patterns build on earlier rewrites)
PASSES = (("gelu", fuse_gelu), ("layernorm", fuse_layernorm), ("attention", fuse_attention),
          ("conv_bn", fuse_conv_bn), ("matmul_bias", fuse_matmul_bias), ("activation", fuse_activation))


def fuse(g: Graph) -> dict[str, int]:
    """Run every pass; returns how many patterns each rewrote."""
    out = {name: fn(g) for name, fn in PASSES}
    g.prune()
    return out
