"""Reading ``serve.yaml`` node by node, so that every error names the key and its line: the line of a
node, the keys of a mapping node, and the items of a list node, and a scalar checked by a reader
(:func:`value` with :func:`integer`, :func:`number`, :func:`boolean`, :func:`text`, :func:`one_of`).
Shared by the config loader (:mod:`runtime.serve.config`), the ``self_healing`` section's
(:mod:`runtime.serve.heal.config`) and a model repository's ``config.yaml`` (:mod:`runtime.serve.modelrepo.config`);
each passes its own error class (a :class:`~devices.errors.InvalidParamError`), the message is the same
shape for all: ``<file>: line N: <key path>: expected ...``."""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def line(node) -> int:
    """The 1-based line a YAML node starts on."""
    return node.start_mark.line + 1


def name(key, where: str, path: str, error: type[Exception]) -> str:
    """The name a mapping key node stands for; ``error`` (``line N: <path>: keys must be plain names``)
    when the key is not a plain scalar -- a complex key (``? [a, b]``) or a mapping -- which a Python dict
    could not even hold."""
    import yaml
    if not isinstance(key, yaml.ScalarNode):
        raise error(f"{where}line {line(key)}: {path + ': ' if path else ''}keys must be plain names")
    return str(key.value)


def unknown_key(key: str, known: Sequence[str], where: str, at: int, path: str) -> str:
    """The message for a key ``known`` does not list: ``<file>: line N: unknown key <path>.<key> (did you mean
    <near>? known: ...)`` -- the did-you-mean when a known key is close (``difflib``)."""
    import difflib
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}? " if near else ""
    full = f"{path}.{key}" if path else key
    return f"{where}line {at}: unknown key {full} ({hint}known: {', '.join(known)})"


def keyed(node, known: Sequence[str], where: str, path: str, error: type[Exception],
          what: str = "a mapping") -> dict:
    """key -> (key node, value node) of the mapping node at ``path`` ("" for the file's root); ``error``
    when the node is not a mapping (``expected <what>``), has a key that is not a plain name (:func:`name`)
    or a key not in ``known`` (the message lists them in this order)."""
    import yaml
    if not isinstance(node, yaml.MappingNode):
        raise error(f"{where}line {line(node)}: {path + ': ' if path else ''}expected {what}")
    keys = {name(k, where, path, error): (k, v) for k, v in node.value}
    for key, (k, _) in keys.items():
        if key not in known:
            raise error(unknown_key(key, known, where, line(k), path))
    return keys


def load(node, where: str, path: str, error: type[Exception]):
    """The Python value of the node at ``path`` (``yaml.safe_load`` of it), after checking that every
    mapping inside it has plain names as keys (:func:`name`, naming the nested path) -- a complex key
    deep in a value would otherwise fail in PyYAML's constructor (``found unhashable key``)."""
    import yaml
    todo = [(node, path)]
    while todo:
        n, at = todo.pop()
        if isinstance(n, yaml.MappingNode):
            todo += [(v, f"{at}.{name(k, where, at, error)}") for k, v in n.value]
        elif isinstance(n, yaml.SequenceNode):
            todo += [(v, f"{at}[{i}]") for i, v in enumerate(n.value)]
    return yaml.safe_load(yaml.serialize(node))


def items(node, where: str, path: str, parse: Callable[[object, str], T], error: type[Exception],
          what: str = "") -> list[T]:
    """``parse(item, f"{path}[{i}]")`` of each item of the list node at ``path``, in order; ``error`` when
    the node is not a list (``expected a list of <what>``)."""
    import yaml
    if not isinstance(node, yaml.SequenceNode):
        raise error(f"{where}line {line(node)}: {path}: expected a list{' of ' + what if what else ''}")
    return [parse(n, f"{path}[{i}]") for i, n in enumerate(node.value)]


def value(node, where: str, path: str, error: type[Exception], read: Callable[[object], T]) -> T:
    """``read`` of the Python value of the node at ``path`` (:func:`load`); a ValueError from ``read``
    becomes ``error`` (``<where>line N: <path>: <its message>``).  ``read`` is one of the readers below
    or any function that raises ValueError with the reason."""
    v = load(node, where, path, error)
    try:
        return read(v)
    except ValueError as e:
        raise error(f"{where}line {line(node)}: {path}: {e}") from None


def integer(lo: int | None = None) -> Callable[[object], int]:
    """A reader (:func:`value`) of an integer (not a boolean), ``>= lo`` when given."""
    def read(v) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo):
            raise ValueError(f"expected an integer{f' >= {lo}' if lo is not None else ''}, got {v!r}")
        return v
    return read


def number(lo: float | None = None) -> Callable[[object], float]:
    """A reader of a number (int or float, not a boolean), ``>= lo`` when given."""
    def read(v) -> float:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or (lo is not None and v < lo):
            raise ValueError(f"expected a number{f' >= {lo}' if lo is not None else ''}, got {v!r}")
        return v
    return read


def boolean(v) -> bool:
    """A reader of true or false."""
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def text(v) -> str:
    """A reader of a non-empty string."""
    if not isinstance(v, str) or not v:
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return v


def one_of(choices: Sequence[str]) -> Callable[[object], str]:
    """A reader of one of ``choices`` (a string)."""
    def read(v) -> str:
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {v!r}")
        return v
    return read


__all__ = ["boolean", "integer", "items", "keyed", "line", "load", "name", "number", "one_of", "text", "unknown_key", "value"]
