#!/usr/bin/env bash
# Mutation score of the critical modules (mutmut; slow: NOT part of CI or scripts/test.sh).  Each target's
# named functions are mutated one change at a time in a scratch copy of the working tree, and the target's
# tests run against each mutant; the kill rate per target is printed (goal: >= 90 %).  See
# scripts/mutation.py for the targets, the tests each one runs, and the equivalent mutants.
#   scripts/mutation.sh                 # every target, one after another (an hour or more on 2 cores)
#   scripts/mutation.sh lease faults    # some targets
#   MUTATION_JOBS=2 scripts/mutation.sh --json mutation.json
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
exec .venv/bin/python scripts/mutation.py "$@"
