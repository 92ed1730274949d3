"""The one template of ``acl.media``'s descriptor calls: a :class:`DescKind` is one kind of descriptor
(picture, stream, channel, ROI / resize / JPEGE configuration; VDEC / VENC channel and frame
configuration, :class:`CodecDescKind`) -- its table in :data:`._media_state.MEDIA`, its name in errors,
how a new one is made -- and makes its calls: ``<prefix>_create_<stem>``, ``<prefix>_destroy_<stem>``,
``<prefix>_set_<stem>_<field>`` and ``<prefix>_get_<stem>_<field>``, under pyACL's names and parameter
names (``acl.media.dvpp_set_pic_desc_size(pic_desc, size)``).  :mod:`._media` and :mod:`._media_video`
then hold only what differs: each field's check, the calls of their own shape.

As every acl call (:mod:`._calls`): create functions and getters are bare values (0 for a failure or an
unknown handle), setters and destroy functions return ``ret`` (100000 for an unknown descriptor or a bad
value; the value is checked before the descriptor).  All host-side and host-synchronous.
"""
from __future__ import annotations

import types
from typing import Any, Callable

from ._args import as_int, invalid
from ._calls import acl_call, acl_value
from ._media_state import MEDIA
from ._state import STATE, add_object, object_record

ACL_NAMESPACE = "acl.media"        # the calls made here are acl.media.* calls (runtime.acl._calls)

_U32 = 0xFFFFFFFF

#: a field's check: the program's value -> the value stored (TypeError / ValueError / AclError: 100000)
Check = Callable[[Any], Any]


class DescKind:
    """One kind of descriptor: the ``MEDIA`` table ``table`` (looked up per call: teardown replaces it)
    and ``what`` it is called in errors; its calls are named ``<prefix>_<verb>_<stem>`` and take the
    descriptor as parameter ``<stem>``."""

    def __init__(self, prefix: str, stem: str, table: str, what: str):
        self.prefix, self.stem, self.table, self.what = prefix, stem, table, what

    def records(self) -> dict:
        return getattr(MEDIA, self.table)

    def record(self, handle) -> Any:
        """The descriptor ``handle`` (100000 for an unknown or destroyed one)."""
        return object_record(self.records(), handle, self.what)

    def get(self, rec, field: str) -> Any:
        return getattr(rec, field)

    def put(self, rec, field: str, value) -> None:
        setattr(rec, field, value)

    def check_destroy(self, rec) -> None:
        """Raise when ``rec`` may not be destroyed now."""

    # ------------------------------------------------------------------------------------------ calls
    def create_call(self, make: Callable[[int], Any], doc: str = "") -> Callable:
        """``<prefix>_create_<stem>()`` -> a new descriptor, ``make(handle)`` (0 on failure)."""
        def create():
            return add_object(self.records(), make)
        return acl_value(0)(_named(create, f"{self.prefix}_create_{self.stem}", (), doc))

    def destroy_call(self, doc: str = "") -> Callable:
        """``<prefix>_destroy_<stem>(<stem>)`` -> ret."""
        def destroy(desc):
            with STATE.lock:
                rec = self.record(desc)
                self.check_destroy(rec)
                del self.records()[rec.handle]
        return acl_call()(_named(destroy, f"{self.prefix}_destroy_{self.stem}", (self.stem,), doc))

    def setter(self, field: str, check: Check, param: str = "", doc: str = "") -> Callable:
        """``<prefix>_set_<stem>_<field>(<stem>, <param or field>)`` -> ret: stores ``check(value)``."""
        def set_(desc, value):
            v = check(value)
            self.put(self.record(desc), field, v)
        return acl_call()(_named(set_, f"{self.prefix}_set_{self.stem}_{field}", (self.stem, param or field), doc))

    def getter(self, field: str, doc: str = "") -> Callable:
        """``<prefix>_get_<stem>_<field>(<stem>)`` -> the field (0 on failure)."""
        def get(desc):
            return self.get(self.record(desc), field)
        return acl_value(0)(_named(get, f"{self.prefix}_get_{self.stem}_{field}", (self.stem,), doc))


class CodecDescKind(DescKind):
    """A VDEC / VENC descriptor (``kind`` "vdec" or "venc"): one table holds both codecs' (100000 for the
    other codec's), its fields are its ``settings`` by name; a created channel is not destroyed."""

    def __init__(self, kind: str, stem: str, table: str, noun: str):
        super().__init__(kind, stem, table, f"{kind.upper()} {noun}")
        self.kind, self.noun = kind, noun

    def record(self, handle) -> Any:
        rec = super().record(handle)
        if rec.kind != self.kind:
            raise invalid(f"0x{rec.handle:x} is a {rec.kind.upper()} {self.noun}, not a {self.kind.upper()} one")
        return rec

    def get(self, rec, field: str) -> Any:
        return rec.settings[field]

    def put(self, rec, field: str, value) -> None:
        rec.settings[field] = value

    def check_destroy(self, rec) -> None:
        if getattr(rec, "created", False):
            raise invalid(f"destroy the {self.kind.upper()} channel ({self.kind}_destroy_channel) before its "
                          "description")


def _named(fn: Callable, name: str, params: tuple[str, ...], doc: str) -> Callable:
    """``fn`` as pyACL's function ``name`` with parameters ``params`` (its positional ones renamed: keyword
    calls, ``help()`` and a missing argument's TypeError read as pyACL's)."""
    code = fn.__code__
    code = code.replace(co_name=name, co_qualname=name, co_varnames=params + code.co_varnames[len(params):])
    out = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    out.__doc__ = doc or None
    return out


# ---------------------------------------------------------------------------------------------- checks
def u32(what: str) -> Check:
    """An int in 0 .. 2**32 - 1."""
    def check(v) -> int:
        n = as_int(v, what)
        if not 0 <= n <= _U32:
            raise invalid(f"{what} {n} is not a uint32")
        return n
    return check


def address(what: str) -> Check:
    """A device address (None is 0; the engine call that uses it checks it)."""
    return lambda v: 0 if v is None else as_int(v, what)


def integer(what: str) -> Check:
    return lambda v: as_int(v, what)


def bounded(what: str, ok: Callable[[int], bool], message: str) -> Check:
    """An int that ``ok`` accepts; otherwise ``message`` with the value for ``{}``."""
    def check(v) -> int:
        n = as_int(v, what)
        if not ok(n):
            raise invalid(message.format(n))
        return n
    return check


def flag(what: str) -> Check:
    """0 or 1."""
    return bounded(what, lambda n: n in (0, 1), what + " must be 0 or 1, got {}")


def callback(what: str) -> Check:
    def check(fn):
        if not callable(fn):
            raise invalid(f"the {what} callback is not callable")
        return fn
    return check
