#!/usr/bin/env bash
# The test command: set everything up, type-check (mypy: both backends' device handles against the
# runtime's DeviceHandle protocol, see [tool.mypy] in pyproject.toml), build the docs, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
.venv/bin/python -m mypy
# the docs site: a strict build (a broken link or anchor, a page missing from mkdocs.yml's nav fails it) into a
# temporary directory, removed again (site/ is never committed)
site=$(mktemp -d)
if ! NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site"; then
  rm -rf "$site"
  echo "scripts/test.sh: the docs do not build (mkdocs build --strict, above)" >&2
  exit 1
fi
rm -rf "$site"
exec .venv/bin/python -m pytest "$@"
