"""HCCL reductions of non-integer data round as the hardware does (in-process devices, every algorithm).

bfloat16 reductions accumulate in float32 and round each partial result to nearest even (ties to even)
into bfloat16; float16 ones round each float32 partial to nearest even float16.  The reference here is
independent of the engine's bit tricks: numpy ``frexp``/``rint``/``ldexp`` in float64.

- Two ranks: every reduced element is ONE reduction of the two inputs whatever the algorithm, so the
  result is compared bit for bit with the reference (a truncating conversion, or one that rounds ties
  away from zero, fails here).
- Three and four ranks: the order depends on the algorithm, so the result must lie within the first-order
  bound ``(n - 1) u sum|x|`` of the exact sum (``u``: the unit roundoff of the dtype), and every rank
  must hold the same bits.
- Special values (inf, NaN, overflow to inf) come out as IEEE arithmetic says.

The tensors are small (this module runs in seconds: the mutation run of devices/hccl.py uses it).
"""
from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

from conftest import make_local_runtime
from runtime import hccl

ALGOS = ("ring", "hd", "mesh", "oneshot")
BITS = {"bfloat16": 8, "float16": 11}          #: significand bits (with the implicit one)
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


@pytest.fixture(scope="module")
def devs():
    r = make_local_runtime(4, arena=8 << 20)
    try:
        yield r.devices()
    finally:
        r.close()


# ------------------------------------------------------------------------------------------ reference
def round_nearest_even(x: np.ndarray, bits: int) -> np.ndarray:
    """float64 -> the nearest float with ``bits`` significand bits, ties to even (normal range only)."""
    m, e = np.frexp(np.asarray(x, np.float64))
    return np.ldexp(np.rint(np.ldexp(m, bits)), e - bits)


def engine_round(x: np.ndarray, dtype: str) -> np.ndarray:
    """What one reduction step does to an exact float64 result: round to float32, then to the dtype."""
    return round_nearest_even(round_nearest_even(x, 24), BITS[dtype])


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values exactly representable in ``dtype`` -> the device buffer's contents."""
    if dtype == "bfloat16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.int16)   # exact: low bits 0
    return x.astype(np.float16)


def from_storage(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.view(np.float16).astype(np.float64)


def inputs(n: int, count: int, dtype: str, redop: str, seed: int) -> np.ndarray:
    """(n, count) non-integer values, each exactly representable in ``dtype``, magnitudes in [1/8, 8)
    (products near 1): every partial result stays a normal number."""
    rng = np.random.default_rng(seed)
    if redop == "prod":
        x = rng.uniform(0.7, 1.4, (n, count))
    else:
        x = rng.choice([-1.0, 1.0], (n, count)) * np.exp2(rng.uniform(-3, 3, (n, count)))
    x = round_nearest_even(x, BITS[dtype])
    assert np.any(x != np.round(x)), "the data must not be integers"
    return x


_EXACT = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": np.maximum, "min": np.minimum}


# ------------------------------------------------------------------------------------------ runner
@contextlib.contextmanager
def communicators(devs, algo):
    comms = hccl.comm_init_all(devs, hccl.CommOptions(algo=algo, exec_timeout_s=30))
    try:
        yield comms
    finally:
        for c in comms:
            c.destroy()


def run(comms, op: str, x: np.ndarray, dtype: str, redop: str, root: int = 0) -> list[np.ndarray | None]:
    """Issue ``op`` on every rank with rank r's send buffer = x[r]; the recv buffers as float64 (None: a
    non-root rank of a reduce)."""
    n, send_n = x.shape
    count = send_n // n if op == "reducescatter" else send_n
    held, out = [], []
    try:
        for r, c in enumerate(comms):
            d = c.device
            send = d.from_numpy(to_storage(x[r], dtype))
            recv = d.from_numpy(np.zeros(count, np.int16 if dtype == "bfloat16" else np.float16))
            held += [send, recv]
            c.collective(op, send.ptr, recv.ptr, count, dtype, redop, root=root)
        for c in comms:
            c.device.synchronize()
        for r in range(n):
            out.append(None if op == "reduce" and r != root else from_storage(held[2 * r + 1].numpy(), dtype))
    finally:
        for t in held:
            t.free()
    return out


# ------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_two_ranks_round_to_nearest_even_bit_exact(devs, dtype, algo):
    with communicators(devs[:2], algo) as comms:
        seed = 0
        for redop in ("sum", "prod", "max", "min"):
            for op, root in (("allreduce", 0), ("reducescatter", 0), ("reduce", 1)):
                seed += 1
                x = inputs(2, 258, dtype, redop, seed)
                got = run(comms, op, x, dtype, redop, root)
                want = engine_round(_EXACT[redop](x[0], x[1]), dtype)
                for r, g in enumerate(got):
                    if g is None:
                        continue
                    w = want[r * 129:(r + 1) * 129] if op == "reducescatter" else want
                    bad = np.flatnonzero(g != w)
                    assert bad.size == 0, (f"{op}/{redop} {dtype} {algo} rank {r}: {bad.size} of {w.size} differ, "
                                           f"first {g[bad[0]]!r} != {w[bad[0]]!r}")
                if redop == "sum":                   # the data does need rounding: ties and inexact sums
                    assert np.any(want != x[0] + x[1])


def test_ties_go_to_even(devs):
    """Sums that fall exactly halfway between two bfloat16 / float16 values round to the even one
    (truncation and round-half-away-from-zero both fail this)."""
    with communicators(devs[:2], "ring") as comms:
        for dtype in ("bfloat16", "float16"):
            bits = BITS[dtype]
            ulp1 = 2.0 ** (1 - bits)                # the spacing of values in [1, 2)
            k = np.arange(1, 65, dtype=np.float64)
            a = 1.0 + k * ulp1                      # representable
            b = np.full_like(a, ulp1 / 2)           # exactly half a spacing: every sum is a tie
            got = run(comms, "allreduce", np.stack([a, b]), dtype, "sum")[0]
            even = np.where(k % 2 == 0, a, a + ulp1)
            assert np.array_equal(got, even), (dtype, got[:4], even[:4])
            got = run(comms, "allreduce", np.stack([-a, -b]), dtype, "sum")[0]
            assert np.array_equal(got, -even), dtype


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_more_ranks_within_the_rounding_bound_and_identical(devs, dtype, algo, n):
    with communicators(devs[:n], algo) as comms:
        x = inputs(n, 301, dtype, "sum", 40 + n)
        got = run(comms, "allreduce", x, dtype, "sum")
        exact = x.sum(0)
        bound = (n - 1) * UNIT[dtype] * np.abs(x).sum(0)
        err = np.abs(got[0] - exact)
        assert np.all(err <= bound), f"{int(np.sum(err > bound))} beyond the bound, worst {float(np.max(err / bound))}x"
        assert np.any(got[0] != exact)              # rounding happened
        for g in got[1:]:
            assert np.array_equal(g, got[0]), "ranks disagree"
        x = inputs(n, 301, dtype, "prod", 50 + n)
        got = run(comms, "allreduce", x, dtype, "prod")
        exact = np.prod(x, 0)
        assert np.all(np.abs(got[0] - exact) <= ((1 + UNIT[dtype]) ** (n - 1) - 1) * 1.001 * np.abs(exact))
        for redop, red in (("max", np.max), ("min", np.min)):
            x = inputs(n, 301, dtype, redop, 60 + n)
            got = run(comms, "allreduce", x, dtype, redop)
            assert all(np.array_equal(g, red(x, 0)) for g in got)          # exact


@pytest.mark.filterwarnings("ignore::RuntimeWarning")       # inf - inf, overflow: on purpose
def test_special_values(devs):
    """inf + finite = inf, inf + -inf = NaN, NaN propagates, and a sum past the largest finite value
    rounds to inf (bfloat16 max 3.39e38, float16 max 65504)."""
    with communicators(devs[:2], "ring") as comms:
        inf, nan = np.inf, np.nan
        a = np.array([inf, inf, nan, 1.0, -inf, 2.0 ** 127 * 1.5])
        b = np.array([1.0, -inf, 1.0, nan, -2.0, 2.0 ** 127 * 1.5])
        got = run(comms, "allreduce", np.stack([a, b]), "bfloat16", "sum")[0]
        np.testing.assert_array_equal(got, [inf, nan, nan, nan, -inf, inf])
        a16 = np.array([inf, nan, 60000.0, -60000.0])
        b16 = np.array([-inf, 0.5, 8000.0, -8000.0])
        got = run(comms, "allreduce", np.stack([a16, b16]), "float16", "sum")[0]
        np.testing.assert_array_equal(got, [nan, nan, inf, -inf])


# ------------------------------------------------------------------------------------------ vnpu bench hccl
def _bench(capsys, *args) -> tuple[int, dict]:
    from runtime.cli import main
    rc = main(["bench", "hccl", "--devices", "4", "--min-bytes", "64", "--max-bytes", "4K", "--iters", "2",
               "--warmup", "0", "--no-baselines", "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("dtype,redop", [("bfloat16", "sum"), ("float16", "sum"), ("float32", "sum"),
                                         ("bfloat16", "prod")])
def test_bench_hccl_checks_non_integer_data_within_the_rounding_bound(monkeypatch, capsys, dtype, redop):
    """``vnpu bench hccl``'s ``#wrong`` on non-integer data: 0 for the engine as it is, and a truncating
    bfloat16 conversion (the mutation the old integer-only check let through) makes it count wrong
    elements and exit 1."""
    from runtime.bench import hccl as bench
    monkeypatch.setenv("VNPU_BACKEND", "local")
    vals = bench._values("allreduce", 1, 64, redop, dtype)
    assert np.any(vals != np.round(vals))                      # the data is not integers
    rc, rep = _bench(capsys, "--op", "allreduce,reducescatter,reduce", "--dtype", dtype, "--redop", redop)
    assert rc == 0 and rep["out_of_bounds"] == 0 and len(rep["rows"]) == 3 * 7, rep   # 3 ops x 64 B..4 KiB
    if dtype == "bfloat16":
        import devices.hccl as engine
        monkeypatch.setattr(engine, "_f32_to_bf16", lambda x: (x.astype(np.float32).view(np.uint32) >> 16)
                            .astype(np.uint16))
        # two ranks: one rounding per element, the bound is tight enough to see truncation's bias
        rc, rep = _bench(capsys, "--op", "allreduce", "--dtype", dtype, "--redop", redop, "--devices", "2")
        assert rc == 1 and rep["out_of_bounds"] > 0, rep
