"""A sanitizer session: one client's trackers, call sites, findings and report.

:meth:`Session.wrap` puts a :class:`~runtime.sanitize.handle.SanitizedHandle` around a device handle (the
runtime does it for every device when a session is attached); the handles feed the session under its one
lock, and the session turns what the checks find into :class:`~runtime.sanitize.findings.Finding`\\ s:

- **racecheck**: a hazard is reported once per pair of call sites (both accesses' tasks, streams, the
  overlapping range, the allocation, both host stacks); later occurrences only count;
- **initcheck**: a read of bytes never written since their allocation, once per (read site, allocation);
- **memcheck**: a refused call that is a bad access (a memory error, or one naming a pointer that is not
  live memory of this process), with the issuing stack and the allocation's history; once per (site, code);
- **leakcheck**: allocations, streams, events, graphs (and ``malloc_host`` buffers) still alive when their
  runtime closes or the process exits, grouped by the call site that made them.

Findings print as they are found (up to ``print_limit``) to ``log_file`` or stderr; :meth:`Session.finish`
prints the summary and writes the JSON report.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections import OrderedDict
from typing import TextIO

from devices.arena import is_device_ptr, ptr_device
from devices.errors import (ACL_ERROR_RT_ADDR_UNALIGNED, ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW,
                            ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW, ACL_ERROR_RT_MEMORY_FREE, AclError,
                            MemoryAccessError)

from .clocks import Clocks
from .findings import FORMAT, PREFIX, Finding, site_block, summary_lines
from .memory import Allocation, AllocTable, describe
from .options import SanitizeOptions
from .shadow import Hits, actor_key
from .sites import Site, SiteTable
from .tracker import DeviceTracker

#: codes that are memory errors whatever the pointers say
MEMORY_CODES = frozenset((ACL_ERROR_RT_ADDR_UNALIGNED, ACL_ERROR_RT_MEMORY_FREE,
                          ACL_ERROR_RT_AICORE_TRAP_READ_OVERFLOW, ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW))
_PTR = re.compile(r"0x([0-9a-fA-F]+)")
_SIZED_PTR = re.compile(r"(\d+) B at 0x([0-9a-fA-F]+)")
#: ops whose sites were taken at enqueue and not yet handed to a device (bounded)
PENDING_SITES = 1 << 16


class Session:
    def __init__(self, options: SanitizeOptions = SanitizeOptions(), out=None):
        self.options = options
        self.lock = threading.RLock()
        self.sites = SiteTable(options.stack_depth)
        self.clocks = Clocks()
        self.trackers: list[DeviceTracker] = []
        self.host = AllocTable()                        # malloc_host buffers
        self.findings: list[Finding] = []
        self._keys: dict[tuple, Finding] = {}
        self._pending: OrderedDict[int, tuple] = OrderedDict()
        self._out = out
        self._own_out: TextIO | None = None
        self.printed = 0
        self.finished = False
        self._counts = {"tasks": 0, "replays": 0, "host_accesses": 0}     # of trackers no longer watched

    # ------------------------------------------------------------------ plumbing
    def wrap(self, handle):
        """``handle`` with this session watching every call (a DeviceHandle itself)."""
        from .handle import SanitizedHandle
        return SanitizedHandle(self, handle)

    def tracker(self, device: int) -> DeviceTracker:
        t = DeviceTracker(device, self.clocks, self.options)
        with self.lock:
            self.trackers.append(t)
        return t

    def site(self, skip: int = 1) -> int:
        return self.sites.capture(skip + 1)

    def note_enqueue(self, op) -> None:
        """The program enqueued ``op`` here (``runtime.api.Stream.enqueue``): keep its call site for
        when the op reaches the device (batched, or captured into a graph)."""
        sid = self.sites.capture(2)
        with self.lock:
            p = self._pending
            p[id(op)] = (op, sid)
            if len(p) > PENDING_SITES:
                p.popitem(last=False)

    def site_of(self, op) -> int:
        """The call site that enqueued ``op`` (taken at enqueue), else the current stack's."""
        with self.lock:
            got = self._pending.pop(id(op), None)
        if got is not None and got[0] is op:
            return got[1]
        return self.sites.capture(2)

    def _write(self, text: str) -> None:
        out = self._out
        if out is None:
            if self.options.log_file:
                out = self._own_out = self._own_out or open(self.options.log_file, "a", encoding="utf-8")
            else:
                out = sys.stderr
        out.write(text)
        out.flush()

    def _add(self, key: tuple, make) -> Finding | None:
        """Count a repeat of ``key``, or make, keep and print a new finding; returns the new one."""
        old = self._keys.get(key)
        if old is not None:
            old.count += 1
            return None
        f = make()
        self._keys[key] = f
        self.findings.append(f)
        if self.printed < self.options.print_limit:
            self.printed += 1
            self._write(f.text())
        return f

    # ------------------------------------------------------------------ what the runtime tells it
    def api_error(self, err: AclError, handle=None, api: str | None = None, ranges: tuple = ()) -> None:
        """A runtime call was refused before reaching a device (``runtime.api``'s host-side checks, an
        acl call): report it to memcheck from the caller's stack (``api`` names the entry point,
        ``ranges`` the ``(ptr, nbytes)`` the call named when known)."""
        if self.options.on("memcheck") and not getattr(err, "_vnpu_sanitized", False):
            self.refused(err, self.sites.capture(2), getattr(handle, "tracker", None), tuple(ranges), api=api)

    def internal_stream(self, handle, sid: int) -> None:
        """Stream ``sid`` of ``handle`` is the runtime's own (a default stream): not a leak."""
        t = getattr(handle, "tracker", None)
        if t is not None:
            with self.lock:
                t.mark_internal(sid)

    def release(self, handle) -> None:
        """The runtime that holds ``handle`` closes: what its program still holds there is leaked."""
        t = getattr(handle, "tracker", None)
        if t is not None:
            self.leak_check(t)

    # ------------------------------------------------------------------ racecheck / initcheck
    def collect(self, tracker: DeviceTracker, hits: Hits) -> None:
        """Turn one call's hits into findings (lock held)."""
        for key, (prior, actor, kind, lo, hi, alloc) in hits.hazards.items():
            pair = tuple(sorted(key))
            self._add(("race",) + pair, lambda: self._race(tracker, prior, actor, kind, lo, hi, alloc))
        for (akey, _), (actor, lo, hi, alloc) in hits.uninit.items():
            self._add(("init", akey, alloc.site, alloc.ptr), lambda: self._uninit(tracker, actor, lo, hi, alloc))

    def _who(self, actor) -> tuple[str, dict]:
        task, step, what = actor
        name = f"{step.label} (step {step.index} of {task.label})" if step is not None else task.label
        where = "the host" if task.stream is None else f"stream {task.stream} of npu{task.device}"
        data = {"task": name, "argument": what, "stream": task.stream, "device": task.device,
                "site": self.sites.site(task.site).as_dict() if task.site >= 0 else None}
        if step is not None:
            data["captured_at"] = self.sites.site(step.site).as_dict() if step.site >= 0 else None
        return f"{name} [{what}] on {where}", data

    def _sites_of(self, actor, verb: str) -> list[str]:
        task, step, _ = actor
        lines = site_block(f"{verb} issued at:", self.sites.site(task.site)) if task.site >= 0 else \
            [f"{verb} issued at: (unknown)"]
        if step is not None and step.site >= 0:
            lines += site_block(f"{verb} captured at (graph step {step.index}):", self.sites.site(step.site))
        return lines

    def _alloc_lines(self, alloc) -> list[str]:
        return site_block(f"Allocation (0x{alloc.ptr:x}, {alloc.size} bytes) made at:", self.sites.site(alloc.site)) \
            if alloc.site >= 0 else []

    def _race(self, tracker, prior, actor, kind, lo, hi, alloc) -> Finding:
        first_verb = "Read" if kind == "WAR" else "Write"
        second_verb = "Read" if kind == "RAW" else "Write"
        a_txt, a_data = self._who(prior)
        b_txt, b_data = self._who(actor)
        a_data["access"], b_data["access"] = first_verb.lower(), second_verb.lower()
        second = f"and {second_verb} access by {b_txt}"
        if actor[0].label == "free":                     # the host freed memory a task still uses
            second_verb = "Free"
            b_data["access"] = "free"
            second = "and Free of the allocation by the host"
        details = [f"{second} [{kind} hazard]",
                   f"Overlapping range: 0x{lo:x} .. 0x{hi:x} ({hi - lo} bytes; offset {lo - alloc.ptr} of the "
                   f"{alloc.size}-byte allocation at 0x{alloc.ptr:x})"]
        details += self._sites_of(prior, first_verb) + self._sites_of(actor, second_verb) + self._alloc_lines(alloc)
        details.append(_advice(prior[0], actor[0]))
        return Finding("racecheck", kind, f"Error: Race reported between {first_verb} access by {a_txt}", details,
                       {"device": tracker.device, "range": {"start": lo, "end": hi, "bytes": hi - lo},
                        "allocation": self._alloc_data(alloc), "accesses": [a_data, b_data]})

    def _uninit(self, tracker, actor, lo, hi, alloc) -> Finding:
        txt, data = self._who(actor)
        details = [f"Address 0x{lo:x} .. 0x{hi:x}: offset {lo - alloc.ptr} of the {alloc.size}-byte allocation at "
                   f"0x{alloc.ptr:x}, never written since it was allocated"]
        details += self._sites_of(actor, "Read") + self._alloc_lines(alloc)
        return Finding("initcheck", "uninitialized-read", f"Uninitialized device memory read of {hi - lo} bytes "
                       f"by {txt}", details,
                       {"device": tracker.device, "range": {"start": lo, "end": hi, "bytes": hi - lo},
                        "allocation": self._alloc_data(alloc), "accesses": [data]})

    def _alloc_data(self, alloc) -> dict:
        d = {"ptr": alloc.ptr, "bytes": alloc.size, "kind": alloc.kind,
             "allocated_at": self.sites.site(alloc.site).as_dict() if alloc.site >= 0 else None}
        if alloc.free_site is not None:
            d["freed_at"] = self.sites.site(alloc.free_site).as_dict()
        return d

    # ------------------------------------------------------------------ memcheck
    def refused(self, err: AclError, site: int, tracker: DeviceTracker | None = None,
                ranges: tuple = (), api: str | None = None) -> None:
        """A call was refused with ``err``: report it when it is a bad access.  ``ranges``: the
        ``(ptr, nbytes)`` the call named, when known; otherwise pointers are read from the message."""
        if not self.options.on("memcheck") or getattr(err, "_vnpu_sanitized", False):
            return
        try:
            err._vnpu_sanitized = True               # type: ignore[attr-defined]  # reported once
        except AttributeError:
            pass
        with self.lock:
            bad = self.bad_ranges(tracker, ranges, err)
            if not bad and not isinstance(err, MemoryAccessError) and err.code not in MEMORY_CODES:
                return
            self._add(("mem", site, err.code), lambda: self._memcheck(err, site, bad, api))

    def bad_ranges(self, tracker, ranges, err) -> list[tuple[str, int, int, Allocation | None]]:
        """``(what, ptr, nbytes, allocation)`` for the named ranges (``(ptr, nbytes)`` pairs; none: the
        pointers in ``err``'s message) that are not live memory, ``tracker``'s device's or the host's, as
        the session's allocation tables say now.  Host-only; reads the tables without the session's lock
        (hold :attr:`lock` for a consistent answer)."""
        out: list[tuple[str, int, int, Allocation | None]] = []
        if not ranges:
            sized = {int(p, 16): int(n) for n, p in _SIZED_PTR.findall(err.detail)}
            ranges = tuple((p, sized.get(p, 1)) for p in (int(m, 16) for m in _PTR.findall(err.detail)))
        for ptr, n in ranges:
            table = self._table_for(tracker, ptr)
            if table is None:
                continue
            what, a = table.explain(ptr, n)
            if table is self.host and what not in ("freed", "overrun"):
                continue                 # any integer in a message may be a host address: only clear evidence
            if what != "inside":
                out.append((what, ptr, n, a))
        return out

    def _table_for(self, tracker, ptr: int) -> AllocTable | None:
        if is_device_ptr(ptr):
            dev = ptr_device(ptr)
            if tracker is not None and dev == tracker.device:
                return tracker.memory
            for t in reversed(self.trackers):
                if not t.closed and dev == t.device:
                    return t.memory
            return None
        return self.host if self.host.live or self.host.freed else None

    def _memcheck(self, err: AclError, site: int, bad, api) -> Finding:
        s = self.sites.site(site)
        details = site_block("Refused call issued at:", s if not api else Site(api, s.frames))
        pointers = []
        for what, ptr, n, a in bad:
            details.append(describe(what, a, ptr, n))
            if a is not None:
                details += ["    " + ln for ln in self._alloc_lines(a)]
                if a.free_site is not None:
                    details += ["    " + ln for ln in site_block("Freed at:", self.sites.site(a.free_site))]
            pointers.append({"ptr": ptr, "bytes": n, "relation": what,
                             "allocation": self._alloc_data(a) if a is not None else None})
        return Finding("memcheck", "bad-access", f"Invalid memory access refused: [{err.code} {err.name}] {err.detail}",
                       details, {"code": err.code, "name": err.name, "api": api or s.api, "site": s.as_dict(),
                                 "pointers": pointers})

    # ------------------------------------------------------------------ leakcheck
    def leak_check(self, tracker: DeviceTracker) -> None:
        """Report what the client still holds on ``tracker``'s device and stop watching it."""
        with self.lock:
            if tracker.closed:
                return
            tracker.closed = True
            self.trackers = [t for t in self.trackers if t is not tracker]
            for k, v in tracker.counts.items():
                self._counts[k] += v
            if not self.options.on("leakcheck"):
                return
            for kind, items in tracker.alive().items():
                groups: dict[int, list] = {}
                for it in items:
                    groups.setdefault(it.site, []).append(it)
                for site, its in groups.items():
                    self._add(("leak", kind, tracker.device, site, id(tracker)),
                              lambda: self._leak(kind, tracker.device, site, its))

    def _leak(self, kind: str, device: int | None, site: int, items: list) -> Finding:
        n = len(items)
        where = f"npu{device}" if device is not None else "the host"
        if kind in ("allocation", "host-buffer"):
            nbytes = sum(a.size for a in items)
            head = f"Leaked {nbytes} bytes in {n} {'host buffer' if kind == 'host-buffer' else 'allocation'}" \
                   f"{'s' if n != 1 else ''} on {where}"
            ids = [hex(a.ptr) for a in items]
        else:
            nbytes = 0
            ident = {"stream": "sid", "event": "eid", "graph": "gid"}[kind]
            ids = [getattr(x, ident) for x in items]
            head = f"Leaked {n} {kind}{'s' if n != 1 else ''} on {where} ({', '.join(map(str, ids[:8]))}" \
                   f"{' ...' if n > 8 else ''})"
        details = site_block("Created at:", self.sites.site(site)) if site >= 0 else ["Created at: (unknown)"]
        return Finding("leakcheck", f"leak-{kind}", head, details,
                       {"device": device, "resources": n, "bytes": nbytes, "ids": ids[:64],
                        "created_at": self.sites.site(site).as_dict() if site >= 0 else None})

    # ------------------------------------------------------------------ host buffers (acl.rt.malloc_host)
    def host_allocated(self, ptr: int, nbytes: int, kind: str = "malloc_host") -> None:
        site = self.sites.capture(2)
        with self.lock:
            self.host.add(ptr, nbytes, site, kind)

    def host_freed(self, ptr: int) -> None:
        site = self.sites.capture(2)
        with self.lock:
            self.host.remove(ptr, site)

    # ------------------------------------------------------------------ the end
    @property
    def errors(self) -> int:
        return len(self.findings)

    def counts(self) -> dict[str, int]:
        """What was checked so far: device tasks (graph replays among them) and host accesses."""
        with self.lock:
            out = dict(self._counts)
            for t in self.trackers:
                for k, v in t.counts.items():
                    out[k] += v
            return out

    def report(self) -> dict:
        """The JSON form of everything found so far."""
        with self.lock:
            fs = [f.as_dict() for f in self.findings]
        return {"format": FORMAT, "tool": "vnpu-sanitize", "pid": os.getpid(), "argv": list(sys.argv),
                "tools": list(self.options.tools), "errors": len(fs), "checked": self.counts(), "findings": fs,
                "summary": [ln[len(PREFIX):] for ln in summary_lines(fs, self.options.tools)]}

    def finish(self) -> int:
        """Leak-check everything still watched, print the summary (unless ``summary=0``), write the JSON
        report; returns the number of errors.  Idempotent."""
        with self.lock:
            if self.finished:
                return self.errors
            self.finished = True
            for t in list(self.trackers):
                self.leak_check(t)
            if self.options.on("leakcheck") and self.host.live:
                groups: dict[int, list] = {}
                for a in self.host.live.values():
                    groups.setdefault(a.site, []).append(a)
                for site, its in groups.items():
                    self._add(("leak", "host-buffer", site), lambda: self._leak("host-buffer", None, site, its))
            doc = self.report()
        if self.options.summary:
            self._write("\n".join(PREFIX + ln for ln in doc["summary"]) + "\n")
        if self.options.json:
            path = self.options.json
            if os.path.isdir(path) or path.endswith(os.sep):
                os.makedirs(path, exist_ok=True)
                path = os.path.join(path, f"{os.getpid()}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
        if self._own_out is not None:
            self._own_out.close()
            self._own_out = None
        return doc["errors"]


def _advice(a, b) -> str:
    """How to order the two accesses (``a`` issued first)."""
    if a.stream is not None and b.stream is not None:
        return (f"Nothing orders them: record an event on stream {a.stream} after its access and make stream "
                f"{b.stream} wait on it (stream_wait_event), or synchronize stream {a.stream} before issuing the other.")
    if a.stream is not None:
        return (f"Nothing orders them: the host did not synchronize stream {a.stream} (or an event recorded after "
                f"its access) before its own access.")
    return "Nothing orders them: the host access was not followed by the issue of the task on the stream."
