"""``torch.distributed`` backend ``"hccl"`` on vnpu's HCCL (:mod:`runtime.hccl`).

Importing :mod:`runtime.torch` registers it (``torch.distributed.Backend.register_backend("hccl", ...,
devices=["npu"])``), so that torch_npu-style code runs unchanged::

    import runtime.torch                              # the one added line
    dist.init_process_group("hccl")                   # torchrun's env://, or init_method / store
    torch.npu.set_device(local_rank)
    x = torch.ones(4, device="npu"); dist.all_reduce(x)

**How ranks meet.**  Each rank drives its own virtual NPU.  The communicator is built the way
``ProcessGroupHCCL`` of torch_npu builds it: on the first collective, rank 0 asks its device for the root
info (``HcclGetRootInfo``) and publishes it through the process group's store (torchrun's rendezvous
store); every rank then joins with ``HcclCommInitRootInfo`` on the device of that collective's tensors.
Ranks in different OS processes must reach the *same* devices, so their runtime must use the cluster
backend (a running ``vnpu up`` cluster with ``VNPU_BACKEND=cluster``; inside a Ray actor of the cluster the
actor's own node's devices): the process group checks that when it is created (ranks publish their host,
process and backend through the store) and refuses in-process devices across processes with one clear
line -- without it, the ranks would wait for each other on devices nobody else can see.  Ranks that are
threads of one process may use the in-process backend.

**What blocks.**  A collective is *enqueued* on the current stream of its tensors' device (it only orders
the device, like a kernel: later npu work on that stream sees its result).  The returned work's
:meth:`HcclWork.wait` blocks the host until the stream has run it (``dist.all_reduce(x)`` without
``async_op`` waits): unlike NCCL's wait, which only orders the current stream, vnpu's makes the host see
the collective's outcome, so that a failure surfaces as an exception on that collective.  CPU tensors are
staged through the rank's device (host-blocking copies), so ``all_gather_object`` / ``broadcast_object_list``
work too.

**Failures.**  A collective that fails on the device (a peer device killed, a link down, a peer that
never arrives within the exec timeout) raises :class:`torch.distributed.DistBackendError` (a
``RuntimeError``) from ``wait`` with the HcclResult name and code (``e.hccl_code``).  The exec timeout is
the process group's ``timeout`` (``init_process_group(timeout=...)``) unless ``pg_options=HcclOptions(...)``
sets one.  After a failure the process group is aborted, as NCCL's is: every later collective raises the
same error at once; ``destroy_process_group()`` and a new ``init_process_group`` build a fresh communicator.
Bad arguments (a non-contiguous tensor, a tensor of another device, uneven all-to-all splits, an
unsupported reduce op) raise ``ValueError`` at the call.
"""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, ReduceOp, Work
from torch.futures import Future

from devices.errors import HCCL_E_PARA, AclError, HcclError
from runtime import hccl
from runtime.api import Device, Stream, Tensor

from . import dist_devices

BACKEND_NAME = "hccl"
#: where rank 0 publishes the root info in the process group's store (one key per generation: a group
#: destroyed and initialized again over the same store finds no stale root info)
ROOT_INFO_KEY = "vnpu-hccl/root-info/"
#: every rank adds 1 when its group is created: generation g's ranks count from g * size + 1
INITS_KEY = "vnpu-hccl/inits"
PROC_KEY = "vnpu-hccl/proc/"

_REDOPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
           ReduceOp.AVG: "sum"}
#: a bool tensor reduces as bytes: SUM / MAX are a logical or, PRODUCT / MIN a logical and (as NCCL does)
_BOOL_REDOPS = {"sum": "max", "max": "max", "prod": "min", "min": "min"}


@dataclass(frozen=True)
class HcclOptions:
    """``pg_options`` of ``init_process_group("hccl", pg_options=HcclOptions(...))`` / ``new_group``.

    ``exec_timeout_s``: how long one collective waits for its peers on the device (HCCL_EXEC_TIMEOUT);
    None: the process group's timeout.  ``algo``: an HCCL algorithm override (``ring``, ``hd``, ...;
    None: the engine chooses)."""
    exec_timeout_s: float | None = None
    algo: str | None = None


class HcclWork(Work):
    """One enqueued collective.  ``wait`` blocks the host until the device has run it (and copies staged
    CPU results back); it raises :class:`torch.distributed.DistBackendError` when the collective failed."""

    def __init__(self, pg: "ProcessGroupHCCL", what: str, stream: Stream | None, outputs: list,
                 finish: Callable[[], None] | None = None):
        super().__init__()
        self._pg, self._what, self._stream = pg, what, stream
        self._outputs, self._finish = outputs, finish
        self._done = stream is None and finish is None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Host-blocking: until the stream has run the collective (``timeout`` 0: up to the exec timeout
        and a margin); raises DistBackendError when it failed, or when it did not finish by then."""
        with self._lock:
            if not self._done:
                self._done = True
                try:
                    if self._stream is not None:
                        ms = timeout.total_seconds() * 1000.0 if timeout and timeout.total_seconds() > 0 else -1
                        self._stream.synchronize(ms)
                    if self._finish is not None:
                        self._finish()
                except AclError as e:
                    self._error = self._pg.failed(self._what, e)
            if self._error is not None:
                raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the collective has run (a stream query: sends what is queued, does not wait)."""
        if self._done:
            return True
        try:
            return self._stream is None or self._stream.query()
        except AclError:
            return True                 # it failed: wait() raises

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        self.wait()
        return self._outputs

    def get_future(self) -> Future:
        """A future of the outputs, completed (host-blocking: waits first) -- or failed with the error."""
        fut: Future = Future()
        try:
            self.wait()
            fut.set_result(self._outputs)
        except dist.DistBackendError as e:
            fut.set_exception(e)
        return fut


class _Buffers:
    """The device buffers of one call: npu tensors in place, CPU tensors staged through the rank's device.
    ``flat`` makes one contiguous device buffer of tensors (a gather's or scatter's list)."""

    def __init__(self, pg: "ProcessGroupHCCL", dev: Device, stream: Stream):
        self.pg, self.dev, self.stream = pg, dev, stream
        self.temps: list[Tensor] = []
        self.copy_back: list[tuple[torch.Tensor, Tensor]] = []

    def of(self, t: torch.Tensor, *, write: bool) -> Tensor:
        """``t`` as a vnpu tensor of this rank's device (a staged copy for a CPU tensor)."""
        if t.device.type == "cpu":
            d = self.dev.from_numpy(_host_array(t), stream=self.stream)
            self.temps.append(d)
            if write:
                self.copy_back.append((t, d))
            return d
        return self.pg.device_tensor(t, self.dev)

    def empty(self, numel: int, dtype: str) -> Tensor:
        d = self.dev.empty((numel,), dtype, stream=self.stream)
        self.temps.append(d)
        return d

    def gather_into(self, parts: Sequence[torch.Tensor]) -> Tensor:
        """One device buffer holding ``parts`` one after the other (stream-ordered copies)."""
        n = sum(p.numel() for p in parts)
        flat = self.empty(n * parts[0].element_size() if parts else 0, "uint8")
        off = 0
        for p in parts:
            src = self.of(p, write=False)
            self.stream.copy(flat.ptr + off, src.ptr, src.nbytes)
            off += src.nbytes
        return flat

    def scatter_from(self, flat: Tensor, parts: Sequence[torch.Tensor]) -> None:
        """Copy ``flat`` out into ``parts`` (stream-ordered)."""
        off = 0
        for p in parts:
            dst = self.of(p, write=True)
            self.stream.copy(dst.ptr, flat.ptr + off, dst.nbytes)
            off += dst.nbytes

    def finish(self) -> None:
        """After the stream ran (host): staged results back into their CPU tensors; temporaries freed."""
        for t, d in self.copy_back:
            t.copy_(torch.from_numpy(d.numpy(stream=self.stream).copy()).view(t.dtype).reshape(t.shape))
        for d in self.temps:
            d.free()
        self.temps.clear()


def _host_array(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a flat uint8 array (any dtype, bfloat16 and bool included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def _hccl_dtype(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    return "uint8" if name == "bool" else name


class ProcessGroupHCCL(ProcessGroup):
    """A process group whose collectives run on vnpu's HCCL, one communicator per group, built on first use
    (see the module docstring).  Every method that returns a work only orders the device; the work's
    ``wait`` blocks the host."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, options: HcclOptions | None = None,
                 group_name: str = ""):
        super().__init__(rank, size)                    # type: ignore[call-arg]
        self._store, self._timeout = store, timeout
        self._options = options or HcclOptions()
        self._group_name = group_name
        self._comm: hccl.Communicator | None = None
        self._comm_lock = threading.Lock()
        self._aborted: dist.DistBackendError | None = None
        self._runtime = dist_devices.runtime()
        self._generation = (int(store.add(INITS_KEY, 1)) - 1) // size
        _check_shared_devices(store, f"{self._generation}/", rank, size, self._runtime.backend.name)

    # ---- what torch asks of a process group
    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def exec_timeout_s(self) -> float:
        t = self._options.exec_timeout_s
        return float(t) if t is not None else max(1.0, self._timeout.total_seconds())

    def __repr__(self) -> str:
        return f"<ProcessGroupHCCL rank {self.rank()}/{self.size()} {self._comm!r}>"

    # ---- the communicator
    def communicator(self, dev: Device) -> hccl.Communicator:
        """This rank's communicator on ``dev`` (built on first use: root info through the store, then a
        join that blocks the host until every rank has joined, at most the exec timeout)."""
        with self._comm_lock:
            if self._aborted is not None:
                raise dist.DistBackendError(str(self._aborted))
            c = self._comm
            if c is not None:
                if c.device is not dev:
                    raise ValueError(f"hccl: rank {self.rank()} uses device {c.device.index}; a tensor of device "
                                     f"{dev.index} cannot join its collectives (one device per rank)")
                return c
            try:
                key = f"{ROOT_INFO_KEY}{self._generation}"
                if self.rank() == 0:
                    blob = hccl.get_root_info(dev)
                    self._store.set(key, blob)
                else:
                    blob = self._store.get(key)
                c = hccl.comm_init_root_info(self.size(), bytes(blob), self.rank(), dev,
                                             hccl.CommOptions(exec_timeout_s=self.exec_timeout_s,
                                                              algo=self._options.algo),
                                             timeout_s=self.exec_timeout_s)
            except AclError as e:
                raise self.failed("communicator set-up", e) from None
            self._comm = c
            return c

    def failed(self, what: str, e: AclError) -> dist.DistBackendError:
        """The DistBackendError of a failed collective; the group is aborted from now on."""
        dev = self._comm.device.index if self._comm is not None else "?"
        err = dist.DistBackendError(f"hccl {what} failed on rank {self.rank()} (npu:{dev}): {e}")
        err.hccl_code = getattr(e, "hccl_code", None)          # type: ignore[attr-defined]
        err.acl_code = e.code                                   # type: ignore[attr-defined]
        err.__cause__ = e
        if self._aborted is None:
            self._aborted = dist.DistBackendError(f"hccl process group aborted by an earlier failure ({err}); "
                                                  f"destroy_process_group() and init it again")
        return err

    def shutdown(self) -> None:
        """Destroy the communicator (its device's queued work is sent first; waits for nothing)."""
        with self._comm_lock:
            c, self._comm = self._comm, None
        if c is not None:
            c.destroy()

    def abort(self) -> None:
        self.shutdown()

    # ---- the one template of every operator
    def _run(self, what: str, tensors: Sequence[torch.Tensor], body: Callable[[hccl.Communicator, _Buffers], None],
             outputs: list, index: int | None = None) -> HcclWork:
        """Resolve the rank's device from ``tensors`` (or npu ``index``), enqueue ``body`` on its current
        stream, and return the work (only orders the device)."""
        if self._aborted is not None:
            raise dist.DistBackendError(str(self._aborted))
        dev = self._device_of(tensors) if index is None else dist_devices.device(index)
        stream = dist_devices.current_stream(dev)
        comm = self.communicator(dev)
        bufs = _Buffers(self, dev, stream)
        try:
            body(comm, bufs)
        except HcclError as e:
            if e.hccl_code == HCCL_E_PARA:
                raise ValueError(f"hccl {what}: {e}") from None
            raise self.failed(what, e) from None
        except AclError as e:
            raise self.failed(what, e) from None
        return HcclWork(self, what, stream, outputs, bufs.finish)

    def _device_of(self, tensors: Sequence[torch.Tensor]) -> Device:
        idx = {t.device.index for t in tensors if t.device.type != "cpu"}
        other = {t.device.type for t in tensors} - {"cpu", dist_devices.DEVICE_TYPE}
        if other:
            raise ValueError(f"hccl: tensors of device type {sorted(other)[0]!r}; the hccl backend takes "
                             f"{dist_devices.DEVICE_TYPE} (and CPU) tensors")
        for t in tensors:
            if not t.is_contiguous():
                raise ValueError("hccl: tensors must be contiguous")
        if len(idx) > 1:
            raise ValueError(f"hccl: tensors of one call are on different devices {sorted(idx)}")
        if idx:
            return dist_devices.device(idx.pop())
        if self._comm is not None:
            return self._comm.device
        return dist_devices.device(None)

    def device_tensor(self, t: torch.Tensor, dev: Device) -> Tensor:
        v = dist_devices.device_bytes(t)
        if v.device is not dev:
            raise ValueError(f"hccl: a tensor of npu:{v.device.index} in a call on npu:{dev.index}")
        return v

    def _redop(self, opts, t: torch.Tensor) -> str:
        op = getattr(opts, "reduceOp", ReduceOp.SUM)
        kind = getattr(op, "op", op)
        name = _REDOPS.get(kind)
        if name is None:
            raise ValueError(f"hccl: reduce op {kind} is not supported (sum, product, max, min, avg)")
        if kind == ReduceOp.AVG and not t.is_floating_point():
            raise ValueError("hccl: ReduceOp.AVG needs a floating point tensor")
        return _BOOL_REDOPS[name] if t.dtype == torch.bool else name

    def _avg(self, opts, ts: Sequence[torch.Tensor], work: HcclWork) -> HcclWork:
        kind = getattr(getattr(opts, "reduceOp", ReduceOp.SUM), "op", None)
        if kind != ReduceOp.AVG:
            return work
        n = self.size()
        if all(t.device.type != "cpu" for t in ts):
            for t in ts:
                t.div_(n)                  # stream-ordered after the collective, like any npu op
            return work
        work.wait()
        for t in ts:
            t.div_(n)
        return HcclWork(self, "avg", None, work.result())

    # ---- operators
    def allreduce(self, tensors, opts=None):  # type: ignore[override]
        t = _one(tensors, "allreduce")
        redop = self._redop(opts, t)

        def body(comm, b):
            buf = b.of(t, write=True)
            comm.collective("allreduce", buf.ptr, buf.ptr, t.numel(), _hccl_dtype(t), redop, stream=b.stream)
        return self._avg(opts, [t], self._run("allreduce", [t], body, [t]))

    def allreduce_coalesced(self, tensors, opts=None):
        works = [self.allreduce([t], opts) for t in tensors]

        def wait_all() -> None:
            for w in works:
                w.wait()
        return HcclWork(self, "allreduce_coalesced", None, list(tensors), wait_all)

    def reduce(self, tensors, opts=None):  # type: ignore[override]
        t = _one(tensors, "reduce")
        redop, root = self._redop(opts, t), int(opts.rootRank)

        def body(comm, b):
            buf = b.of(t, write=True)
            comm.collective("reduce", buf.ptr, buf.ptr, t.numel(), _hccl_dtype(t), redop, root=root, stream=b.stream)
        return self._avg(opts, [t] if self.rank() == root else [], self._run("reduce", [t], body, [t]))

    def broadcast(self, tensors, opts=None):  # type: ignore[override]
        t = _one(tensors, "broadcast")
        root = int(opts.rootRank) if opts is not None else 0

        def body(comm, b):
            buf = b.of(t, write=True)
            comm.collective("broadcast", buf.ptr, buf.ptr, buf.nbytes, "uint8", root=root, stream=b.stream)
        return self._run("broadcast", [t], body, [t])

    def all_gather_single(self, output, input, opts=None):
        _sizes(output, input, self.size(), "all_gather_into_tensor", output_bigger=True)

        def body(comm, b):
            src, dst = b.of(input, write=False), b.of(output, write=True)
            comm.collective("allgather", src.ptr, dst.ptr, src.nbytes, "uint8", stream=b.stream)
        return self._run("allgather", [output, input], body, [output])

    _allgather_base = all_gather_single

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs, t = output_tensors[0], _one(input_tensors, "allgather")
        if len(outs) != self.size() or any(o.numel() != t.numel() or o.dtype != t.dtype for o in outs):
            raise ValueError(f"hccl all_gather: needs {self.size()} output tensors like the input")

        def body(comm, b):
            src = b.of(t, write=False)
            flat = b.empty(src.nbytes * self.size(), "uint8")
            comm.collective("allgather", src.ptr, flat.ptr, src.nbytes, "uint8", stream=b.stream)
            b.scatter_from(flat, outs)
        return self._run("allgather", [t, *outs], body, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):
        _sizes(input, output, self.size(), "reduce_scatter_tensor", output_bigger=False)
        redop = self._redop(opts, output)

        def body(comm, b):
            src, dst = b.of(input, write=False), b.of(output, write=True)
            comm.collective("reducescatter", src.ptr, dst.ptr, output.numel(), _hccl_dtype(output), redop,
                            stream=b.stream)
        return self._avg(opts, [output], self._run("reducescatter", [output, input], body, [output]))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):  # type: ignore[override]
        out, parts = _one(output_tensors, "reduce_scatter"), input_tensors[0]
        if len(parts) != self.size() or any(p.numel() != out.numel() or p.dtype != out.dtype for p in parts):
            raise ValueError(f"hccl reduce_scatter: needs {self.size()} input tensors like the output")
        redop = self._redop(opts, out)

        def body(comm, b):
            flat = b.gather_into(parts)
            dst = b.of(out, write=True)
            comm.collective("reducescatter", flat.ptr, dst.ptr, out.numel(), _hccl_dtype(out), redop,
                            stream=b.stream)
        return self._avg(opts, [out], self._run("reducescatter", [out, *parts], body, [out]))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        for splits, t in ((output_split_sizes, output), (input_split_sizes, input)):
            if splits and len(set(splits)) > 1:
                raise ValueError("hccl all_to_all_single: uneven splits are not supported (equal splits only)")
        if output.numel() != input.numel() or input.numel() % n or output.dtype != input.dtype:
            raise ValueError(f"hccl all_to_all_single: input and output must hold the same {n} equal splits")

        def body(comm, b):
            src, dst = b.of(input, write=False), b.of(output, write=True)
            comm.collective("alltoall", src.ptr, dst.ptr, src.nbytes // n, "uint8", stream=b.stream)
        return self._run("alltoall", [output, input], body, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        sizes = {(t.numel(), t.dtype) for t in [*output_tensors, *input_tensors]}
        if len(output_tensors) != n or len(input_tensors) != n or len(sizes) != 1:
            raise ValueError(f"hccl all_to_all: needs {n} input and {n} output tensors of one size and dtype")

        def body(comm, b):
            src = b.gather_into(input_tensors)
            dst = b.empty(src.nbytes, "uint8")
            comm.collective("alltoall", src.ptr, dst.ptr, src.nbytes // n, "uint8", stream=b.stream)
            b.scatter_from(dst, output_tensors)
        return self._run("alltoall", [*output_tensors, *input_tensors], body, output_tensors)

    def barrier(self, opts=None):
        dev_opt = getattr(opts, "device", None)
        index = dev_opt.index if dev_opt is not None and dev_opt.type == dist_devices.DEVICE_TYPE else None

        def body(comm, b):
            comm.collective("barrier", 0, 0, 0, "int8", stream=b.stream)
        return self._run("barrier", [], body, [], index)

    def send(self, tensors, dst_rank, tag=0):
        t = _one(tensors, "send")

        def body(comm, b):
            buf = b.of(t, write=False)
            comm.collective("send", buf.ptr, 0, buf.nbytes, "uint8", peer=int(dst_rank), stream=b.stream)
        return self._run("send", [t], body, [t])

    def recv(self, tensors, src_rank, tag=0):
        t = _one(tensors, "recv")

        def body(comm, b):
            buf = b.of(t, write=True)
            comm.collective("recv", 0, buf.ptr, buf.nbytes, "uint8", peer=int(src_rank), stream=b.stream)
        return self._run("recv", [t], body, [t])

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("hccl: recv from any source is not supported (name the source rank)")

    def gather(self, output_tensors, input_tensors, opts=None):  # type: ignore[override]
        """An all-gather whose result only the root keeps (HCCL has no gather)."""
        t, root = _one(input_tensors, "gather"), int(opts.rootRank)
        outs = output_tensors[0] if self.rank() == root else []
        if self.rank() == root and (len(outs) != self.size() or any(o.numel() != t.numel() for o in outs)):
            raise ValueError(f"hccl gather: the root needs {self.size()} output tensors like the input")

        def body(comm, b):
            src = b.of(t, write=False)
            flat = b.empty(src.nbytes * self.size(), "uint8")
            comm.collective("allgather", src.ptr, flat.ptr, src.nbytes, "uint8", stream=b.stream)
            if outs:
                b.scatter_from(flat, outs)
        return self._run("gather", [t, *outs], body, output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):  # type: ignore[override]
        """A broadcast of the root's list, of which each rank keeps its part (HCCL has no scatter)."""
        out, root, n = _one(output_tensors, "scatter"), int(opts.rootRank), self.size()
        parts = input_tensors[0] if self.rank() == root else []

        def body(comm, b):
            nbytes = out.numel() * out.element_size()
            flat = b.gather_into(parts) if parts else b.empty(nbytes * n, "uint8")
            comm.collective("broadcast", flat.ptr, flat.ptr, nbytes * n, "uint8", root=root, stream=b.stream)
            dst = b.of(out, write=True)
            b.stream.copy(dst.ptr, flat.ptr + nbytes * self.rank(), nbytes)
        return self._run("scatter", [out, *parts], body, [out])


def _one(tensors, what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"hccl {what}: one tensor per call (got {len(tensors)})")
    return tensors[0]


def _sizes(big: torch.Tensor, small: torch.Tensor, n: int, what: str, output_bigger: bool) -> None:
    if big.numel() != small.numel() * n or big.dtype != small.dtype:
        which = ("output", "input") if output_bigger else ("input", "output")
        raise ValueError(f"hccl {what}: the {which[0]} must hold {n} x the {which[1]} ({small.numel()} "
                         f"{small.dtype}), got {big.numel()} {big.dtype}")


def _check_shared_devices(store, gen: str, rank: int, size: int, backend: str) -> None:
    """Every rank publishes (host, process, backend); ranks in different processes need devices they all
    reach (the cluster backend) -- the in-process backend's devices are private to each process."""
    me = f"{socket.gethostname()}:{os.getpid()}:{backend}"
    store.set(f"{PROC_KEY}{gen}{rank}", me)
    if size == 1 or backend != "local":
        return
    procs = {bytes(store.get(f"{PROC_KEY}{gen}{r}")).decode() for r in range(size)}
    if len(procs) > 1:
        raise ValueError("hccl: the ranks run in different processes but this one uses in-process devices "
                         "(VNPU_BACKEND=local), which no other process can reach: start a cluster (`vnpu up`) "
                         "and run every rank with VNPU_BACKEND=cluster")


def _create(dist_opts, pg_options=None) -> ProcessGroupHCCL:
    if pg_options is not None and not isinstance(pg_options, HcclOptions):
        raise ValueError(f"hccl: pg_options must be runtime.torch.distributed.HcclOptions, not "
                         f"{type(pg_options).__name__}")
    return ProcessGroupHCCL(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
                            pg_options, str(dist_opts.group_id))


def register() -> None:
    """Register backend ``"hccl"`` for the ``npu`` device (idempotent; done when runtime.torch is imported)."""
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=[dist_devices.DEVICE_TYPE])


def is_hccl_available() -> bool:
    """``torch_npu``'s ``torch.distributed.is_hccl_available()``: always True once runtime.torch is imported."""
    return BACKEND_NAME in dist.Backend.backend_list


__all__ = ["BACKEND_NAME", "HcclOptions", "HcclWork", "ProcessGroupHCCL", "register", "is_hccl_available"]
