"""`@frozen`: immutable value classes that are cheap to define.

`dataclass(frozen=True, slots=True)` compiles five or six methods per class at import time
(about 0.9 ms each class here, some 50 ms across keel's startup path). `@frozen` lets dataclasses
compile only `__init__` and shares one `__eq__`, `__hash__` and `__repr__` among all classes.
Immutability is enforced by the type checker (`dataclass_transform(frozen_default=True)`), not by a
per-class `__setattr__`; keel code never assigns to a value's fields. Imports nothing from keel.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in self._frozen_fields)


def _eq(self: Any, other: object) -> object:
    if type(other) is not type(self):
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Any) -> int:
    return hash((type(self), _values(self)))


def _repr(self: Any) -> str:
    args = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._frozen_fields)
    return f"{type(self).__qualname__}({args})"


@dataclass_transform(frozen_default=True)
def frozen(cls: type[T]) -> type[T]:
    """Decorator: a slotted value class with keyword/positional `__init__`, `__match_args__`,
    structural equality, hashing and a dataclass-style repr."""
    made: Any = dataclass(slots=True, eq=False, repr=False)(cls)
    made._frozen_fields = tuple(f.name for f in fields(made))
    made.__eq__ = _eq
    made.__hash__ = _hash
    made.__repr__ = _repr
    return made  # type: ignore[no-any-return]


__all__ = ["frozen"]
