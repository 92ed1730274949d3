"""devices.hccl_schedule: the collective schedules, checked symbolically (pure, no devices).

Every rank's buffers hold, per element, a Counter of *contributions* ``(rank, index)`` — the element of
``rank``'s send buffer it came from.  A reducing pull adds Counters, a copy replaces them.  The simulator
executes exactly what the engine (devices.hccl.HcclEngine._collective) executes:

    prologue copies; barrier "ready"; phase 0 steps; barrier "phase1"; phase 1 steps; ...; epilogue
    copies; barrier "done"

where a barrier posts a message to every peer and then waits for one from every peer, and a step waits
for its (peer, tag) messages, does its pulls and then posts its signals.  Messages live in a mailbox
keyed like the engine's ``(tag, from, to)`` and a wait consumes them.  The ranks run concurrently: the
next action is taken from a runnable rank drawn by Hypothesis, so every test explores a random valid
interleaving.  On top of the final-result check, a vector-clock race detector flags any pair of
accesses to the same element (a write vs. another rank's read or write of it) that the messages do not
order — a write-after-read or read-before-write hazard shows up even when this interleaving happened
to be harmless.  If no rank can move before every rank is done, the schedule deadlocks.  With
``push=True`` (peers' memory writable: one node) a step's pushes write the pusher's range into peers'
buffers after its pulls; the detector then also orders those remote writes against the owner's own
reads and writes.
"""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from devices import hccl_schedule as hs
from devices.hccl_schedule import (ALGOS, OPS, Phase, Pull, Push, Step, choose_algo, chunks, epilogue, prologue,
                                   schedule)

JUNK = "junk"       # initial content of a non-send buffer element: ("junk", rank, storage, index)


# ------------------------------------------------------------------------------------------ layout
def buffer_sizes(op: str, n: int, count: int) -> dict[str, int]:
    """Elements of each of one rank's buffers (as the engine allocates / the user passes them)."""
    return {
        "allreduce": {"send": count, "recv": count, "work": count},
        "allgather": {"send": count, "recv": count * n},
        "reducescatter": {"send": count * n, "recv": count, "work": count * n},
        "broadcast": {"send": count, "recv": count},
        "reduce": {"send": count, "recv": count},
        "alltoall": {"send": count * n, "recv": count * n},
        "barrier": {"send": 0, "recv": 0},
    }[op]


def aliases(op: str, n: int, r: int, count: int, inplace: bool) -> dict[str, tuple[str, int]]:
    """Buffer name -> (storage, element offset).  Broadcast always works in one buffer (the runtime
    passes the same pointer as send and recv); in-place follows the NCCL/HCCL conventions."""
    a = {"send": ("send", 0), "recv": ("recv", 0), "work": ("work", 0)}
    if op == "broadcast" or (inplace and op in ("allreduce", "reduce", "alltoall")):
        a["recv"] = ("send", 0)
    elif inplace and op == "allgather":       # send is recv's own block
        a["send"] = ("recv", r * count)
    elif inplace and op == "reducescatter":   # recv is send's own block
        a["recv"] = ("send", r * count)
    return a


def expected(op: str, n: int, r: int, count: int, root: int) -> list[Counter] | None:
    """What rank r's recv buffer must hold (None: not checked)."""
    def one(q, i):
        return Counter({(q, i): 1})

    def every(i):
        return Counter({(q, i): 1 for q in range(n)})
    if op == "allreduce":
        return [every(i) for i in range(count)]
    if op == "allgather":
        return [one(q, i) for q in range(n) for i in range(count)]
    if op == "reducescatter":
        return [every(r * count + i) for i in range(count)]
    if op == "broadcast":
        return [one(root, i) for i in range(count)]
    if op == "reduce":
        return [every(i) for i in range(count)] if r == root else None
    if op == "alltoall":
        return [one(q, r * count + i) for q in range(n) for i in range(count)]
    return None


# ------------------------------------------------------------------------------------------ simulator
class Race(AssertionError):
    pass


class Deadlock(AssertionError):
    pass


class Sim:
    """One collective on n ranks, executed action by action."""

    def __init__(self, op: str, algo: str, n: int, count: int, root: int = 0, inplace: bool = False,
                 push: bool = False):
        self.op, self.algo, self.n, self.count, self.root, self.push = op, algo, n, count, root, push
        sizes = buffer_sizes(op, n, count)
        self.alias = [aliases(op, n, r, count, inplace) for r in range(n)]
        # storage[r][name] = list of (content Counter); accesses tracked per element
        self.mem: list[dict[str, list[Counter]]] = []
        for r in range(n):
            # every storage starts as junk, then the user's send data is placed where "send" points
            self.mem.append({name: [Counter({(JUNK, r, name, i): 1}) for i in range(size)]
                             for name, size in sizes.items()})
            storage, base = self.alias[r]["send"]
            for i in range(sizes["send"]):
                self.mem[r][storage][base + i] = Counter({(r, i): 1})
        self.initial_send = [list(m["send"]) for m in self.mem]
        # race detection: vector clocks; per element the last write (writer, its clock) and the
        # latest read clock of each rank that read it
        self.vc = [[0] * n for _ in range(n)]
        self.last_write: dict[tuple, tuple[int, int]] = {}
        self.reads: dict[tuple, dict[int, int]] = {}
        self.mailbox: dict[tuple, list[int]] = {}      # (tag, frm, to) -> sender's clock
        self.programs = [self._program(r) for r in range(n)]
        self.pc = [0] * n
        self.actions = 0

    # ---- the per-rank program, as the engine runs it
    def _program(self, r: int) -> list[tuple]:
        n = self.n
        others = [q for q in range(n) if q != r]
        prog: list[tuple] = []

        def barrier(tag):
            prog.append(("signal", tuple(others), tag))
            prog.append(("wait", tuple((q, tag) for q in others)))
        for src, so, dst, do, cnt in prologue(self.op, n, r, self.count, self.algo, self.root):
            prog.append(("local", src, so, dst, do, cnt))
        barrier("ready")
        phases = schedule(self.op, self.algo, n, r, self.count, self.root, self.push)
        assert all(isinstance(p, Phase) for p in phases)
        for i, phase in enumerate(phases):
            if i:
                barrier(f"phase{i}")
            for step in phase.steps:
                assert isinstance(step, Step)
                if step.waits:
                    prog.append(("wait", tuple(step.waits), None))
                for p in step.pulls:
                    assert isinstance(p, Pull)
                    prog.append(("pull", p))
                for p in step.pushes:
                    assert isinstance(p, Push) and self.push, "a push where peers' memory is not writable"
                    prog.append(("push", p))
                if step.signals:
                    prog.append(("signal", tuple(step.signals), step.tag))
        for src, so, dst, do, cnt in epilogue(self.op, n, r, self.count, self.algo):
            prog.append(("local", src, so, dst, do, cnt))
        barrier("done")
        return prog

    # ---- memory with access checks
    def _loc(self, r: int, buf: str, off: int) -> tuple[str, int]:
        storage, base = self.alias[r][buf]
        return storage, base + off

    def _elem(self, owner: int, buf: str, off: int, count: int) -> list[tuple]:
        storage, base = self._loc(owner, buf, off)
        size = len(self.mem[owner][storage])
        assert 0 <= base and base + count <= size, \
            f"rank {owner} {buf}[{off}:{off + count}] outside its {size}-element {storage} buffer"
        return [(owner, storage, base + i) for i in range(count)]

    def _read(self, actor: int, key: tuple) -> Counter:
        owner = key[0]
        w = self.last_write.get(key)
        if w is not None and w[0] != actor and self.vc[actor][w[0]] < w[1]:
            raise Race(f"rank {actor} reads {key} concurrently with rank {w[0]}'s write of it")
        self.reads.setdefault(key, {})[actor] = self.vc[actor][actor]
        return self.mem[owner][key[1]][key[2]]

    def _write(self, actor: int, key: tuple, value: Counter) -> None:
        owner = key[0]
        assert actor == owner or self.push, "a rank only writes its own memory (pull-based transport)"
        for reader, clock in self.reads.get(key, {}).items():
            if reader != actor and self.vc[actor][reader] < clock:
                raise Race(f"rank {actor} overwrites {key} while rank {reader}'s read of it is unordered "
                           f"(write-after-read)")
        w = self.last_write.get(key)
        if w is not None and w[0] != actor and self.vc[actor][w[0]] < w[1]:
            raise Race(f"rank {actor} writes {key} concurrently with rank {w[0]}'s write of it")
        self.reads.pop(key, None)
        self.last_write[key] = (actor, self.vc[actor][actor])
        self.mem[owner][key[1]][key[2]] = value

    def _move(self, actor, src_owner, src, so, dst, do, cnt, reduce, base=None):
        skeys = self._elem(src_owner, src, so, cnt)
        dkeys = self._elem(actor, dst, do, cnt)
        vals = [self._read(actor, k) for k in skeys]     # the whole source range is read ...
        # ... and the left operand: my own ``base`` range at the source's offsets, or dst itself
        lefts = [self._read(actor, k) for k in self._elem(actor, base, so, cnt)] if base else \
            [self.mem[actor][k[1]][k[2]] for k in dkeys]
        for k, v, left in zip(dkeys, vals, lefts):        # ... then written (np.copyto / ufunc out=)
            self._write(actor, k, left + v if reduce else Counter(v))

    # ---- scheduling
    def runnable(self, r: int) -> bool:
        if self.pc[r] >= len(self.programs[r]):
            return False
        act = self.programs[r][self.pc[r]]
        if act[0] == "wait":
            return all((tag, q, r) in self.mailbox for q, tag in act[1])
        return True

    def step(self, r: int) -> None:
        act = self.programs[r][self.pc[r]]
        self.pc[r] += 1
        self.actions += 1
        self.vc[r][r] += 1
        kind = act[0]
        if kind == "local":
            _, src, so, dst, do, cnt = act
            if self._loc(r, src, so) != self._loc(r, dst, do):   # the engine skips a copy onto itself
                self._move(r, r, src, so, dst, do, cnt, False)
        elif kind == "pull":
            p: Pull = act[1]
            assert 0 <= p.peer < self.n, f"rank {r} pulls from {p.peer}"   # its own buffer is allowed
            assert p.count >= 0
            assert p.base is None or p.reduce, "a base is the left operand of a reduction"
            self._move(r, p.peer, p.src, p.src_off, p.dst, p.dst_off, p.count, p.reduce, p.base)
        elif kind == "push":
            p: Push = act[1]
            vals = [self._read(r, k) for k in self._elem(r, p.buf, p.off, p.count)]
            for q in p.peers:
                assert 0 <= q < self.n and q != r, f"rank {r} pushes to {q}"
                for k, v in zip(self._elem(q, p.buf, p.off, p.count), vals):
                    self._write(r, k, Counter(v))
        elif kind == "signal":
            _, peers, tag = act
            for q in peers:
                assert 0 <= q < self.n and q != r, f"rank {r} signals {q}"
                key = (tag, r, q)
                assert key not in self.mailbox, f"message {key} posted twice (the mailbox would merge them)"
                self.mailbox[key] = list(self.vc[r])
        elif kind == "wait":
            for q, tag in act[1]:
                clock = self.mailbox.pop((tag, q, r))
                self.vc[r] = [max(a, b) for a, b in zip(self.vc[r], clock)]
        else:  # pragma: no cover
            raise AssertionError(act)

    def done(self) -> bool:
        return all(self.pc[r] >= len(self.programs[r]) for r in range(self.n))

    def run(self, choose) -> None:
        """``choose(k)`` picks one of k runnable ranks."""
        while not self.done():
            ready = [r for r in range(self.n) if self.runnable(r)]
            if not ready:
                stuck = {r: self.programs[r][self.pc[r]] for r in range(self.n) if self.pc[r] < len(self.programs[r])}
                raise Deadlock(f"{self.op}/{self.algo} n={self.n} count={self.count}: no rank can move; "
                               f"waiting: {stuck}")
            self.step(ready[choose(len(ready))])

    # ---- results
    def recv(self, r: int) -> list[Counter]:
        storage, base = self.alias[r]["recv"]
        size = buffer_sizes(self.op, self.n, self.count)["recv"]
        return self.mem[r][storage][base:base + size]

    def check(self, inplace: bool) -> None:
        for r in range(self.n):
            want = expected(self.op, self.n, r, self.count, self.root)
            if want is not None:
                got = self.recv(r)
                bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
                assert len(got) == len(want) and not bad, \
                    (f"{self.op}/{self.algo} n={self.n} count={self.count} root={self.root} rank {r}: element "
                     f"{bad[0]} holds {dict(got[bad[0]])}, expected {dict(want[bad[0]])}")
            if not inplace and self.op not in ("broadcast",):
                assert self.mem[r]["send"] == self.initial_send[r], f"rank {r}'s send buffer was modified"
        # every message that was posted was also consumed: nothing is left behind in a mailbox
        assert not self.mailbox, f"messages never waited for (leak in the peers' mailboxes): {sorted(self.mailbox)[:5]}"


def effective_algo(op: str, n: int, algo: str) -> str:
    """The algorithm the engine runs for ``op`` when ``algo`` is requested (as HcclEngine does)."""
    return choose_algo(op, n, 0, algo)


def simulate(op, algo, n, count, root=0, inplace=False, choose=lambda k: 0, push=False) -> Sim:
    sim = Sim(op, effective_algo(op, n, algo), n, count, root, inplace, push)
    sim.run(choose)
    sim.check(inplace)
    return sim


# ------------------------------------------------------------------------------------------ property tests
COLLECTIVES = [o for o in OPS]
INPLACE_OPS = ("allreduce", "reduce", "allgather", "reducescatter", "broadcast")


@st.composite
def cases(draw, ops=COLLECTIVES, max_n=9, max_count=50):
    op = draw(st.sampled_from(ops))
    n = draw(st.integers(1, max_n))
    count = draw(st.one_of(st.integers(0, n), st.integers(0, max_count)))     # counts below n are common
    algo = draw(st.sampled_from(ALGOS))
    root = draw(st.integers(0, n - 1))
    return op, algo, n, count, root


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(), data=st.data())
@example(case=("allreduce", "ring", 9, 5, 0), data=None)
@example(case=("allreduce", "hd", 7, 3, 0), data=None)
@example(case=("reducescatter", "hd", 8, 3, 0), data=None)
@example(case=("allgather", "hd", 6, 2, 0), data=None)
def test_schedule_random_interleaving(case, data):
    """Out of place: each op reaches the exact expected contributions in a random interleaving, with no
    race, no deadlock and no stray message."""
    op, algo, n, count, root = case
    choose = (lambda k: data.draw(st.integers(0, k - 1))) if data is not None else (lambda k: k - 1)
    simulate(op, algo, n, count, root, inplace=False, choose=choose)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(ops=INPLACE_OPS), data=st.data())
def test_schedule_in_place(case, data):
    """In place (allreduce/reduce/broadcast: recv is send; allgather: send is recv's own block;
    reducescatter: recv is send's own block) is as correct as out of place."""
    op, algo, n, count, root = case
    simulate(op, algo, n, count, root, inplace=True, choose=lambda k: data.draw(st.integers(0, k - 1)))


@pytest.mark.parametrize("op", COLLECTIVES)
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", range(1, 10))
def test_schedule_exhaustive_small_counts(op, algo, n):
    """Every (op, algo, n) with counts 0..n+1 and 2n+1 and every root, in three fixed orders (lowest rank
    first, highest rank first, round robin)."""
    orders = [lambda k: 0, lambda k: k - 1]
    rr = {"i": 0}

    def round_robin(k):
        rr["i"] += 1
        return rr["i"] % k
    orders.append(round_robin)
    roots = range(n) if op in ("broadcast", "reduce") else [0]
    for count in list(range(0, n + 2)) + [2 * n + 1]:
        for root in roots:
            for choose in orders:
                simulate(op, algo, n, count, root, choose=choose)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(), inplace=st.booleans(), data=st.data())
def test_schedule_with_push_random_interleaving(case, inplace, data):
    """Where peers' memory is writable (one node) the mesh AllReduce pushes its reduced chunk into every
    rank's receive buffer: as correct, race- and deadlock-free as the pull schedules, in and out of
    place (the other ops ignore ``push``)."""
    op, algo, n, count, root = case
    if inplace and op not in INPLACE_OPS:
        inplace = False
    simulate(op, algo, n, count, root, inplace=inplace, choose=lambda k: data.draw(st.integers(0, k - 1)), push=True)


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("inplace", [False, True])
def test_push_mesh_allreduce_exhaustive_small_counts(n, inplace):
    orders = [lambda k: 0, lambda k: k - 1, lambda k: k // 2]
    for count in list(range(0, n + 2)) + [2 * n + 1]:
        for choose in orders:
            simulate("allreduce", "mesh", n, count, inplace=inplace, choose=choose, push=True)


def test_detector_catches_a_broken_push(monkeypatch):
    """Self-test of the simulator's remote writes: a push of the whole buffer instead of the rank's own
    chunk writes over chunks that their owners are still reducing -- a write-write or write-after-read
    race (or a wrong result) that the detector must report."""
    real = hs._allreduce

    def whole(algo, n, r, count, push=False):
        phases = real(algo, n, r, count, push)
        return [Phase(tuple(Step(s.tag, s.waits, s.pulls, s.signals, tuple(Push(p.peers, p.buf, 0, count)
                                                                             for p in s.pushes))
                            for s in ph.steps)) for ph in phases]
    monkeypatch.setattr(hs, "_allreduce", whole)
    with pytest.raises(Race):
        simulate("allreduce", "mesh", 3, 6, choose=lambda k: 0, push=True)


def test_alltoall_in_place_is_not_a_schedule_hazard_free_case():
    """In-place all-to-all (recv is send) is a hazard for a pull-based one-phase exchange: a peer may
    read my block q after I already overwrote it.  The race detector must see it (documents why the
    runtime tests only out-of-place all-to-all)."""
    with pytest.raises(Race):
        simulate("alltoall", "mesh", 3, 2, inplace=True)


def test_detector_catches_a_broken_schedule(monkeypatch):
    """Self-test of the simulator: a ring without its waits races or computes a wrong result."""
    real = hs._ring_rs

    def no_waits(r, n, ch, buf, prefix):
        return [Step(s.tag, (), s.pulls, s.signals) for s in real(r, n, ch, buf, prefix)]
    monkeypatch.setattr(hs, "_ring_rs", no_waits)
    with pytest.raises((Race, AssertionError)):
        simulate("allreduce", "ring", 4, 8, choose=lambda k: k - 1)


def test_detector_catches_a_deadlock(monkeypatch):
    real = hs._ring_ag

    def bad_tag(r, n, ch, buf, prefix):
        return [Step(s.tag, tuple((p, t + "x") for p, t in s.waits), s.pulls, s.signals)
                for s in real(r, n, ch, buf, prefix)]
    monkeypatch.setattr(hs, "_ring_ag", bad_tag)
    with pytest.raises(Deadlock):
        simulate("allgather", "ring", 3, 2)


def test_schedule_step_counts():
    """Ring is linear in n, halving-doubling logarithmic; mesh AllReduce is one reduction step and one
    copy step per peer (each waits for that peer's reduction only), other mesh ops one step."""
    def steps(op, algo, n, r=0):
        return sum(len(p.steps) for p in schedule(op, algo, n, r, 64))
    assert steps("allreduce", "ring", 8) == 2 * 7
    assert steps("allreduce", "hd", 8) == 2 * 3
    assert steps("allreduce", "mesh", 8) == 1 + 7
    assert len(schedule("allreduce", "mesh", 8, 0, 64)) == 1         # no barrier between the halves
    pushed = schedule("allreduce", "mesh", 8, 3, 64, push=True)        # one node: reduce and push, one step
    assert len(pushed) == 1 and len(pushed[0].steps) == 1 and pushed[0].steps[0].signals == ()
    assert pushed[0].steps[0].pushes == (Push((0, 1, 2, 4, 5, 6, 7), "recv", 24, 8),)
    assert schedule("allreduce", "hd", 8, 3, 64, push=True) == schedule("allreduce", "hd", 8, 3, 64)
    assert steps("alltoall", "mesh", 8) == 1
    assert steps("allgather", "ring", 5) == 4
    assert steps("reducescatter", "hd", 16) == 4
    assert schedule("barrier", "ring", 4, 1, 0) == []
    assert schedule("allreduce", "ring", 1, 0, 10) == []


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError):
        schedule("allreduce", "ring", 4, 4, 8)
    with pytest.raises(ValueError):
        schedule("allreduce", "ring", 4, -1, 8)
    with pytest.raises(ValueError):
        schedule("scatter", "ring", 4, 0, 8)
    with pytest.raises(ValueError):
        schedule("allreduce", "bogus", 4, 0, 8)


# ------------------------------------------------------------------------------------------ chunks
@given(count=st.integers(0, 10_000), n=st.integers(1, 64))
def test_chunks_partition(count, n):
    ch = chunks(count, n)
    assert len(ch) == n
    off = 0
    for o, ln in ch:
        assert o == off and ln >= 0
        off += ln
    assert off == count
    lens = [ln for _, ln in ch]
    assert max(lens) - min(lens) <= 1
    assert lens == sorted(lens, reverse=True)       # the larger chunks come first


def test_chunks_examples():
    assert chunks(10, 3) == [(0, 4), (4, 3), (7, 3)]
    assert chunks(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]
    assert chunks(0, 2) == [(0, 0), (0, 0)]
    assert chunks(5, 1) == [(0, 5)]


# ------------------------------------------------------------------------------------------ choose_algo
@pytest.mark.parametrize("override,want", [("ring", "ring"), ("RING", "ring"), ("H-D_R", "hd"), ("h-d_r", "hd"),
                                           ("hd", "hd"), ("mesh", "mesh"), ("Mesh", "mesh")])
def test_choose_algo_override(override, want):
    assert choose_algo("allreduce", 4, 1 << 30, override) == want
    assert choose_algo("allreduce", 3, 8, override) == want        # allreduce hd folds non-powers of two
    assert choose_algo("allgather", 8, 8, override) == want
    assert choose_algo("reducescatter", 4, 8, override) == want


@pytest.mark.parametrize("bad", ["nhr", "pairwise", "ring2", "level1:ring", "x"])
def test_choose_algo_unknown_override(bad):
    with pytest.raises(ValueError):
        choose_algo("allreduce", 4, 1024, bad)


@pytest.mark.parametrize("op", ["allgather", "reducescatter"])
@pytest.mark.parametrize("n", [3, 5, 6, 7, 9])
def test_choose_algo_hd_falls_back_to_ring_off_powers_of_two(op, n):
    assert choose_algo(op, n, 8, "H-D_R") == "ring"
    assert choose_algo(op, n, 8) == "ring"                   # small message: hd is the default ...
    assert choose_algo(op, 4, 8, "H-D_R") == "hd"        # ... and kept on a power of two


def test_choose_algo_defaults():
    assert choose_algo("allreduce", 4, 1024) == "oneshot"     # small: one round of direct reads
    assert choose_algo("allreduce", 4, 256 << 10) == "hd"     # medium: log steps
    assert choose_algo("allreduce", 4, 1 << 20) == "mesh"     # large: direct reads ...
    assert choose_algo("allreduce", 3, 1 << 20) == "mesh"
    assert choose_algo("allreduce", 16, 1 << 20) == "mesh"
    assert choose_algo("allreduce", 32, 1 << 20) == "hd"      # ... up to 16 ranks; beyond, partner-only steps
    assert choose_algo("allreduce", 24, 1 << 20) == "hd"      # (hd folds the extra ranks)
    assert choose_algo("allreduce", 3, 256 << 10) == "hd"     # hd allreduce folds the extra rank
    assert choose_algo("allgather", 4, 1024, "oneshot") == "hd"   # oneshot is an AllReduce algorithm
    for op in ("broadcast", "reduce", "alltoall", "barrier"):
        for algo in (None, "ring", "H-D_R", "mesh"):
            assert choose_algo(op, 4, 1024, algo) == "mesh"
