"""HCCL-style collectives on device buffers: communicators and operators enqueued on streams.

Creating a communicator (reference 3.2):
- :func:`comm_init_all` — one process drives N devices (``HcclCommInitAll``);
- :func:`comm_init_cluster_info` — from a rank-table JSON (``HcclCommInitClusterInfo``);
- :func:`get_root_info` on rank 0 + :func:`comm_init_root_info` on every rank (``HcclCommInitRootInfo``):
  a rendezvous through the root device, so ranks may live in different processes.

Operators (``Communicator.all_reduce`` ...) are *enqueued* on a stream of the rank's device like any
task and only order the device; the data moves device to device (``devices.hccl``), never through this
process.  Every rank must issue the same operators in the same order (one host thread may drive all
ranks: issuing never blocks).  Errors of a running operator reach the host at the stream's next
synchronize as :class:`devices.errors.HcclError` (``e.hccl_code`` is the HcclResult).

The C-style functions at the bottom (``HcclAllReduce(send, recv, count, dtype, op, comm, stream)``...)
return HcclResult codes as the C API does.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from devices.errors import (HCCL_E_INTERNAL, HCCL_E_NOT_SUPPORT, HCCL_E_PARA, HCCL_SUCCESS, AclError, HcclError,
                            InvalidParamError)
from devices.hccl import (HCCL_DTYPE_IDS, HCCL_DTYPES, REDOPS, CollectiveOp, CommConfig, HcclEngine, itemsize,
                          validate_redop)
from devices.tasks import Collective

from .api import Device, Stream, Tensor, get_runtime

# enum values (hccl_types.h)
HCCL_DATA_TYPE_INT8, HCCL_DATA_TYPE_INT16, HCCL_DATA_TYPE_INT32, HCCL_DATA_TYPE_FP16 = 0, 1, 2, 3
HCCL_DATA_TYPE_FP32, HCCL_DATA_TYPE_INT64, HCCL_DATA_TYPE_UINT64, HCCL_DATA_TYPE_UINT8 = 4, 5, 6, 7
HCCL_DATA_TYPE_UINT16, HCCL_DATA_TYPE_UINT32, HCCL_DATA_TYPE_FP64, HCCL_DATA_TYPE_BFP16 = 8, 9, 10, 11
HCCL_REDUCE_SUM, HCCL_REDUCE_PROD, HCCL_REDUCE_MAX, HCCL_REDUCE_MIN = 0, 1, 2, 3
HCCL_ROOT_INFO_BYTES = 4108
_OPERATORS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "send", "recv", "barrier")


def _dtype_name(dtype) -> str:
    if isinstance(dtype, (int, np.integer)):
        if int(dtype) not in HCCL_DTYPES:
            raise HcclError(f"unknown HcclDataType {dtype}", HCCL_E_PARA)
        return HCCL_DTYPES[int(dtype)]
    name = str(dtype)
    if name not in HCCL_DTYPE_IDS:
        raise HcclError(f"unsupported data type {name!r}", HCCL_E_NOT_SUPPORT)
    return name


@dataclass(frozen=True)
class CommOptions:
    """``HcclCommConfig``-like options: exec timeout (s) and an algorithm override."""
    exec_timeout_s: float | None = None
    algo: str | None = None

    def device_config(self) -> dict:
        d = asdict(CommConfig())
        if self.exec_timeout_s is not None:
            d["exec_timeout_s"] = float(self.exec_timeout_s)
        if self.algo:
            d["algo"] = self.algo
        return d


class Communicator:
    """One rank of a communicator, bound to one device."""

    def __init__(self, device: Device, comm_id: str, rank: int, size: int, peers: list[dict]):
        self.device = device
        self.comm_id = comm_id
        self.rank = rank
        self.size = size
        self.peers = peers
        self._destroyed = False

    def __repr__(self) -> str:
        return f"<HcclComm rank {self.rank}/{self.size} on device {self.device.index}>"

    # ---- the one enqueue path ----
    def collective(self, op: str, send: int, recv: int, count: int, dtype="float32", redop="sum", root: int = 0,
                   peer: int = -1, stream: Stream | None = None) -> None:
        """Enqueue operator ``op`` of this rank (only orders the device)."""
        if self._destroyed:
            raise HcclError("communicator was destroyed", HCCL_E_PARA)
        s = stream or self.device.default_stream
        if s.device is not self.device:
            raise HcclError(f"stream of device {s.device.index} used with rank {self.rank} on device "
                            f"{self.device.index}", HCCL_E_PARA)
        if not isinstance(count, (int, np.integer)) or count < 0:
            raise HcclError(f"bad count {count!r}", HCCL_E_PARA)
        # checked here too (not only by the device at submit) so that a bad call fails at the call even
        # when the launch queue batches submissions (remote backends)
        if op in ("broadcast", "reduce") and not 0 <= int(root) < self.size:
            raise HcclError(f"root {root} outside [0, {self.size})", HCCL_E_PARA)
        if op in ("send", "recv") and not (0 <= int(peer) < self.size and int(peer) != self.rank):
            raise HcclError(f"peer {peer} invalid for rank {self.rank} of {self.size}", HCCL_E_PARA)
        dt = _dtype_name(dtype)
        if op not in _OPERATORS:
            raise HcclError(f"unknown operator {op!r}", HCCL_E_PARA)
        isz = itemsize(dt)
        counts = HcclEngine.buffer_counts(CollectiveOp(self.comm_id, op, int(send), int(recv), int(count), dt, "sum",
                                                       int(root)), self.size, self.rank)
        for ptr, n in zip((send, recv), counts):
            if n:
                if int(ptr) % isz:
                    raise HcclError(f"buffer 0x{int(ptr):x} not aligned to {isz} B", HCCL_E_PARA)
                try:
                    self.device.check_range(int(ptr), n * isz)
                except AclError as e:
                    if self.device.sanitizer is not None:       # memcheck: a refused bad access
                        self.device.sanitizer.api_error(e, self.device.handle)
                    raise HcclError(f"{op}: {e.detail}", HCCL_E_PARA) from None
        s.enqueue(Collective(s.sid, self.comm_id, op, int(send), int(recv), int(count), dt,
                             validate_redop(redop), int(root), int(peer)))

    # ---- tensor-level operators ----
    def all_reduce(self, send: Tensor, recv: Tensor | None = None, op="sum", stream: Stream | None = None) -> None:
        recv = recv or send
        _same(send, recv, "all_reduce")
        self.collective("allreduce", send.ptr, recv.ptr, send.numel, send.dtype, op, stream=stream)

    def all_gather(self, send: Tensor, recv: Tensor, stream: Stream | None = None) -> None:
        if recv.numel != send.numel * self.size or recv.dtype != send.dtype:
            raise HcclError(f"all_gather: recv must hold {self.size} x {send.numel} {send.dtype}", HCCL_E_PARA)
        self.collective("allgather", send.ptr, recv.ptr, send.numel, send.dtype, stream=stream)

    def reduce_scatter(self, send: Tensor, recv: Tensor, op="sum", stream: Stream | None = None) -> None:
        if send.numel != recv.numel * self.size or recv.dtype != send.dtype:
            raise HcclError(f"reduce_scatter: send must hold {self.size} x {recv.numel} {recv.dtype}", HCCL_E_PARA)
        self.collective("reducescatter", send.ptr, recv.ptr, recv.numel, recv.dtype, op, stream=stream)

    def broadcast(self, buf: Tensor, root: int, stream: Stream | None = None) -> None:
        self.collective("broadcast", buf.ptr, buf.ptr, buf.numel, buf.dtype, root=root, stream=stream)

    def reduce(self, send: Tensor, recv: Tensor | None, op="sum", root: int = 0,
               stream: Stream | None = None) -> None:
        recv_ptr = recv.ptr if recv is not None else 0
        if recv is not None:
            _same(send, recv, "reduce")
        self.collective("reduce", send.ptr, recv_ptr, send.numel, send.dtype, op, root=root, stream=stream)

    def all_to_all(self, send: Tensor, recv: Tensor, stream: Stream | None = None) -> None:
        _same(send, recv, "all_to_all")
        if send.numel % self.size:
            raise HcclError(f"all_to_all: {send.numel} elements do not split over {self.size} ranks", HCCL_E_PARA)
        self.collective("alltoall", send.ptr, recv.ptr, send.numel // self.size, send.dtype, stream=stream)

    def send(self, buf: Tensor, peer: int, stream: Stream | None = None) -> None:
        self.collective("send", buf.ptr, 0, buf.numel, buf.dtype, peer=peer, stream=stream)

    def recv(self, buf: Tensor, peer: int, stream: Stream | None = None) -> None:
        self.collective("recv", 0, buf.ptr, buf.numel, buf.dtype, peer=peer, stream=stream)

    def barrier(self, stream: Stream | None = None) -> None:
        self.collective("barrier", 0, 0, 0, "int8", stream=stream)

    def async_error(self) -> int:
        """``HcclGetCommAsyncError``: the HcclResult of the last failed operator (0 = none)."""
        return self.device.handle.hccl_async_error(self.comm_id)

    def destroy(self) -> None:
        """Frees the communicator on the device (waits for nothing: synchronize first)."""
        if not self._destroyed:
            self._destroyed = True
            try:
                self.device.flush(raise_errors=False)
                self.device.handle.hccl_comm_destroy(self.comm_id)
            except AclError:
                pass   # a dead device has nothing left to free


def _same(a: Tensor, b: Tensor, what: str) -> None:
    if a.numel != b.numel or a.dtype != b.dtype:
        raise HcclError(f"{what}: send {a.numel} x {a.dtype} and recv {b.numel} x {b.dtype} differ", HCCL_E_PARA)


# ----------------------------------------------------------------------------------------- creation
def comm_init_all(devices: Sequence[Device], options: CommOptions = CommOptions()) -> list[Communicator]:
    """``HcclCommInitAll``: rank i on ``devices[i]`` (one process, one node)."""
    if not devices:
        raise HcclError("no devices", HCCL_E_PARA)
    if len({d.physical_id for d in devices}) != len(devices):
        raise HcclError("a device appears twice", HCCL_E_PARA)
    cid = secrets.token_hex(16)
    peers = [d.handle.hccl_info() for d in devices]
    cfg = options.device_config()
    comms = []
    for r, d in enumerate(devices):
        d.handle.hccl_comm_init(cid, r, peers, cfg)
        comms.append(Communicator(d, cid, r, len(devices), peers))
    return comms


def parse_rank_table(table: dict | str) -> list[tuple[int, int, str]]:
    """(rank_id, device_id, server_id) from a rank-table (reference 3.3), sorted by rank; validated."""
    try:
        if isinstance(table, str):
            table = json.loads(table)
        if not isinstance(table, dict):
            raise TypeError(f"a rank table is a JSON object, not {type(table).__name__}")
        if table.get("status", "completed") != "completed":
            raise HcclError("rank table status is not 'completed'", HCCL_E_PARA)
        out = []
        for server in table["server_list"]:
            for dev in server["device"]:
                out.append((int(dev["rank_id"]), int(dev["device_id"]), str(server.get("server_id", ""))))
    except (KeyError, TypeError, ValueError) as e:
        raise HcclError(f"malformed rank table: {e}", HCCL_E_PARA) from None
    out.sort()
    if [r for r, _, _ in out] != list(range(len(out))):
        raise HcclError("rank_id values must be 0..n-1, each once", HCCL_E_PARA)
    return out


def comm_init_cluster_info(rank_table: str | dict, rank: int, options: CommOptions = CommOptions(),
                           runtime=None) -> Communicator:
    """``HcclCommInitClusterInfo``: this process's rank of a rank table whose ``device_id``s are
    physical device ids of the cluster.  Every rank calls it with the same table."""
    rt = runtime or get_runtime()
    text = rank_table if isinstance(rank_table, str) and rank_table.lstrip().startswith("{") else None
    if text is None and isinstance(rank_table, str):
        with open(rank_table) as f:
            text = f.read()
    try:
        table = json.loads(text) if text is not None else rank_table
    except ValueError as e:
        raise HcclError(f"malformed rank table: {e}", HCCL_E_PARA) from None
    ranks = parse_rank_table(table)
    if not 0 <= rank < len(ranks):
        raise HcclError(f"rank {rank} not in the rank table", HCCL_E_PARA)
    peers = [rt.backend.device(dev_id).hccl_info() for _, dev_id, _ in ranks]
    cid = hashlib.sha256(json.dumps(table, sort_keys=True).encode() + b"vnpu-ranktable").hexdigest()[:32]
    my_phys = ranks[rank][1]
    dev = next((d for d in rt.devices() if d.physical_id == my_phys), None)
    if dev is None:
        raise HcclError(f"device {my_phys} of rank {rank} is not visible to this process", HCCL_E_PARA)
    dev.handle.hccl_comm_init(cid, rank, peers, options.device_config())
    return Communicator(dev, cid, rank, len(ranks), peers)


def get_root_info(device: Device) -> bytes:
    """``HcclGetRootInfo`` on the root rank's device: an opaque 4108-byte blob to share out of band."""
    blob = json.dumps({"comm": secrets.token_hex(16), "root": device.handle.hccl_info()}).encode()
    if len(blob) > HCCL_ROOT_INFO_BYTES:
        raise HcclError("root info too large", HCCL_E_INTERNAL)
    return blob.ljust(HCCL_ROOT_INFO_BYTES, b"\0")


def comm_init_root_info(nranks: int, root_info: bytes, rank: int, device: Device,
                        options: CommOptions = CommOptions(), timeout_s: float = 120.0) -> Communicator:
    """``HcclCommInitRootInfo``: blocks until all ``nranks`` ranks have joined (or ``timeout_s``)."""
    try:
        info = json.loads(bytes(root_info).rstrip(b"\0"))
        cid, root = info["comm"], info["root"]
    except (ValueError, KeyError, TypeError):
        raise HcclError("malformed root info", HCCL_E_PARA) from None
    if not isinstance(nranks, int) or nranks < 1 or not 0 <= rank < nranks:
        raise HcclError(f"bad rank {rank} of {nranks}", HCCL_E_PARA)
    peers = device.handle.hccl_comm_join(cid, rank, nranks, root, options.device_config(), timeout_s)
    return Communicator(device, cid, rank, nranks, peers)


# ----------------------------------------------------------------------------------------- C-style API
def _result(fn, *a, **kw) -> int:
    try:
        fn(*a, **kw)
        return HCCL_SUCCESS
    except HcclError as e:
        return e.hccl_code
    except (InvalidParamError, AclError):
        return HCCL_E_PARA


def HcclAllReduce(sendBuf: int, recvBuf: int, count: int, dataType: int, op: int, comm: Communicator,
                  stream: Stream) -> int:
    return _result(comm.collective, "allreduce", sendBuf, recvBuf, count, dataType, REDOPS.get(op, op),
                   stream=stream)


def HcclAllGather(sendBuf: int, recvBuf: int, sendCount: int, dataType: int, comm: Communicator,
                  stream: Stream) -> int:
    return _result(comm.collective, "allgather", sendBuf, recvBuf, sendCount, dataType, stream=stream)


def HcclReduceScatter(sendBuf: int, recvBuf: int, recvCount: int, dataType: int, op: int, comm: Communicator,
                      stream: Stream) -> int:
    return _result(comm.collective, "reducescatter", sendBuf, recvBuf, recvCount, dataType, REDOPS.get(op, op),
                   stream=stream)


def HcclBroadcast(buf: int, count: int, dataType: int, root: int, comm: Communicator, stream: Stream) -> int:
    return _result(comm.collective, "broadcast", buf, buf, count, dataType, root=root, stream=stream)


def HcclReduce(sendBuf: int, recvBuf: int, count: int, dataType: int, op: int, root: int, comm: Communicator,
               stream: Stream) -> int:
    return _result(comm.collective, "reduce", sendBuf, recvBuf, count, dataType, REDOPS.get(op, op), root=root,
                   stream=stream)


def HcclAlltoAll(sendBuf: int, sendCount: int, sendType: int, recvBuf: int, recvCount: int, recvType: int,
                 comm: Communicator, stream: Stream) -> int:
    if sendCount != recvCount or sendType != recvType:
        return HCCL_E_PARA
    return _result(comm.collective, "alltoall", sendBuf, recvBuf, sendCount, sendType, stream=stream)


def HcclSend(sendBuf: int, count: int, dataType: int, destRank: int, comm: Communicator, stream: Stream) -> int:
    return _result(comm.collective, "send", sendBuf, 0, count, dataType, peer=destRank, stream=stream)


def HcclRecv(recvBuf: int, count: int, dataType: int, srcRank: int, comm: Communicator, stream: Stream) -> int:
    return _result(comm.collective, "recv", 0, recvBuf, count, dataType, peer=srcRank, stream=stream)


def HcclBarrier(comm: Communicator, stream: Stream) -> int:
    return _result(comm.barrier, stream)


def HcclCommDestroy(comm: Communicator) -> int:
    return _result(comm.destroy)


def HcclGetRankSize(comm: Communicator) -> tuple[int, int]:
    return comm.size, HCCL_SUCCESS


def HcclGetRankId(comm: Communicator) -> tuple[int, int]:
    return comm.rank, HCCL_SUCCESS
