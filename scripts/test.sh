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
# the whole suite in two parts.  The first runs on two pytest-xdist workers, a test file per worker at a time
# (--dist loadfile: a module's fixtures, its server, are built once): every test that starts no Ray cluster --
# the in-process tests (no tier marker), the rpc tier (devices served over loopback gRPC in the test process)
# and the serve tier's in-process-device engines, servers and `vnpu serve --backend local` subprocesses.  Each
# worker is a session of its own (its own fresh HOME and RAY_TMPDIR, tests/conftest.py) and every resource
# they touch is per process (/dev/shm segments named by pid, ports bound to 0, files under tmp_path).  The
# tiers that start Ray clusters (cluster, multinode, smoke, security) then run one test at a time: two Ray
# clusters in one process cannot be, and their budgets are wall time of one test at a time.  Both parts share
# one weight cache, fresh for this run and removed after it (SmolLM2 is dequantised once).
export VNPU_TEST_WEIGHT_CACHE
VNPU_TEST_WEIGHT_CACHE=$(mktemp -d -t vnpu-test-weights-XXXXXX)
trap 'rm -rf "$VNPU_TEST_WEIGHT_CACHE"' EXIT
ray="cluster or multinode or smoke or security"
.venv/bin/python -m pytest -n 2 --dist loadfile -m "not ($ray)" -p no:cacheprovider
.venv/bin/python -m pytest -m "$ray" -p no:cacheprovider
