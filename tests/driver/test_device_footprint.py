"""What a device process loads: only what a device needs (no model code, ONNX, tokenizers, GGUF, the HTTP
server or torch), so that dozens of device actors fit on one machine.  The host is built in a fresh
interpreter, exactly as a device actor builds it (its module list is read from that process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: packages a device process must never import (top-level names)
NOT_IN_A_DEVICE = {"runtime", "onnx", "onnxruntime", "tokenizers", "gguf", "safetensors", "fastapi", "uvicorn",
                   "starlette", "prometheus_client", "torch", "yaml", "openai"}

PROBE = r"""
import json, os, sys
from driver.host import NpuHost
h = NpuHost(0, "t" * 32, 4 << 20, host="127.0.0.1")
try:
    w = h.where()
    print(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules}), "where": w}))
finally:
    h.shutdown()
"""


def test_device_host_imports_only_what_a_device_needs():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    mods = set(out["modules"])
    assert {"devices", "driver", "numpy", "grpc"} <= mods          # the probe really built a device host
    assert out["where"]["device_id"] == 0 and out["where"]["address"].startswith("127.0.0.1:")
    assert not mods & NOT_IN_A_DEVICE, sorted(mods & NOT_IN_A_DEVICE)
