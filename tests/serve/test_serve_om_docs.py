"""The docs' section on serving compiled models (docs/serving/kserve-v2.md) works as written (serve tier): its ``vnpu atc`` command
compiles MiniLM-L3 (the wheel's ONNX in place of the file name), its ``config.yaml`` goes into a model
repository in Triton's layout as its ``mkdir``/``mv`` lines say, a real server serves that repository
(three in-process devices: the example's instance on npu 1, its chain ``[2, cpu]``; without the LLM the
command serves beside it), and its ``tritonclient`` snippet runs unmodified but for the server's address:
it prints what the docs' comment says, and the embeddings it got equal onnxruntime's."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from devices.device import DeviceConfig
from onnx_models import assert_close, ort_run
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.models.weights import minilm_l3_onnx
from runtime.serve.modelrepo import scan_repository
from runtime.serve.server import Server, Service

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[2]
DOC = "docs/serving/kserve-v2.md"
SECTION = "## Serving compiled models"


def _blocks() -> dict[str, list[str]]:
    """The fenced blocks of the docs' compiled-model section, by language, in order."""
    text = (ROOT / DOC).read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    out: dict[str, list[str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", text[start:end], re.S):
        out.setdefault(lang, []).append(body)
    return out


def _atc_args(bash: str) -> tuple[list[str], str]:
    """The ``vnpu atc`` command's arguments (continuation lines joined) and the ``--model`` file it names."""
    lines = bash.replace("\\\n", " ").splitlines()
    atc = next(ln for ln in lines if ln.startswith("vnpu atc "))
    args = shlex.split(atc)[2:]
    model = args[args.index("--model") + 1]
    return args, model


def test_the_readme_repository_example_and_tritonclient_snippet_work_as_written(tmp_path):
    blocks = _blocks()
    bash, = [b for b in blocks["bash"] if "vnpu atc " in b]
    yaml_text, = blocks["yaml"]
    snippet = blocks["python"][-1]
    # the atc command, on the wheel's ONNX, run where the docs' next lines expect its output
    args, named = _atc_args(bash)
    assert named.endswith("MiniLM-L3-v2.onnx")
    args[args.index("--model") + 1] = str(minilm_l3_onnx())
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "atc", *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "mkdir -p models/minilm/1 && mv minilm.om models/minilm/1/model.om" in bash
    assert "--model-repository models" in bash
    (tmp_path / "models" / "minilm" / "1").mkdir(parents=True)
    (tmp_path / "minilm.om").rename(tmp_path / "models" / "minilm" / "1" / "model.om")
    assert yaml_text.startswith("# models/minilm/config.yaml")
    (tmp_path / "models" / "minilm" / "config.yaml").write_text(yaml_text)
    repo = scan_repository(tmp_path / "models")
    repo.check()                                          # the documented config loads against its .om
    cfg = repo.model("minilm").config
    assert cfg.max_batch_size == 8 and cfg.dynamic_batching.preferred_batch_size == (4, 8)

    rt = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=256 << 20)))
    svc = Service(rt, (), repositories=(repo,))
    srv = Server(svc).start()
    try:
        svc.load()
        documented = re.search(r'InferenceServerClient\("([^"]+)"\)', snippet).group(1)   # the doc's address
        code = snippet.replace(documented, srv.url.removeprefix("http://"))
        ns: dict = {}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/serving/kserve-v2.md (compiled models snippet)", "exec"), ns)     # noqa: S102 - the doc's code
        shape_line, count_line = out.getvalue().splitlines()
        assert shape_line == "(3, 384) 1"                 # what the docs' comment says it prints
        assert int(count_line) >= 1
        ids = ns["ids"]
        want = dict(zip(_output_names(), ort_run(str(minilm_l3_onnx()), {"input_ids": ids,
                                                                           "attention_mask": np.ones_like(ids)})))
        assert_close(ns["r"].as_numpy(ns["pooled"]), want[ns["pooled"]], k=1536, depth=3, what="pooled")
        ns["c"].close()
    finally:
        srv.stop()
        rt.close()


def _output_names() -> list[str]:
    import onnxruntime as ort
    sess = ort.InferenceSession(str(minilm_l3_onnx()), providers=["CPUExecutionProvider"])
    return [o.name for o in sess.get_outputs()]
