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
if [ "$#" -gt 0 ]; then                        # a selection of the caller's: as they asked
  exec .venv/bin/python -m pytest "$@"
fi
# the whole suite in two parts.  The in-process tests (no tier marker: every device, runtime, model and
# tool test that starts no cluster, server or subprocess of its own) run on two pytest-xdist workers, a
# test file per worker at a time (--dist loadfile: a module's fixtures are built once); each worker is a
# session of its own (its own fresh HOME and RAY_TMPDIR, tests/conftest.py) and every resource they touch is
# per process (/dev/shm segments named by pid, ports bound to 0).  The tiers that start Ray clusters, servers
# and processes then run one test at a time, as before: two Ray clusters in one process cannot be, and their
# budgets are wall time of one test at a time.
heavy="cluster or serve or multinode or smoke or security or rpc"
.venv/bin/python -m pytest -n 2 --dist loadfile -m "not ($heavy)" -p no:cacheprovider
exec .venv/bin/python -m pytest -m "$heavy" -p no:cacheprovider
