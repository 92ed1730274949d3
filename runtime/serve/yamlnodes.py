"""Reading ``serve.yaml`` node by node, so that every error names the key and its line: the line of a
node, the keys of a mapping node, and the items of a list node.  Shared by the config loader (:mod:`runtime.serve.config`) and the
``self_healing`` section's (:mod:`runtime.serve.heal.config`); each passes its own error class (a
:class:`~devices.errors.InvalidParamError`), the message is the same shape for both:
``<file>: line N: <key path>: expected ...``."""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def line(node) -> int:
    """The 1-based line a YAML node starts on."""
    return node.start_mark.line + 1


def keyed(node, known: Sequence[str], where: str, path: str, error: type[Exception],
          what: str = "a mapping") -> dict:
    """key -> (key node, value node) of the mapping node at ``path``; ``error`` when the node is not a
    mapping (``expected <what>``) or has a key not in ``known`` (the message lists them in this order)."""
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise error(f"{where}line {line(node)}: {path}: expected {what}")
    keys = {k.value: (k, v) for k, v in node.value}
    for key, (k, _) in keys.items():
        if key not in known:
            raise error(f"{where}line {line(k)}: unknown key {path}.{key} (known: {', '.join(known)})")
    return keys


def items(node, where: str, path: str, parse: Callable[[object, str], T], error: type[Exception],
          what: str = "") -> list[T]:
    """``parse(item, f"{path}[{i}]")`` of each item of the list node at ``path``, in order; ``error`` when
    the node is not a list (``expected a list of <what>``)."""
    import yaml
    if not isinstance(node, yaml.SequenceNode):
        raise error(f"{where}line {line(node)}: {path}: expected a list{' of ' + what if what else ''}")
    return [parse(n, f"{path}[{i}]") for i, n in enumerate(node.value)]


__all__ = ["items", "keyed", "line"]
