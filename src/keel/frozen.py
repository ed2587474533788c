"""`@frozen` and `@mutable`: value classes and mutable records that are cheap to define.

`dataclass(frozen=True, slots=True)` compiles five or six methods per class at import time
(about 0.9 ms each class here, some 50 ms across keel's startup path). `@frozen` shares one
`__eq__`, `__hash__` and `__repr__` among all classes, and makes a plain class (no base, no
`field()`) itself: one `__init__` per shape of fields, compiled once, with the class's defaults;
anything else goes through `dataclass`. `@mutable` is `dataclass` for mutable classes, made the same
way (one compiled `__init__` per shape of fields, shared `__eq__` and `__repr__`).
Immutability is enforced by the type checker (`dataclass_transform(frozen_default=True)`), not by a
per-class `__setattr__`; keel code never assigns to a value's fields. Imports nothing from keel.
"""

from __future__ import annotations

import copy
from dataclasses import (  # type: ignore[attr-defined]
    _FIELD,
    _HAS_DEFAULT_FACTORY,
    MISSING,
    Field,
    dataclass,
    field,
    fields,
)
from reprlib import recursive_repr
from types import CodeType, FunctionType
from typing import Any, TypeVar, dataclass_transform, overload

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


@dataclass(slots=True, eq=False, repr=False)
class _Shape:
    """What `dataclass(slots=True, eq=False, repr=False)` records as its parameters."""


_PARAMS = _Shape.__dataclass_params__  # type: ignore[attr-defined]


def _plain(cls: type) -> type | None:
    """The slotted class `dataclass(slots=True, eq=False, repr=False)` would make of `cls`,
    made without its per-class work (a Field per annotation found by string matching, five
    compiled methods, the docstring from `inspect.signature`): about a third of the time, which
    start-up pays for some 130 classes. None for anything but the plain case (a base class,
    ClassVar, InitVar, KW_ONLY, a field not in `__init__`, out of `repr` or comparison,
    a mutable default, a default before a non-default): the caller then uses `dataclass` itself, which also raises
    its errors."""
    if cls.__bases__ != (object,):
        return None
    namespace = dict(cls.__dict__)
    scanned = _scan(cls, namespace.get("__annotations__", {}), in_init_only=True)
    if scanned is None:
        return None
    made_fields, init = scanned
    if any(not f.compare or not f.repr or f.hash is not None for f in made_fields.values()):
        return None  # `frozen`'s shared methods use every field
    names = tuple(made_fields)
    for name in names:
        namespace.pop(name, None)
    namespace.pop("__dict__", None)
    namespace.pop("__weakref__", None)
    namespace["__slots__"] = names
    namespace["__init__"] = init
    namespace["__match_args__"] = names
    namespace["__dataclass_fields__"] = made_fields
    namespace["__dataclass_params__"] = _PARAMS
    return type(cls)(cls.__name__, cls.__bases__, namespace)


#: `__init__`'s code for each pattern of fields (how each is set: a parameter with or without
#: a default or a factory; not a parameter: from its factory, or its class attribute holds the
#: default) and whether `__post_init__` follows. Compiled once with placeholder names; each class
#: gets a copy with its own (`CodeType.replace`: the bytecode refers to names by position).
_INIT_TEMPLATES: dict[tuple[tuple[str, ...], bool], CodeType] = {}
_PLACEHOLDER = "_keel_field_"
_TEMPLATE_NAMES = frozenset({"self", "_F", "_NOT_GIVEN"})
#: The default of a parameter whose field has a `default_factory`: "not given" (`dataclass`'s
#: own marker, shown as `<factory>` in the signature).
_NOT_GIVEN: Any = _HAS_DEFAULT_FACTORY
#: `__dataclass_params__` for each (eq, repr).
_RECORD_PARAMS: dict[tuple[bool, bool], Any] = {}


def _record_eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self._record_compare
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


@recursive_repr()
def _record_repr(self: Any) -> str:
    args = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._record_repr_fields)
    return f"{self.__class__.__qualname__}({args})"


@overload
def mutable(cls: type[T], /) -> type[T]: ...
@overload
def mutable(*, eq: bool = True, repr: bool = True) -> Any: ...


@dataclass_transform(field_specifiers=(field, Field))
def mutable(cls: type[T] | None = None, /, *, eq: bool = True, repr: bool = True) -> Any:
    """Decorator: `dataclass` (or `dataclass(eq=False)`, `dataclass(repr=False)`) for a mutable
    class, the same methods and `dataclasses.fields`/`replace`/`asdict` support, made at about
    a fifth of the cost. What it does not handle itself (a dataclass base, `InitVar`, `KW_ONLY`,
    keyword-only fields, a default that `dataclass` refuses) goes through `dataclass`."""

    def wrap(cls: type[T]) -> type[T]:
        made = _record(cls, eq, repr)
        if made is None:
            return dataclass(eq=eq, repr=repr)(cls)
        return made

    return wrap if cls is None else wrap(cls)


def _record(cls: type[T], eq: bool, repr: bool) -> type[T] | None:
    if any(hasattr(base, "__dataclass_fields__") for base in cls.__mro__[1:]):
        return None
    namespace = cls.__dict__
    scanned = _scan(cls, namespace.get("__annotations__", {}), in_init_only=False)
    if scanned is None:
        return None
    made_fields, init = scanned
    for name, made in made_fields.items():
        if made.default is MISSING:
            if name in namespace:
                delattr(cls, name)  # a field() with a factory or nothing: no class attribute
        else:
            setattr(cls, name, made.default)
    names = tuple(made_fields)
    attrs: dict[str, Any] = {
        "__init__": init,
        "__match_args__": tuple(n for n, f in made_fields.items() if f.init),
        "__dataclass_fields__": made_fields,
        "__dataclass_params__": _record_params(eq, repr),
    }
    if repr:
        attrs["__repr__"] = _record_repr
        cls._record_repr_fields = tuple(n for n in names if made_fields[n].repr)  # type: ignore[attr-defined]
    if eq:
        attrs["__eq__"] = _record_eq
        cls._record_compare = tuple(n for n in names if made_fields[n].compare)  # type: ignore[attr-defined]
        if "__hash__" not in namespace:
            attrs["__hash__"] = None  # mutable and compared by value: unhashable, as dataclass
    for attr, value in attrs.items():
        if attr.startswith("__dataclass") or attr not in namespace or attr == "__hash__":
            setattr(cls, attr, value)
    return cls


def _scan(
    cls: type, annotations: dict[str, Any], *, in_init_only: bool
) -> tuple[dict[str, Field[Any]], FunctionType] | None:
    """The fields `dataclass` would find in `cls` and the `__init__` that sets them (one code
    object per shape of fields, shared by classes of that shape); None where `dataclass` must
    do it itself (InitVar, KW_ONLY, keyword-only fields; ClassVar and fields not in `__init__`
    too when `in_init_only`) or raise its error (a mutable default, a default before a
    non-default)."""
    namespace = cls.__dict__
    made_fields: dict[str, Field[Any]] = {}
    shape: list[tuple[str, str]] = []
    defaults: list[Any] = []
    factories: list[Any] = []
    has_default = False
    for name, kind in annotations.items():
        if not isinstance(kind, str) or "InitVar" in kind or "KW_ONLY" in kind:
            return None
        if "ClassVar" in kind:
            if in_init_only:
                return None
            continue
        value = namespace.get(name, MISSING)
        made: Field[Any] = value if isinstance(value, Field) else field(default=value)
        if made.kw_only not in (MISSING, False) or (in_init_only and not made.init):
            return None
        made.kw_only = False
        if made.default is not MISSING and made.default.__class__.__hash__ is None:
            return None  # a mutable default: `dataclass` raises its error
        if made.default is not MISSING:
            how = "default"
        elif made.default_factory is not MISSING:
            how = "factory"
        else:
            how = "required"
        if made.init:
            if how == "required" and has_default:
                return None  # a non-default after a default: `dataclass` raises
            has_default = has_default or how != "required"
            if how == "default":
                defaults.append(made.default)
            elif how == "factory":
                defaults.append(_NOT_GIVEN)
                factories.append(made.default_factory)
        elif how == "factory":
            factories.append(made.default_factory)
        made.name = name
        made.type = kind
        made._field_type = _FIELD  # type: ignore[attr-defined]
        made_fields[name] = made
        shape.append((name, how if made.init else f"fixed-{how}"))
    code = _init_code(tuple(shape), hasattr(cls, "__post_init__"))
    scope = {"_NOT_GIVEN": _NOT_GIVEN, "_F": tuple(factories)}
    init = FunctionType(code, scope, "__init__", tuple(defaults) or None)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = {n: f.type for n, f in made_fields.items() if f.init} | {"return": None}
    return made_fields, init


def _init_code(shape: tuple[tuple[str, str], ...], post_init: bool) -> CodeType:
    """`__init__`'s code for `shape` (each field's name and how it is set)."""
    names = [name for name, _ in shape]
    if any(n in _TEMPLATE_NAMES or n.startswith(_PLACEHOLDER) for n in names):
        return _compile_init(shape, post_init)  # a name the template uses itself
    hows = tuple(how for _, how in shape)
    template = _INIT_TEMPLATES.get((hows, post_init))
    if template is None:
        placeholders = tuple((f"{_PLACEHOLDER}{i}", how) for i, how in enumerate(hows))
        template = _INIT_TEMPLATES[(hows, post_init)] = _compile_init(placeholders, post_init)
    own = {f"{_PLACEHOLDER}{i}": name for i, name in enumerate(names)}
    return template.replace(
        co_varnames=tuple(own.get(n, n) for n in template.co_varnames),
        co_names=tuple(own.get(n, n) for n in template.co_names),
    )


def _compile_init(shape: tuple[tuple[str, str], ...], post_init: bool) -> CodeType:
    params: list[str] = []
    body: list[str] = []
    factory = 0
    for name, how in shape:
        if how == "required":
            params.append(name)
        elif how in ("default", "factory"):
            params.append(f"{name}=None")
        if how in ("required", "default"):
            body.append(f"self.{name} = {name}")
        elif how == "factory":
            body.append(f"self.{name} = _F[{factory}]() if {name} is _NOT_GIVEN else {name}")
            factory += 1
        elif how == "fixed-factory":
            body.append(f"self.{name} = _F[{factory}]()")
            factory += 1
    if post_init:
        body.append("self.__post_init__()")
    lines = "".join(f"    {line}\n" for line in body) or "    pass\n"
    source = f"def __init__(self, {', '.join(params)}):\n{lines}"
    scope: dict[str, Any] = {}
    exec(source, {}, scope)  # names are identifiers: the class body compiled them already
    code: CodeType = scope["__init__"].__code__
    return code


def _record_params(eq: bool, repr: bool) -> Any:
    """`dataclass`'s parameters object for `dataclass(eq=eq, repr=repr)`: a copy of the one
    `_Shape` got, changed where they differ (its fields vary with the Python version)."""
    params = _RECORD_PARAMS.get((eq, repr))
    if params is None:
        params = copy.copy(_PARAMS)
        params.eq, params.repr = eq, repr
        if hasattr(params, "slots"):
            params.slots = False
        _RECORD_PARAMS[(eq, repr)] = params
    return params


__all__ = ["frozen", "mutable"]
