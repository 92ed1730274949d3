#!/usr/bin/env bash
# The main job: set everything up, then run a multi-device program on a local cluster of virtual NPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS=1
exec .venv/bin/vnpu demo "$@"
