"""A torchrun script in torch_npu style (run by tests/cluster/test_torch_distributed_cluster.py with ``python -m
torch.distributed.run --nproc-per-node 4``): backend "hccl", each rank on its own npu.  Every collective is
checked against numpy on data every rank can rebuild (seeded by rank), and a tensor-parallel linear layer
(column-split weight + all_gather; row-split weight + all_reduce) against one CPU ``nn.Linear``.  Each rank
writes what it checked to ``$OUT_DIR/rank<r>.json``; any mismatch fails the rank (torchrun exits non-zero).

The only vnpu-specific line is ``import runtime.torch``."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import runtime.torch  # noqa: F401  -- the one line torch_npu code adds
from runtime.api import get_runtime     # (only to report which virtual NPU each rank drove)

DIM_IN, DIM_OUT, BATCH = 8, 12, 3


def data(rank: int, n: int = 6) -> np.ndarray:
    """Rank ``rank``'s input: small integers as float32 (sums of a few are exact in any order)."""
    return np.random.default_rng(100 + rank).integers(-8, 9, n).astype(np.float32)


def check(name: str, got: torch.Tensor, want: np.ndarray, done: list, rtol: float = 0.0, atol: float = 0.0):
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=rtol, atol=atol, err_msg=name)
    done.append(name)


def collectives(rank: int, n: int, dev: torch.device, done: list) -> None:
    every = np.stack([data(r) for r in range(n)])

    x = torch.from_numpy(data(rank)).to(dev)
    dist.all_reduce(x)
    check("all_reduce_sum", x, every.sum(0), done)
    x = torch.from_numpy(data(rank)).to(dev)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    check("all_reduce_max", x, every.max(0), done)
    x = torch.from_numpy(data(rank)).to(dev)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check("all_reduce_avg", x, every.mean(0), done, rtol=1e-6)

    outs = [torch.empty(6, device=dev) for _ in range(n)]
    dist.all_gather(outs, torch.from_numpy(data(rank)).to(dev))
    check("all_gather", torch.stack(outs), every, done)
    flat = torch.empty(6 * n, device=dev)
    dist.all_gather_into_tensor(flat, torch.from_numpy(data(rank)).to(dev))
    check("all_gather_into_tensor", flat, every.reshape(-1), done)

    big = [np.random.default_rng(200 + r).integers(-8, 9, 2 * n).astype(np.float32) for r in range(n)]
    out = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(out, torch.from_numpy(big[rank]).to(dev))
    check("reduce_scatter_tensor", out, np.sum(big, 0)[2 * rank:2 * rank + 2], done)

    b = torch.from_numpy(data(rank)).to(dev)
    dist.broadcast(b, src=n - 1)
    check("broadcast", b, data(n - 1), done)

    send = torch.arange(n * 2, dtype=torch.float32) + 100 * rank        # chunk j goes to rank j
    recv = torch.empty(n * 2, device=dev)
    dist.all_to_all_single(recv, send.to(dev))
    want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(n)]).astype(np.float32)
    check("all_to_all_single", recv, want, done)

    # a ring of send / recv: even ranks send first, odd ranks receive first (blocking p2p cannot deadlock)
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = torch.empty(6, device=dev)
    mine = torch.from_numpy(data(rank)).to(dev)
    if rank % 2 == 0:
        dist.send(mine, dst=nxt)
        dist.recv(got, src=prv)
    else:
        dist.recv(got, src=prv)
        dist.send(mine, dst=nxt)
    check("send_recv_ring", got, data(prv), done)

    dist.barrier()
    done.append("barrier")

    evens = dist.new_group([r for r in range(n) if r % 2 == 0])      # a subgroup: a communicator of its own
    if rank % 2 == 0:
        x = torch.from_numpy(data(rank)).to(dev)
        dist.all_reduce(x, group=evens)
        check("subgroup_all_reduce", x, every[::2].sum(0), done)
    else:
        done.append("subgroup_all_reduce")


def tensor_parallel_linear(rank: int, n: int, dev: torch.device, done: list) -> None:
    """Column-parallel then row-parallel ``nn.Linear`` shards, each against the whole layer on the CPU."""
    torch.manual_seed(0)                          # every rank builds the same layer and input
    full = torch.nn.Linear(DIM_IN, DIM_OUT)
    x = torch.randn(BATCH, DIM_IN)
    want = full(x).detach()
    w, bias = full.weight.detach(), full.bias.detach()
    rows = DIM_OUT // n                           # column parallel: this rank's output features
    y_part = torch.nn.functional.linear(x.to(dev), w[rank * rows:(rank + 1) * rows].to(dev),
                                        bias[rank * rows:(rank + 1) * rows].to(dev))
    parts = [torch.empty(BATCH, rows, device=dev) for _ in range(n)]
    dist.all_gather(parts, y_part.contiguous())
    y = torch.cat(parts, dim=1)
    tol = 1e-5 * DIM_IN                           # float32 dot products of DIM_IN terms
    check("tp_column_linear", y, want.numpy(), done, rtol=tol, atol=tol)

    cols = DIM_IN // n                            # row parallel: this rank's input features
    partial = x[:, rank * cols:(rank + 1) * cols].to(dev) @ w[:, rank * cols:(rank + 1) * cols].to(dev).t()
    partial = partial.contiguous()
    dist.all_reduce(partial)
    y = partial + bias.to(dev)
    check("tp_row_linear", y, want.numpy(), done, rtol=tol, atol=tol)


def main() -> int:
    dist.init_process_group("hccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local)
    dev = torch.device("npu", local)
    done: list[str] = []
    try:
        collectives(rank, n, dev, done)
        tensor_parallel_linear(rank, n, dev, done)
        objs: list = [None] * n
        physical = get_runtime().device(torch.npu.current_device()).physical_id     # which virtual NPU
        dist.all_gather_object(objs, {"rank": rank, "npu": physical})
        assert [o["rank"] for o in objs] == list(range(n)), objs
        done.append("all_gather_object")
        report = {"rank": rank, "world": n, "backend": dist.get_backend(), "checks": done,
                  "devices": [o["npu"] for o in objs]}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
