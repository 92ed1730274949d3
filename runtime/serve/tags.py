"""Request tags -> priority classes (``tags:`` in serve.yaml; the seed's ``stream_priority`` rules).

A generation request names its tag in the header ``x-vnpu-tag`` or in the body field ``vnpu_tag`` (OpenAI
clients pass it as an extra body field: ``extra_body={"vnpu_tag": "premium_user"}``); both given must
agree (400 otherwise).  A tag the rules map gives the request that priority class; an unknown tag, or
none, gives nothing (the tenant's class).  Combined with the tenant's class and the request's own
``priority`` the stricter wins -- the largest number, vLLM's lower-runs-first
(:meth:`runtime.serve.tenants.Tenant.effective_priority`): a tag may make a request run later than its
tenant's class, never earlier, as the request's own ``priority`` may.  The priority a request was queued
with comes back in the response header ``x-vnpu-priority``."""
from __future__ import annotations

from dataclasses import dataclass

from .engine.errors import InvalidRequest

TAG_HEADER = "x-vnpu-tag"
TAG_FIELD = "vnpu_tag"
PRIORITY_HEADER = "x-vnpu-priority"
MAX_TAG_CHARS = 128


@dataclass(frozen=True)
class TagRules:
    """``rules``: (tag, priority class) pairs, as ``tags:`` lists them."""
    rules: tuple[tuple[str, int], ...] = ()

    def class_of(self, tag: str | None) -> int | None:
        """The class the rules give ``tag`` (None: no tag, or one no rule names)."""
        return dict(self.rules).get(tag) if tag is not None else None


def request_tag(header: str | None, field) -> str | None:
    """The request's tag from the header and the body field (400 when they differ or the field is not a
    non-empty string of at most MAX_TAG_CHARS characters; an empty header is no tag)."""
    if field is not None and (not isinstance(field, str) or not field or len(field) > MAX_TAG_CHARS):
        raise InvalidRequest(f"{TAG_FIELD} must be a non-empty string of at most {MAX_TAG_CHARS} characters",
                             TAG_FIELD)
    header = header or None
    if header is not None and field is not None and header != field:
        raise InvalidRequest(f"the {TAG_HEADER} header ({header!r}) and {TAG_FIELD} ({field!r}) differ", TAG_FIELD)
    return field if field is not None else header


__all__ = ["PRIORITY_HEADER", "TAG_FIELD", "TAG_HEADER", "TagRules", "request_tag"]
