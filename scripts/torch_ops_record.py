"""Record the aten operators that real PyTorch code runs (on the CPU, through a TorchDispatchMode): HF
transformers SmolLM2 ``generate`` (greedy), sentence-transformers MiniLM ``encode``, a torch.nn training
step.  Prints a Markdown table per program (operator, calls, dtypes): the list the npu device must cover.

    .venv/bin/python scripts/torch_ops_record.py > ops.md
"""
from __future__ import annotations

import collections
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Recorder(TorchDispatchMode):
    """Counts each aten overload that reaches the dispatcher's Python key, with its tensors' dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.dtypes: dict[str, set] = collections.defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = f"{func.overloadpacket.__name__}.{func._overloadname}"
        self.calls[name] += 1
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, torch.Tensor):
                self.dtypes[name].add(str(a.dtype).replace("torch.", ""))
        return func(*args, **kwargs)


def smollm2(rec: Recorder) -> None:
    from runtime.models import hf
    model, tok = hf.smollm2()
    ids = tok("The capital of France is", return_tensors="pt")
    with rec, torch.no_grad():
        model.generate(**ids, max_new_tokens=4, do_sample=False)


def minilm(rec: Recorder) -> None:
    from runtime.models import hf
    model = hf.minilm("cpu")
    with rec:
        model.encode(["hello world", "a longer sentence about NPUs"], convert_to_tensor=True)


def train(rec: Recorder) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
    with rec:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()


PROGRAMS = [("SmolLM2-135M (transformers, GGUF Q4_1 dequantised to fp32)", smollm2,
             "generate greedy, prompt 6 tokens, max_new_tokens=4"),
            ("all-MiniLM-L6-v2 (sentence-transformers)", minilm, "encode 2 sentences"),
            ("torch.nn training step", train, "Linear-ReLU-Linear, cross_entropy, backward, SGD(lr=0.1) step")]


def main() -> int:
    out = ["# aten ops the real models run (recorded on CPU with a TorchDispatchMode)", "",
           f"torch {torch.__version__}; scripts/torch_ops_record.py", ""]
    for title, fn, what in PROGRAMS:
        rec = Recorder()
        fn(rec)
        out += [f"## {title}", "", what, "", "| op | count | dtypes |", "|---|---:|---|"]
        out += [f"| `aten.{op}` | {n} | {', '.join(sorted(rec.dtypes[op]))} |" for op, n in sorted(rec.calls.items())]
        out.append("")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
