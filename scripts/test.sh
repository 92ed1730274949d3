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
# the whole suite in two phases, each in two parts run at the same time.  The Ray tiers (cluster, multinode,
# smoke, security: the tests that start Ray clusters) run one test at a time -- two Ray clusters in one process
# cannot be -- and mostly wait (on Ray's processes starting, actors, subprocesses).  Beside them, the rest runs
# on two pytest-xdist workers, a test file per worker at a time (--dist loadfile: a module's fixtures, its
# server, are built once): the in-process tests (no tier marker), the rpc tier (devices served over loopback
# gRPC in the test process) and the serve tier's in-process-device engines, servers and `vnpu serve --backend
# local` subprocesses.  Phase 1 is the serve tier (its in-process tests on both workers, the Ray Serve replica
# tests beside them), phase 2 everything else: the serve tier's engines generate tokens on both cores, and
# beside the whole Ray part -- which comes first when both want the CPU -- it took 2.5 times as long as on
# its own.  Each pytest session and each worker has its own fresh HOME and RAY_TMPDIR (tests/conftest.py) and
# every resource a test touches is its own (/dev/shm segments named by pid and checked by owner, ports bound to
# 0, files under tmp_path).  All parts share one weight cache, fresh for this run and removed after it
# (SmolLM2 is dequantised once).  A Ray part's output is shown once its in-process part is done; the run fails
# if any part does.  The tiers' times against their budgets are those of the whole run: every part appends its
# tests' intervals to one file, and a tier's time is the wall-clock time during which any of its tests ran
# (tests/tier_budgets.py; enforced, failing the run, with VNPU_TIER_BUDGETS=enforce).
export VNPU_TEST_WEIGHT_CACHE VNPU_TIER_SPANS
VNPU_TEST_WEIGHT_CACHE=$(mktemp -d -t vnpu-test-weights-XXXXXX)
VNPU_TIER_SPANS=$(mktemp -t vnpu-test-tiers-XXXXXX.jsonl)
ray_log=$(mktemp -t vnpu-test-ray-XXXXXX.log)
ray_pid=
cleanup() {
  if [ -n "$ray_pid" ] && kill -0 "$ray_pid" 2>/dev/null; then
    kill -TERM -- "-$ray_pid" 2>/dev/null || true     # its own process group (set -m): pytest and its children
    wait "$ray_pid" 2>/dev/null || true
  fi
  rm -rf "$VNPU_TEST_WEIGHT_CACHE" "$ray_log" "$VNPU_TIER_SPANS"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ray="cluster or multinode or smoke or security"
exit_after_atexit='import atexit, os, sys, threading, pytest
rc = int(pytest.main())
threading._shutdown()
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(rc)'
failed=""
# one phase: the Ray tiers' tests of selection $2 in the background, the others of it on two workers; $1 names it
phase() {
  local name=$1 sel=$2 rc=0 ray_rc=0
  echo "== phase $name: $sel =="
  set -m                                       # the Ray part in a process group of its own, SIGINT not ignored
  # its exit skips the C++ static destructors (after pytest, the join of non-daemon threads and every atexit
  # handler -- Ray's shutdown, the clusters' -- as a normal exit does them): Ray's core once crashed the
  # finished process there (std::bad_alloc in its log sink, SIGSEGV, after every test had passed)
  .venv/bin/python -c "$exit_after_atexit" -m "($ray) and ($sel)" -p no:cacheprovider >"$ray_log" 2>&1 &
  ray_pid=$!
  set +m
  # niced: when both want the CPU, the Ray tiers' heartbeats and deadlines (failover's 1 s hang deadline) come first
  nice -n 10 .venv/bin/python -m pytest -n 2 --dist loadfile -m "not ($ray) and ($sel)" -p no:cacheprovider || rc=$?
  echo "== phase $name, the Ray tiers ($ray), run beside the part above: waiting for them (progress: $ray_log) =="
  wait "$ray_pid" || ray_rc=$?
  ray_pid=
  cat "$ray_log"
  [ "$rc" -eq 0 ] || failed="$failed $name/in-process (exit $rc)"
  [ "$ray_rc" -eq 0 ] || failed="$failed $name/Ray tiers (exit $ray_rc)"
}
phase 1 "serve"
phase 2 "not serve"
budget_rc=0
.venv/bin/python tests/tier_budgets.py "$VNPU_TIER_SPANS" || budget_rc=$?
[ "$budget_rc" -eq 0 ] || failed="$failed tier-budgets (exit $budget_rc)"
if [ -n "$failed" ]; then
  echo "scripts/test.sh: failed:$failed" >&2
  exit 1
fi
