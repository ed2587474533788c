"""`@frozen`: immutable value classes that are cheap to define.

`dataclass(frozen=True, slots=True)` compiles five or six methods per class at import time
(about 0.9 ms each class here, some 50 ms across keel's startup path). `@frozen` shares one
`__eq__`, `__hash__` and `__repr__` among all classes, and makes a plain class (no base, no
`field()`) itself: one `__init__` per shape of fields, compiled once, with the class's defaults;
anything else goes through `dataclass`.
Immutability is enforced by the type checker (`dataclass_transform(frozen_default=True)`), not by a
per-class `__setattr__`; keel code never assigns to a value's fields. Imports nothing from keel.
"""

from __future__ import annotations

from dataclasses import _FIELD, MISSING, Field, dataclass, field, fields  # type: ignore[attr-defined]
from types import CodeType, FunctionType
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
    made: Any = _plain(cls)
    if made is None:
        made = dataclass(slots=True, eq=False, repr=False)(cls)
    made._frozen_fields = tuple(f.name for f in fields(made))
    made.__eq__ = _eq
    made.__hash__ = _hash
    made.__repr__ = _repr
    return made  # type: ignore[no-any-return]


#: `__init__`'s code for each list of field names and count of defaults, compiled once: classes
#: of the same shape share it, each with its own defaults.
_INIT_CODE: dict[tuple[tuple[str, ...], int], CodeType] = {}
_MUTABLE = (list, dict, set)


@dataclass(slots=True, eq=False, repr=False)
class _Shape:
    """What `dataclass(slots=True, eq=False, repr=False)` records as its parameters."""


_PARAMS = _Shape.__dataclass_params__  # type: ignore[attr-defined]


def _plain(cls: type) -> type | None:
    """The slotted class `dataclass(slots=True, eq=False, repr=False)` would make of `cls`,
    made without its per-class work (a Field per annotation found by string matching, five
    compiled methods, the docstring from `inspect.signature`): about a third of the time, which
    start-up pays for some 130 classes. None for anything but the plain case (a base class, a
    `field()`, ClassVar, InitVar, KW_ONLY, `__post_init__`, a mutable default, a default
    before a non-default): the caller then uses `dataclass` itself, which also raises its
    errors."""
    if cls.__bases__ != (object,) or "__post_init__" in cls.__dict__:
        return None
    namespace = dict(cls.__dict__)
    annotations = namespace.get("__annotations__", {})
    names: list[str] = []
    defaults: list[Any] = []
    made_fields: dict[str, Field[Any]] = {}
    for name, kind in annotations.items():
        if (
            not isinstance(kind, str)
            or "ClassVar" in kind
            or "InitVar" in kind
            or "KW_ONLY" in kind
        ):
            return None
        default = namespace.pop(name, MISSING)
        if isinstance(default, (Field, *_MUTABLE)):
            return None
        if default is MISSING:
            if defaults:
                return None
            made = field()
        else:
            defaults.append(default)
            made = field(default=default)
        made.name = name
        made.type = kind
        made._field_type = _FIELD
        made_fields[name] = made
        names.append(name)
    shape = (tuple(names), len(defaults))
    code = _INIT_CODE.get(shape)
    if code is None:
        code = _init_code(*shape)
        _INIT_CODE[shape] = code
    init = FunctionType(code, {}, "__init__", tuple(defaults) or None)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = tuple(names)
    namespace["__init__"] = init
    namespace["__match_args__"] = tuple(names)
    namespace["__dataclass_fields__"] = made_fields
    namespace["__dataclass_params__"] = _PARAMS
    return type(cls)(cls.__name__, cls.__bases__, namespace)


def _init_code(names: tuple[str, ...], defaults: int) -> CodeType:
    required = len(names) - defaults
    params = [n if i < required else f"{n}=None" for i, n in enumerate(names)]
    body = "".join(f"    self.{n} = {n}\n" for n in names) or "    pass\n"
    source = f"def __init__(self, {', '.join(params)}):\n{body}"
    scope: dict[str, Any] = {}
    exec(source, {}, scope)  # names are identifiers: the class body compiled them already
    code: CodeType = scope["__init__"].__code__
    return code


__all__ = ["frozen"]
