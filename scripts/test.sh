#!/usr/bin/env bash
# The test command: set everything up, type-check (mypy: both backends' device handles against the
# runtime's DeviceHandle protocol, see [tool.mypy] in pyproject.toml), then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
