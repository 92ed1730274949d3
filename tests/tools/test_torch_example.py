"""The example of docs/torch.md ("Coming from torch_npu") runs as written (smoke tier): the Python block after
``<!-- torch-example -->`` is saved to a file and run in a fresh interpreter, as a user runs it, on the
default in-process devices.  Its printed embeddings' cosine equals sentence-transformers' on the CPU
(within the float32 bound of the embeddings), its training step's loss is the CPU's, and it leaves no
process behind (it exits)."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.bench.torch import EMBED_BOUND

pytestmark = pytest.mark.smoke
ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- torch-example -->"


def example_code(text: str) -> str:
    """The first fenced python block after :data:`MARK` (ValueError when the page has none)."""
    m = re.search(re.escape(MARK) + r"\s*```python\n(.*?)```", text, re.S)
    if not m:
        raise ValueError(f"docs/torch.md has no python block after {MARK}")
    return m.group(1)


def test_example_code_is_found():
    assert "import runtime.torch" in example_code((ROOT / "docs" / "torch.md").read_text())
    with pytest.raises(ValueError):
        example_code("# a page\n```python\nprint(1)\n```\n")


def _cpu_reference() -> tuple[float, float]:
    """What the example computes, on the CPU: the two sentences' cosine and the training step's loss."""
    import torch

    from runtime.models import hf
    emb = hf.minilm("cpu").encode(["An NPU runs matrix kernels.", "A virtual NPU runs them too."],
                                  convert_to_tensor=True)
    cos = torch.nn.functional.cosine_similarity(emb[0], emb[1], dim=0).item()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    loss = torch.nn.functional.cross_entropy(net(x), y).item()
    return cos, loss


def test_the_docs_example_runs_as_written(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(example_code((ROOT / "docs" / "torch.md").read_text()))
    env = dict(os.environ)
    for k in ("VNPU_BACKEND", "ASCEND_RT_VISIBLE_DEVICES", "VNPU_TORCH_STRICT"):
        env.pop(k, None)
    env["VNPU_DEVICES"] = "2"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    out = dict(ln.split(":", 1) for ln in p.stdout.splitlines() if ":" in ln)
    assert out["npu available"].split() == ["True", "devices:", "2"], p.stdout
    assert out["embeddings"].split() == ["npu:0", "(2,", "384)"], p.stdout
    cos, loss = _cpu_reference()
    # unit vectors a, b within EMBED_BOUND per component: |cos' - cos| <= |da| + |db| <= 2 sqrt(384) bound
    assert abs(float(out["cosine"]) - cos) <= 2 * math.sqrt(384) * EMBED_BOUND + 0.5e-4, (out["cosine"], cos)
    loss_text, _, timed = out["loss"].partition("step on the device clock (ms):")
    assert abs(float(loss_text) - loss) <= 0.5e-4 + 1e-5, (loss_text, loss)      # printed to 4 places
    assert timed.strip() == "True"
    assert int(out["npu memory allocated (bytes)"]) > 0
