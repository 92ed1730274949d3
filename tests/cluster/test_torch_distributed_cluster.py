"""``torch.distributed`` backend "hccl" across OS processes, on one vnpu cluster started for the module the
way a user starts one (``cluster_up``: ``vnpu up``), ranks reaching it with ``VNPU_BACKEND=cluster``:

- a real 4-process ``torchrun`` (``python -m torch.distributed.run``, loopback rendezvous on port 0) runs
  tests/torch_dist_script.py: every collective checked against numpy and a tensor-parallel linear against
  the CPU layer;
- Ray actors as ranks (each holding one ``NPU`` resource, so each sees its own virtual NPU as ``npu:0``);
- a link down and a device killed in the middle of a collective: every surviving rank's collective raises
  ``DistBackendError`` (a RuntimeError) within the exec timeout (short here: ``init_process_group(timeout=)``),
  never hangs; the group is aborted afterwards, and a fresh group over the same store works again.

The kill is the last test: it takes a device from the module's cluster for good."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.cluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "torch_dist_script.py")
#: the exec timeout of the fault tests' groups: a collective whose peer is gone gives up after this long
FAULT_TIMEOUT_S = 15.0
RANKS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A detached 4-device cluster in a state directory of the module's own (``vnpu up`` / ``down``)."""
    from runtime.cluster import ClusterSpec
    from runtime.cluster.local import cluster_down, cluster_up
    home = tmp_path_factory.mktemp("vnpu-home")
    saved = {k: os.environ.get(k) for k in ("VNPU_HOME", "VNPU_TOKEN")}
    os.environ["VNPU_HOME"] = str(home)
    os.environ.pop("VNPU_TOKEN", None)
    try:
        state, _ = cluster_up(ClusterSpec(devices=4, arena_bytes=64 << 20))
        yield state
    finally:
        import ray
        if ray.is_initialized():
            ray.shutdown()
        cluster_down(quiet=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def rank_env(**extra) -> dict:
    return dict(os.environ, VNPU_BACKEND="cluster", PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1",
                OMP_NUM_THREADS="1", **extra)


def test_torchrun_four_ranks_collectives_and_tensor_parallel_linear(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "--max-restarts", "0", SCRIPT]
    p = subprocess.run(cmd, env=rank_env(OUT_DIR=str(out)), cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    want = ["all_reduce_sum", "all_reduce_max", "all_reduce_avg", "all_gather", "all_gather_into_tensor",
            "reduce_scatter_tensor", "broadcast", "all_to_all_single", "send_recv_ring", "barrier",
            "subgroup_all_reduce", "tp_column_linear", "tp_row_linear", "all_gather_object"]
    for r, rep in enumerate(reports):
        assert rep["rank"] == r and rep["world"] == 4 and rep["backend"] == "hccl"
        assert rep["checks"] == want
    assert sorted(reports[0]["devices"]) == [0, 1, 2, 3], "each rank drives its own virtual NPU"


# ------------------------------------------------------------------------------------------ Ray actors
@pytest.fixture(scope="module")
def ranks(cluster):
    """RANKS Ray actors, each holding one NPU of the cluster (its npu:0), each a torch process."""
    from runtime.cluster.discovery import attach_ray
    attach_ray()
    import ray

    class Rank:
        """One rank: a store shared through rank 0's TCPStore, groups made and destroyed on demand."""

        def __init__(self):
            import runtime.torch  # noqa: F401
            self.store = None
            self.work = None

        def physical_id(self) -> int:
            from runtime.api import get_runtime
            return get_runtime().device(0).physical_id

        def host_store(self) -> int:
            import torch.distributed as dist
            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            return self.store.port

        def join_store(self, port: int) -> None:
            import torch.distributed as dist
            self.store = dist.TCPStore("127.0.0.1", port, is_master=False)

        def init(self, name: str, rank: int, world: int, timeout_s: float) -> str:
            import datetime
            import torch.distributed as dist
            dist.init_process_group("hccl", store=dist.PrefixStore(name, self.store), rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout_s))
            return dist.get_backend()

        def collectives(self, rank: int, world: int) -> dict:
            import torch
            import torch.distributed as dist
            x = torch.full((5,), float(rank + 1), device="npu")
            dist.all_reduce(x)
            parts = [torch.empty(3, device="npu", dtype=torch.int64) for _ in range(world)]
            dist.all_gather(parts, (torch.arange(3, dtype=torch.int64) * (rank + 1)).to("npu"))
            big = (torch.arange(2 * world, dtype=torch.float32) * (rank + 1)).to("npu")
            out = torch.empty(2, device="npu")
            dist.reduce_scatter_tensor(out, big)
            objs = [{"from": rank}] if rank == 0 else [None]
            dist.broadcast_object_list(objs, src=0)
            cpu = torch.full((2,), rank + 1, dtype=torch.int32)          # a CPU tensor: staged
            dist.all_reduce(cpu, op=dist.ReduceOp.MAX)
            return {"all_reduce": x.cpu().tolist(), "all_gather": [p.cpu().tolist() for p in parts],
                    "reduce_scatter": out.cpu().tolist(), "object": objs[0], "cpu_max": cpu.tolist()}

        def fault(self, kind: str, **params) -> None:
            from devices.errors import AclError
            from runtime.api import get_runtime
            try:
                get_runtime().device(0).handle.inject_fault(kind, **params)
            except AclError:
                if kind != "kill":                    # a killed device may not answer the call that kills it
                    raise

        def clear(self) -> None:
            from runtime.api import get_runtime
            get_runtime().device(0).handle.clear_fault()

        def start_all_reduce(self) -> None:
            """Enqueue an all_reduce and send it to the device (returns once the device has it)."""
            import torch
            import torch.distributed as dist
            self.work = dist.all_reduce(torch.ones(1000, device="npu"), async_op=True)
            self.work.is_completed()                  # a stream query: the queued work reaches the device

        def finish(self) -> dict:
            """How the started collective ended: its error's type, message and HCCL code, or "ok"."""
            import torch.distributed as dist
            try:
                self.work.wait()
                return {"ok": True}
            except Exception as e:  # noqa: BLE001 - the test inspects what was raised
                return {"type": type(e).__name__, "is_dist_backend_error": isinstance(e, dist.DistBackendError),
                        "is_runtime_error": isinstance(e, RuntimeError), "msg": str(e),
                        "hccl_code": getattr(e, "hccl_code", None)}

        def after_failure(self) -> str:
            """A collective on the aborted group raises at once."""
            import torch
            import torch.distributed as dist
            try:
                dist.all_reduce(torch.ones(1, device="npu"))
            except dist.DistBackendError as e:
                return str(e)
            return "no error"

        def destroy(self) -> None:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()

    actor = ray.remote(num_cpus=0, resources={"NPU": 1})(Rank)
    env = {"runtime_env": {"env_vars": {"VNPU_BACKEND": "cluster"}}}
    actors = [actor.options(**env).remote() for _ in range(RANKS)]
    try:
        port = ray.get(actors[0].host_store.remote(), timeout=300)
        ray.get([a.join_store.remote(port) for a in actors[1:]], timeout=300)
        yield actors
    finally:
        for a in actors:
            ray.kill(a)


def group(actors, name: str, timeout_s: float = 60.0) -> None:
    import ray
    got = ray.get([a.init.remote(name, r, len(actors), timeout_s) for r, a in enumerate(actors)], timeout=300)
    assert got == ["hccl"] * len(actors)


def warm(actors) -> None:
    """One all_reduce on every rank: the group's communicator exists (a later fault hits a collective,
    not the set-up)."""
    import ray
    ray.get([a.start_all_reduce.remote() for a in actors], timeout=120)
    assert ray.get([a.finish.remote() for a in actors], timeout=300) == [{"ok": True}] * len(actors)


def destroy(actors) -> None:
    import ray
    ray.get([a.destroy.remote() for a in actors], timeout=120)


def test_ray_actors_as_ranks(ranks):
    import ray
    phys = ray.get([a.physical_id.remote() for a in ranks], timeout=120)
    assert len(set(phys)) == RANKS, f"every actor rank has a virtual NPU of its own: {phys}"
    group(ranks, "actors")
    try:
        res = ray.get([a.collectives.remote(r, RANKS) for r, a in enumerate(ranks)], timeout=300)
    finally:
        destroy(ranks)
    n = RANKS
    big = sum(np.arange(2 * n, dtype=np.float32) * (r + 1) for r in range(n))
    for r, got in enumerate(res):
        assert got["all_reduce"] == [float(sum(range(1, n + 1)))] * 5
        assert got["all_gather"] == [(np.arange(3) * (q + 1)).tolist() for q in range(n)]
        assert got["reduce_scatter"] == big[2 * r:2 * r + 2].tolist()
        assert got["object"] == {"from": 0}
        assert got["cpu_max"] == [n, n]


def test_link_down_raises_on_both_ranks_and_a_new_group_works(ranks):
    import ray
    from devices.errors import HCCL_E_NETWORK, HCCL_E_REMOTE, HCCL_E_TIMEOUT
    pair = ranks[:2]
    peer = ray.get(pair[1].physical_id.remote(), timeout=60)
    group(pair, "link", FAULT_TIMEOUT_S)
    warm(pair)
    ray.get(pair[0].fault.remote("link-down", peer=peer), timeout=60)
    try:
        ray.get([a.start_all_reduce.remote() for a in pair], timeout=120)
        res = ray.get([a.finish.remote() for a in pair], timeout=300)
        aborted = ray.get([a.after_failure.remote() for a in pair], timeout=120)
    finally:
        ray.get(pair[0].clear.remote(), timeout=60)
        destroy(pair)
    for r, e in enumerate(res):
        assert e.get("is_dist_backend_error") and e["is_runtime_error"], (r, e)
        assert f"on rank {r}" in e["msg"] and "allreduce" in e["msg"], e
        assert e["hccl_code"] in (HCCL_E_NETWORK, HCCL_E_REMOTE, HCCL_E_TIMEOUT), e
    assert res[0]["hccl_code"] == HCCL_E_NETWORK, res[0]          # the rank whose link is down sees it
    assert all("aborted by an earlier failure" in a for a in aborted), aborted
    group(pair, "link-again")                                     # the link is back: a new group works
    try:
        res = ray.get([a.collectives.remote(r, 2) for r, a in enumerate(pair)], timeout=300)
    finally:
        destroy(pair)
    assert [g["all_reduce"] for g in res] == [[3.0] * 5] * 2


def test_killed_device_mid_collective_raises_on_every_survivor(ranks):
    """Ranks 0 and 1 are inside an all_reduce (their devices have it) when rank 2's device is killed
    before it joins: both survivors' wait raises DistBackendError, within the exec timeout."""
    import ray
    from devices.errors import HCCL_E_REMOTE, HCCL_E_TIMEOUT
    group(ranks, "kill", FAULT_TIMEOUT_S)
    survivors, victim = ranks[:2], ranks[2]
    try:
        warm(ranks)
        ray.get([a.start_all_reduce.remote() for a in survivors], timeout=120)
        ray.get(victim.fault.remote("kill"), timeout=60)
        res = ray.get([a.finish.remote() for a in survivors], timeout=300)
    finally:
        destroy(survivors)
    for r, e in enumerate(res):
        assert e.get("is_dist_backend_error") and e["is_runtime_error"], (r, e)
        assert f"on rank {r}" in e["msg"], e
        assert e["hccl_code"] in (HCCL_E_REMOTE, HCCL_E_TIMEOUT), e
