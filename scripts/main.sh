#!/usr/bin/env bash
# The main job: set everything up, then run a multi-device program on a local cluster of virtual NPUs.
# Its serving step compiles MiniLM-L3 with `vnpu atc`, serves the .om beside the LLM over the Open
# Inference Protocol (REST + gRPC) and asks it with tritonclient (runtime/cli/demo_om.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS=1
exec .venv/bin/vnpu demo "$@"
