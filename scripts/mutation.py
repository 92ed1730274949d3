"""Mutation score of the critical code (``scripts/mutation.sh``; slow, never part of CI).

For each target below, mutmut (a dev extra) mutates the named functions of the named modules -- one small
change at a time: an operator, a comparison, a constant, a condition, a removed call -- and runs the
target's tests against each mutant.  A mutant is *killed* when a test fails (or it hangs past mutmut's
CPU limit: *timeout*), *survives* when every test passes.  The kill rate of a target is
``(killed + timeout) / (mutants - equivalent)``; :data:`EQUIVALENT` lists the surviving mutants that no
test can kill because they do not change behaviour, each with the reason.

How it runs: a copy of the working tree (tracked and untracked files, plus the generated protobuf code)
goes to a scratch directory per target, with a ``[tool.mutmut]`` section naming the modules and the
tests; ``mutmut run`` mutates there (the worktree is never touched), one target at a time, with
``--max-children`` workers (``MUTATION_JOBS``, default 1: the machine stays usable).  mutmut runs the
tests in forked copies of one pytest process, so a mutant reaches only code that runs in that process:
the targets' tests are in-process ones (local devices, devices served over loopback gRPC by this
process) -- mutants never reach Ray actors or subprocesses, and ``-m "not cluster"`` leaves those out.

Usage: ``scripts/mutation.sh [target ...]`` (default: every target); ``--json FILE`` also writes the
numbers; ``--keep`` keeps the scratch directories (``mutmut results`` / ``mutmut show NAME`` there);
``--cap-s N`` stops each target's run after N seconds and scores the mutants checked by then (mutmut
records each verdict as it comes; the rest are reported as ``not_run`` -- a partial score, said so);
``--resume DIR`` (one target) takes a scratch directory kept by ``--keep``, refreshes its copy of the
working tree (new tests) and runs only the mutants that survived there or were not run, then scores the
whole directory (the mutants killed before keep their verdict: the mutated code has not changed).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
M = "\u01c1"           # mutmut's separator in mutant names of methods: module.xǁClassǁmethod__mutmut_N


def fn(module: str, name: str) -> str:
    """Mutant-name glob of a module-level function."""
    return f"{module}.x_{name}__mutmut_*"


def cls(module: str, name: str, method: str = "*") -> str:
    """Mutant-name glob of a class's methods (all, or one)."""
    return f"{module}.x{M}{name}{M}{method}__mutmut_*" if method != "*" else f"{module}.x{M}{name}{M}*"


@dataclass(frozen=True)
class Target:
    """Modules to mutate, the functions of theirs that are mutated (mutant-name globs), the tests."""
    files: tuple[str, ...]
    functions: tuple[str, ...]
    tests: tuple[str, ...]
    doc: str


A, H, J, L, G, D, R, RG, F = ("devices.arena", "devices.hccl", "runtime.cluster.jobrunner", "driver.lease",
                              "devices.graph", "devices.device", "runtime.api", "runtime.graph", "devices.faults")
T, C = "runtime.serve.tenants", "driver.credentials"

TARGETS: dict[str, Target] = {
    "arena": Target(
        ("devices/arena.py",),
        (fn(A, "make_ptr"), fn(A, "is_device_ptr"), fn(A, "ptr_offset"), fn(A, "ptr_device"), fn(A, "block_size"),
         cls(A, "Allocator"), cls(A, "HbmArena"), fn(A, "header_gen"), fn(A, "attach")),
        ("tests/devices/test_arena.py", "tests/core/test_bad_input.py", "tests/devices/test_device_model.py",
         # the poisoned-range check and the tenants' quotas live in resolve / malloc too
         "tests/devices/test_faults.py::test_ecc_fails_access_of_the_poisoned_range_only", "tests/security/test_quotas.py"),
        "the arena's checks and rounding: pointers, block sizes, the allocator, bounds/owner/ECC checks"),
    "hccl": Target(
        ("devices/hccl.py",),
        (fn(H, "itemsize"), fn(H, "_bf16_to_f32"), fn(H, "_f32_to_bf16"), fn(H, "validate_redop"),
         cls(H, "HcclEngine", "check"), cls(H, "HcclEngine", "buffer_counts"), cls(H, "HcclEngine", "_collective"),
         cls(H, "HcclEngine", "_plan"), cls(H, "HcclEngine", "_buffers"), cls(H, "HcclEngine", "_ready"),
         cls(H, "HcclEngine", "_phases"), cls(H, "HcclEngine", "_pulls"), cls(H, "HcclEngine", "_read_into"),
         cls(H, "HcclEngine", "_move")),
        ("tests/core/test_hccl_numerics.py", "tests/core/test_hccl.py::test_collectives_dtypes_and_redops",
         "tests/core/test_hccl.py::test_collectives_float32", "tests/core/test_hccl.py::test_zero_count_collectives",
         "tests/core/test_hccl.py::test_large_buffers_in_segments", "tests/core/test_hccl.py::test_all_reduce_random_floats",
         "tests/core/test_hccl.py::test_c_api_parameter_errors", "tests/core/test_hccl.py::test_mismatched_operators_fail_every_rank",
         "tests/core/test_hccl.py::test_send_recv_size_mismatch"),
        "HCCL reductions and dtype conversions: the collective executor, pulls, reduce/copy, bfloat16 rounding"),
    "jobrunner": Target(
        ("runtime/cluster/jobrunner.py",),
        (cls(J, "JobRunner"), cls(J, "History")),
        ("tests/cluster/test_history.py", "tests/cluster/test_jobrunner.py"),
        "the job runner's delivery: queueing, replay after failures, exactly-once delivery, the history"),
    "lease": Target(
        ("driver/lease.py",),
        (cls(L, "Leases"),),
        ("tests/driver/test_lease.py", "tests/driver/test_rpc.py::test_a_renewed_lease_cancels_the_release",
         "tests/driver/test_rpc.py::test_two_overlapping_lease_watches_closing_one_releases_nothing",
         "tests/driver/test_rpc.py::test_a_client_that_dies_is_released_after_its_lease"),
        "client leases: counting watches, arming, expiry, release"),
    "revalidation": Target(
        ("devices/graph.py", "devices/device.py", "runtime/api.py", "runtime/graph.py"),
        (cls(G, "TaskGraph"), cls(G, "GraphTable"), cls(D, "Device", "_launch_task"), cls(D, "Device", "_plan"),
         cls(D, "LaunchPlan"), fn(D, "_plan_key"), cls(R, "AllocTable"), cls(R, "Stream", "launch"),
         cls(R, "Device", "check_range"), cls(R, "Device", "alloc_gen"), cls(R, "Device", "free"),
         cls(R, "Device", "malloc"), cls(RG, "Graph", "execute_async"), cls(RG, "Graph", "__init__"),
         cls(RG, "Graph", "_ranges"), cls(RG, "Graph", "_stale")),
        ("tests/core/test_graph.py", "tests/core/test_streams.py", "tests/core/test_bad_input.py", "tests/core/test_host_checks.py"),
        "graph / launch-plan revalidation (device) and the runtime's check cache and graph replay check (host)"),
    "faults": Target(
        ("devices/faults.py",),
        (cls(F, "Param"), cls(F, "FaultKind"), fn(F, "_check_ecc"), fn(F, "_check_peer"), fn(F, "fault_kind"),
         cls(F, "FaultState")),
        ("tests/devices/test_faults.py", "tests/devices/test_device_model.py"),
        "the fault state: the kind table's parameter checks, apply/clear/expiry, the readers"),
    "tenants": Target(
        ("runtime/serve/tenants.py",),
        (cls(T, "Quotas"), cls(T, "Ticket"), cls(T, "RateLimited"), fn(T, "retry_headers"), cls(T, "Quota"),
         cls(T, "Tenant"), cls(T, "TenantRegistry"), fn(T, "key_digest"), fn(T, "parse_key"), fn(T, "is_loopback"),
         fn(T, "check_bind")),
        ("tests/serve/test_tenant_quotas.py",),
        "HTTP tenants: per-minute token and concurrency quotas to the token, Retry-After, keys, the registry"),
    "credentials": Target(
        ("driver/credentials.py",),
        (fn(C, "check_tenant"), fn(C, "_key"), fn(C, "_mac"), fn(C, "mint"), fn(C, "is_credential"),
         fn(C, "claims_of"), fn(C, "verify"), cls(C, "Revocations"), cls(C, "Verifier")),
        ("tests/driver/test_credentials.py",),
        "tenant credentials: minting, verification and expiry, revocation, the device's verifier and its cache"),
}

#: surviving mutants that cannot be killed because they behave exactly like the original:
#: (target, function glob, a fragment of the mutated line) -> why
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("lease", f"*{M}Leases{M}__init__*", "self._closed = None"):
        "None and False are both false: every use of _closed is a truth test",
    ("lease", f"*{M}Leases{M}closed*", "self._open.get(owner, 1) - 1"):
        "for an owner with no open watch both give n <= 0 (0 or -1): the release is armed either way",
    ("lease", f"*{M}Leases{M}closed*", "self._armed.get(None), t"):
        "the replaced timer is not cancelled, but when it fires _expire finds another timer armed and returns: "
        "only a timer thread lives on until its grace period ends",
    ("arena", "*x_attach__*", "count=3, offset=size"):
        "the header is ARENA_HEADER (4096) bytes: reading 3 words of it still gives hdr[1], the device id",
    ("arena", "*x_attach__*", "dtype=np.uint64, offset=size)"):
        "without count numpy reads the whole 4096-byte header (a multiple of 8): hdr[1] is the same word",
    ("arena", f"*{M}HbmArena{M}allocation_of*", "self.resolve(ptr, 1)"):
        "resolve refuses a pointer at or past its allocation's end before the length matters, so 1 byte is "
        "always left, and the ECC check reads max(nbytes, 1): 0 and 1 check the same",
    ("arena", f"*{M}HbmArena{M}reset*", "self.epoch += 2"):
        "epochs stay distinct and increasing, which is all that cached plans and views compare",
    ("arena", f"*{M}HbmArena{M}typed_view*", "if (shape) or True else"):
        "np.prod(()) is 1.0 and int() of it is 1: an empty shape counts one element either way",
    ("arena", f"*{M}HbmArena{M}typed_view*", "np.prod(shape, dtype=None)"):
        "np.prod of Python ints accumulates in int64 by default on 64-bit Linux: the same dtype",
    ("arena", f"*{M}HbmArena{M}typed_view*", "np.prod(shape, ))"):
        "np.prod of Python ints accumulates in int64 by default on 64-bit Linux: the same dtype",
    ("arena", f"*{M}HbmArena{M}_bump*", "self.gen += 2"):
        "generations are only compared for equality with a cached one (plans, views, same-node clients' "
        "range checks): steps of 2 keep them distinct and increasing",
    ("arena", f"*{M}HbmArena{M}free*", "self._freed.popitem(last=None)"):
        "popitem takes the truth value of last: None pops the oldest entry like False",
    ("arena", f"*{M}HbmArena{M}_forget_freed*", "bisect.bisect_left(fs, off + nbytes, )"):
        "lo=i is only a search hint: off + nbytes > off, so the insertion point is at or after i either way",
    ("arena", f"*{M}Allocator{M}_take*", "i += 2"):
        "a free remainder above the block exists only when the range ends off the 64 B grid, i.e. the "
        "arena's last range (blocks start and end on the grid): no free range follows it, so inserting one "
        "index further still appends it",
    ("arena", f"*{M}HbmArena{M}__init__*", "self._hdr = np.frombuffer(self._mm, dtype=np.uint64, offset=size)"):
        "without count the header view is all 512 words of the 4096-byte header: words 0 and 1 are the same",
    ("arena", f"*{M}HbmArena{M}__init__*", "os.O_CREAT | os.O_EXCL | os.O_RDWR, )"):
        "the fchmod(fd, 0o600) that follows sets the mode whatever the creation mode and umask (tested)",
    ("arena", f"*{M}HbmArena{M}__init__*", "os.O_CREAT | os.O_EXCL | os.O_RDWR, 385)"):
        "the fchmod(fd, 0o600) that follows sets the mode whatever the creation mode and umask (tested)",
    ("arena", f"*{M}HbmArena{M}__init__*", "dtype=np.uint64, count=3, offset=size)"):
        "the header is 4096 bytes: a 3-word view of it still has words 0 and 1 where they were",
    ("arena", f"*{M}HbmArena{M}__init__*", "self._closed = None"):
        "None and False are both false: every use of _closed is a truth test",
    ("arena", f"*{M}HbmArena{M}__init__*", "self.epoch = 1"):
        "an epoch is only compared for equality with one a caller read from the same arena earlier",
    ("arena", f"*{M}Allocator{M}__init__*", "{0: total} if (total) or True else {}"):
        "an empty allocator's {0: 0} entry has no start listed: nothing iterates it, and largest_free is 0 "
        "either way",
    ("arena", f"*{M}HbmArena{M}close*", "segments.untrack(None)"):
        "close has unlinked the segment already; the exit hook skips names that are gone (names carry a "
        "random token: never reused)",
    ("arena", f"*{M}HbmArena{M}resolve*", "write: bool = True"):
        "resolve does not read `write` (kept for the access API's signature)",
    ("arena", f"*{M}HbmArena{M}view*", "write: bool = True"):
        "view only passes `write` on to resolve, which does not read it",
    ("arena", f"*{M}HbmArena{M}view*", "self.resolve(ptr, nbytes, owner, None)"):
        "view only passes `write` on to resolve, which does not read it",
    ("arena", f"*{M}HbmArena{M}view*", "self.resolve(ptr, nbytes, owner, )"):
        "view only passes `write` on to resolve, which does not read it",
    ("revalidation", f"*{M}TaskGraph{M}_bind*", "gen = None"):
        "the graph then validates and binds again on every replay (None never equals the arena's "
        "generation): the same checks and results, only more host work per replay",
    ("revalidation", f"runtime.graph.*{M}Graph{M}__init__*", "self._destroyed = None"):
        "None and False are both false: every use of _destroyed is a truth test",
    ("revalidation", f"runtime.graph.*{M}Graph{M}__init__*", "self._checked_gen = None"):
        "the initial value only has to differ from every generation (>= 0): None does",
    ("revalidation", f"runtime.graph.*{M}Graph{M}__init__*", "self._checked_gen = -2"):
        "the initial value only has to differ from every generation (>= 0): -2 does",
    ("revalidation", f"runtime.graph.*{M}Graph{M}_stale*", "self._checked_gen = None"):
        "the host check then runs on every replay instead of once per generation: the same verdicts",
    ("revalidation", f"runtime.graph.*{M}Graph{M}_ranges*", "yield p, 1"):
        "a collective's buffer pointer is its buffer's start: 0 or 1 byte from there are both inside a live "
        "allocation (every allocation has >= 1 B) or both in freed memory; the device checks the extents",
    ("revalidation", f"runtime.graph.*{M}Graph{M}execute_async*", 'err.detail}", code=None)'):
        "every error the host range check raises is a MemoryAccessError, whose default code (107000) is "
        "the code it carries",
    ("revalidation", f"runtime.graph.*{M}Graph{M}execute_async*", 'err.detail}", )'):
        "every error the host range check raises is a MemoryAccessError, whose default code (107000) is "
        "the code it carries",
    ("revalidation", f"*{M}Device{M}_plan__*", "gen = None"):
        "a plan stamped None never matches the arena's generation: every launch is planned again (the "
        "same checks and results, more host work)",
    ("revalidation", f"*{M}Device{M}_plan__*", "self.cost.kernel(work, block_dim), owner, None)"):
        "a plan stamped None never matches the arena's generation: every launch is planned again (the "
        "same checks and results, more host work)",
    ("revalidation", f"*{M}Device{M}_plan__*", "dict(op.attrs) if (op.attrs) or True else {}"):
        "Launch.attrs is a dict (default {}): dict({}) is {} too",
    ("revalidation", f"*{M}LaunchPlan{M}runner*", "cached = None"):
        "the views are then bound again on every run, each time checked against the arena: the same "
        "verdicts and results, more host work",
    ("revalidation", f"*{M}LaunchPlan{M}runner*", "cached[1] == arena.gen"):
        "a KernelRunner never equals an int: the views are bound again on every run (same verdicts and "
        "results, more host work)",
    ("revalidation", f"*{M}LaunchPlan{M}runner*", "a.flags.writeable = None"):
        "numpy takes the truth value: None makes the view read-only like False",
    ("revalidation", f"*{M}Device{M}_launch_task*", "len(self._plans) > 4096"):
        "the bound of the plan cache (memory only): a cleared or larger cache plans again or hits, with "
        "the same checks and results",
    ("revalidation", f"*{M}Device{M}_launch_task*", "len(self._plans) >= 4097"):
        "the bound of the plan cache (memory only): a cleared or larger cache plans again or hits, with "
        "the same checks and results",
    ("revalidation", f"*{M}Device{M}_launch_task*", "if key is None:"):
        "the plan cache then misses (or is never consulted) and the launch is planned again: the same "
        "checks and results, more host work",
    ("revalidation", f"*{M}Device{M}_launch_task*", "self._plans.get(key) if key is None else None"):
        "the plan cache then misses (or is never consulted) and the launch is planned again: the same "
        "checks and results, more host work",
    ("revalidation", f"*{M}Device{M}_launch_task*", "self._plans.get(None)"):
        "the plan cache then misses (or is never consulted) and the launch is planned again: the same "
        "checks and results, more host work",
    ("revalidation", f"*{M}Device{M}_plan__*", "block_dim or 2)"):
        "check_launch only checks that block_dim is in [1, 65535]: 1 and 2 both are",
    ("revalidation", f"*{M}Stream{M}launch*", "block_dim or 2)"):
        "check_launch only checks that block_dim is in [1, 65535]: 1 and 2 both are",
    ("revalidation", f"*{M}LaunchPlan{M}runner*", "gen = None"):
        "views stamped None never match the arena's generation: they are bound again on every run (same "
        "verdicts and results, more host work)",
    ("revalidation", f"*{M}AllocTable{M}add*", "bisect_right(fs, ptr) - 2)"):
        "freed ranges are disjoint (an allocation forgets those it overlaps, and later frees come from "
        "allocations disjoint from it): the range before the one at or below ptr ends before it, and the "
        "overlap test skips it",
    ("revalidation", f"*{M}Stream{M}launch*", "key = None"):
        "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "tuple(sorted(attrs.items())) if (attrs) or True else ()"):
        "attrs is a dict here: sorted items of an empty one are () as well",
    ("revalidation", f"*{M}Stream{M}launch*", "tuple(None) if attrs else ()"):
        "the TypeError is caught as for unhashable attrs: no caching, " + "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "tuple(sorted(None)) if attrs else ()"):
        "the TypeError is caught as for unhashable attrs: no caching, " + "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "hit[1] != dev.allocs.gen"):
        "a KernelDef never equals an int: " + "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "or hit[1] is k:"):
        "only a user kernel can change under its name (built-ins are immutable), and check_launch checks "
        "nothing kernel-specific for user kernels; the ranges are keyed on the generation: a changed kernel "
        "would pass the same checks, an unchanged one is " + "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "if key is None:"):
        "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "len(dev.checked) >= 8192"):
        "the bound of the check cache (memory only): " + "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "len(dev.checked) > 8193"):
        "the bound of the check cache (memory only): " + "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("revalidation", f"*{M}Stream{M}launch*", "dev.checked[key] = None"):
        "an entry of None reads as a miss: " + "the host check cache then misses (or is bypassed) and the launch is checked again: the same "
        "verdicts, more host work",
    ("faults", f"*{M}FaultState{M}_publish*", 'if t is not None else 1'):
        "_task_fail is only the lock-free fast path of take_task_failure, which then looks the fault up "
        "under the lock: with no task-fail fault active it returns False either way",
    ("faults", f"*{M}FaultState{M}apply*", "p.pop(DURATION.name, None)"):
        "the duration is only tested for truth (`if duration`): None and 0.0 both mean no deadline",
    ("credentials", "*x__mac__*", 'rstrip(b"XX=XX")'):
        "a 32-byte digest is 43 base64 characters whose last carries 4 bits and 2 zero bits: it is one of "
        "AEIMQUYcgkosw048, never X -- only the padding is stripped either way",
    ("credentials", f"*{M}Revocations{M}refuses*", "self.tenants.get(claims.tenant, -2)"):
        "a credential's issued_ms is a wall-clock time in ms (>= 0): it is below neither -1 nor -2",
    ("credentials", f"*{M}Revocations{M}revoke_tokens*", "check=None"):
        "None and False are both false: verify only tests `check` for truth",
    ("credentials", f"*{M}Verifier{M}principal*", "len(raw) >= 600"):
        "the 600-byte cap only bounds the work before verify, which refuses every token over 512 characters "
        "(a header over 519 bytes): a header of 600 or 601 bytes gets None either way",
    ("credentials", f"*{M}Verifier{M}principal*", "len(raw) > 601"):
        "the 600-byte cap only bounds the work before verify, which refuses every token over 512 characters "
        "(a header over 519 bytes): a header of 600 or 601 bytes gets None either way",
    ("tenants", "*x_parse_key__*", '"XX0123456789abcdefXX"'):
        "the digest is lower-cased before the check: an upper-case X never reaches it",
    ("tenants", f"*{M}Quotas{M}_scaled*", "self.admission > 1.0"):
        "at factor 1.0 the scaled quota is max(1, ceil(v * 1.0)) == v for every quota (positive integers): "
        "the same Quota",
    ("tenants", f"*{M}Quotas{M}_scaled*", "self.admission >= 2.0"):
        "set_admission keeps the factor in (0, 1], and at 1.0 the scaled quota is max(1, ceil(v * 1.0)) == v "
        "for every quota (positive integers): the same Quota",
    ("jobrunner", f"*{M}JobRunner{M}wait*", "left < 0"):
        "left is a difference of monotonic clock readings taken at different times: exactly 0.0 only by "
        "accident, and then the next loop (a wait of 0 s) returns False anyway",
    ("jobrunner", f"*{M}JobRunner{M}wait*", "min(left, 1.1)"):
        "the wait never exceeds the time left (min), and every outcome notifies the condition: the period "
        "of the re-check changes nothing observable",
    ("jobrunner", f"*{M}JobRunner{M}_requeue*", 'getattr(e, "code"'):
        "the default is used only when e is None, i.e. no binding (attempt None), where the code is not "
        "logged; a failed attempt always carries an AclError with its code",
    ("jobrunner", f"*{M}JobRunner{M}_finish_error_locked*", "self._delivered and req.id in self.errors"):
        "a request is in the queue at most once and leaves it delivered or failed: the guard against a "
        "second outcome is never reached by JobRunner itself",
}

#: mutmut's exit-code verdicts (mutmut.stats.status_by_exit_code, 3.8)
KILLED, SURVIVED, TIMEOUT = "killed", "survived", "timeout"
NOT_RUN = "not run"     #: a run stopped by --cap-s before it reached the mutant


def _verdict(code) -> str:
    from mutmut.stats import status_by_exit_code
    return status_by_exit_code[code]


def copy_tree(dst: Path) -> None:
    """The working tree (tracked and untracked files that git does not ignore) + the generated code."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    shutil.copytree(ROOT / "driver" / "_gen", dst / "driver" / "_gen", dirs_exist_ok=True)


def configure(dst: Path, t: Target) -> None:
    tests = ", ".join(json.dumps(x) for x in t.tests)
    srcs = ", ".join(json.dumps(x) for x in t.files)
    with open(dst / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write(f"""
[tool.mutmut]
source_paths = [{srcs}]
also_copy = ["devices", "driver", "runtime", "proto"]
pytest_add_cli_args_test_selection = [{tests}]
pytest_add_cli_args = ["-m", "not cluster"]
timeout_multiplier = 5.0
use_git_change_detection = false
""")


def results(work: Path, t: Target) -> dict:
    """Verdict of every mutant of the target's functions, from mutmut's .meta files (None: not run)."""
    out: dict[str, str] = {}
    for f in t.files:
        meta = work / "mutants" / (f + ".meta")
        if not meta.exists():
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in codes.items():
            if any(fnmatch.fnmatch(name, g) for g in t.functions):
                out[name] = _verdict(code) if code is not None else NOT_RUN
    return out


def show(work: Path, name: str, env: dict) -> str:
    p = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work, capture_output=True, text=True,
                       env=env, timeout=120)
    return p.stdout


def equivalent_reason(target: str, name: str, diff: str) -> str | None:
    added = [ln[1:].strip() for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    for (tg, glob, fragment), why in EQUIVALENT.items():
        if tg == target and fnmatch.fnmatch(name, glob) and any(fragment in ln for ln in added):
            return why
    return None


def _mutmut(work: Path, env: dict, args: list[str], log: Path, cap_s: float | None) -> tuple[int, bool]:
    """Run mutmut in its own process group (its forked test runners included); stop it all after cap_s."""
    with open(log, "w") as lf:
        p = subprocess.Popen([sys.executable, "-m", "mutmut", *args], cwd=work, env=env, stdout=lf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return p.wait(timeout=cap_s), False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            return p.returncode, True
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def run_target(name: str, t: Target, jobs: int, keep: bool, cap_s: float | None = None,
               resume: Path | None = None) -> dict:
    work = resume or Path(tempfile.mkdtemp(prefix=f"vnpu-mutation-{name}-"))
    keep = keep or resume is not None
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               VNPU_HOME=str(work / ".vnpu-home"), PYTHONDONTWRITEBYTECODE="1")
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    try:
        copy_tree(work)
        configure(work, t)
        log = work / "mutmut.log"
        names = list(t.functions)
        if resume is not None:       # only what survived or was not run (a killed mutant stays killed)
            names = sorted(m for m, v in results(work, t).items() if v in (SURVIVED, NOT_RUN))
        rc, capped = (_mutmut(work, env, ["run", "--max-children", str(jobs), *names], log, cap_s) if names
                      else (0, False))
        verdicts = results(work, t)
        not_run = sum(1 for v in verdicts.values() if v == NOT_RUN)
        verdicts = {k: v for k, v in verdicts.items() if v != NOT_RUN}
        if (rc != 0 and not capped) or not verdicts:
            tail = log.read_text(errors="replace")[-3000:]
            return {"target": name, "error": f"mutmut exited {rc}" + (" (capped)" if capped else ""),
                    "log_tail": tail}
        survivors: list[dict] = []
        equivalent: list[dict] = []
        for m, v in sorted(verdicts.items()):
            if v not in (KILLED, TIMEOUT):
                diff = show(work, m, env)
                why = equivalent_reason(name, m, diff) if v == SURVIVED else None
                (equivalent if why else survivors).append({"mutant": m, "verdict": v, "diff": diff.strip(),
                                                          **({"equivalent": why} if why else {})})
        counts = {v: sum(1 for x in verdicts.values() if x == v) for v in set(verdicts.values())}
        total = len(verdicts)
        killed = counts.get(KILLED, 0) + counts.get(TIMEOUT, 0)
        denom = total - len(equivalent)
        return {"target": name, "files": list(t.files), "mutants": total, "killed": counts.get(KILLED, 0),
                "timeout": counts.get(TIMEOUT, 0), "survived": len(survivors), "equivalent": len(equivalent),
                "other": {k: v for k, v in counts.items() if k not in (KILLED, TIMEOUT, SURVIVED)},
                "kill_rate": killed / denom if denom else 0.0, "seconds": round(time.monotonic() - t0),
                "not_run": not_run, "capped": capped,
                "survivors": survivors, "equivalents": equivalent, "scratch": str(work) if keep else None}
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/mutation.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"targets (default: all): {', '.join(TARGETS)}")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "1")))
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directories")
    ap.add_argument("--goal", type=float, default=0.90)
    ap.add_argument("--cap-s", type=float, default=None,
                    help="stop each target after this many seconds; score the mutants checked by then")
    ap.add_argument("--resume", metavar="DIR", type=Path, default=None,
                    help="(one target) a scratch directory kept by --keep: re-run its survivors and the "
                         "mutants not run, against the current tests")
    a = ap.parse_args(argv)
    if a.resume is not None and (len(a.targets) != 1 or not (a.resume / "mutants").is_dir()):
        print("mutation: error: --resume takes one target and a directory kept by --keep", file=sys.stderr)
        return 2
    bad = [x for x in a.targets if x not in TARGETS]
    if bad:
        print(f"mutation: error: unknown target {', '.join(bad)} (known: {', '.join(TARGETS)})", file=sys.stderr)
        return 2
    report = []
    for name in a.targets or list(TARGETS):
        t = TARGETS[name]
        print(f"== {name}: {t.doc}", flush=True)
        r = run_target(name, t, a.jobs, a.keep, a.cap_s, a.resume)
        report.append(r)
        if "error" in r:
            print(f"   FAILED: {r['error']}\n{r['log_tail']}", flush=True)
            continue
        for s in r["survivors"]:
            print(f"   survived ({s['verdict']}): {s['mutant']}\n" + "\n".join("      " + ln for ln in
                                                                            s["diff"].splitlines()[2:]), flush=True)
        for s in r["equivalents"]:
            print(f"   equivalent: {s['mutant']}: {s['equivalent']}", flush=True)
        print(f"   {name}: {r['mutants']} mutants, {r['killed']} killed, {r['timeout']} timeout, {r['survived']} "
              f"survived, {r['equivalent']} equivalent{', other ' + str(r['other']) if r['other'] else ''}: "
              f"kill rate {100 * r['kill_rate']:.1f} % ({r['seconds']} s"
              + (f"; stopped at the cap, {r['not_run']} mutants not run" if r["capped"] else "") + ")", flush=True)
    print("\n" + f"{'target':<14} {'mutants':>8} {'killed':>7} {'timeout':>8} {'survived':>9} {'equiv':>6} {'rate':>7}"
          f" {'not run':>8}")
    ok = True
    for r in report:
        if "error" in r:
            print(f"{r['target']:<14} error: {r['error']}")
            ok = False
            continue
        ok = ok and r["kill_rate"] >= a.goal and not r["capped"]
        print(f"{r['target']:<14} {r['mutants']:>8} {r['killed']:>7} {r['timeout']:>8} {r['survived']:>9} "
              f"{r['equivalent']:>6} {100 * r['kill_rate']:>6.1f}% {r['not_run']:>8}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
