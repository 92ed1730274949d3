"""The verdicts of the benchmarks whose full runs are too heavy to break on purpose in the suite (``bench
sanitize``: four runtimes with SmolLM2 and MiniLM; ``bench serve --load-step``: Ray Serve replicas under a
load step): each defect a run can show flips ``verified`` (and so the exit status) on its own.  The runs
themselves are verified for real in the smoke tier (tests/tools/test_smoke.py: bench sanitize) and by hand."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest

from runtime.bench.infer import EMBED_ATOL
from runtime.bench.sanitize import verify
from runtime.bench.serve_load import verified

REF_TOKENS = [5, 9, 2, 7, 7]
REF_EMB = np.linspace(-0.1, 0.1, 3 * 384, dtype=np.float32).reshape(3, 384)


def _mode(name, tokens=None, emb_shift=0.0, launches=(True,), errors=0):
    return SimpleNamespace(name=name, tokens=[list(REF_TOKENS[:4])] if tokens is None else tokens,
                           embeddings=[REF_EMB + np.float32(emb_shift)], launches_exact=list(launches),
                           session=SimpleNamespace(errors=errors) if name != "off" else None)


BOUND = {"tokens": REF_TOKENS, "embeddings": REF_EMB}


def test_sanitize_verdict_passes_what_matches_numpy():
    r = verify([_mode("off"), _mode("all", tokens=[REF_TOKENS + [1, 2]], emb_shift=EMBED_ATOL / 2)], BOUND)
    assert r["ok"] is True
    assert r["per_mode"]["all"]["tokens_differing_from_numpy"] == 0       # only the common prefix counts


@pytest.mark.parametrize("defect,field,value", [
    ({"tokens": [[5, 9, 3, 7]]}, "tokens_differing_from_numpy", 1),
    ({"tokens": [[]]}, "tokens_differing_from_numpy", 1),
    ({"tokens": []}, "decode_runs", 0),
    ({"emb_shift": 4 * EMBED_ATOL}, "max_abs_diff_vs_numpy", pytest.approx(4 * EMBED_ATOL, rel=1e-3)),
    ({"launches": (True, False)}, "wrong_launch_loops", 1),
    ({"errors": 2}, "findings", 2),
])
def test_sanitize_verdict_fails_on_each_defect(defect, field, value):
    r = verify([_mode("off"), _mode("racecheck", **defect)], BOUND)
    assert r["ok"] is False
    assert r["per_mode"]["racecheck"][field] == value
    assert verify([_mode("off"), _mode("racecheck")], BOUND)["ok"] is True


def _phase(**kw):
    return {"completed": 10, "refused": 2, "cut_short": 0, "errors": 0, **kw}


DOC = {"runs": [{"replicas": 1, "mode": m, "phases": {"light": _phase(), "heavy": _phase()}}
                for m in ("ultra_low_latency", "adaptive")]}


def test_load_step_verdict():
    assert verified(DOC) is True
    assert verified({"runs": []}) is False                                 # nothing measured: not verified
    for field, value in (("cut_short", 1), ("errors", 1), ("completed", 0)):
        bad = copy.deepcopy(DOC)
        bad["runs"][1]["phases"]["heavy"][field] = value
        assert verified(bad) is False, field
