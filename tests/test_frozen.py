"""`keel.frozen`: `@mutable` and `@frozen` behave as the `dataclass` they stand in for.

Each shape is defined twice from one source, once with `dataclass` and once with keel's
decorator, and both are driven the same way: construction (positional, keyword, defaults,
fresh factory values, missing arguments), equality, hashing, repr, `fields`, `replace`,
`asdict`, `__match_args__`, `__post_init__` and class attributes.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, ClassVar

import pytest

from keel.frozen import frozen, mutable

SHAPES = {
    "plain": """
class C:
    a: int
    b: str = "x"
""",
    "factories": """
class C:
    a: int
    items: list[int] = field(default_factory=list)
    table: dict[str, int] = field(default_factory=dict)
    b: str = "x"
""",
    "not in init": """
class C:
    a: int
    made: list[int] = field(default_factory=lambda: [1, 2], init=False)
    fixed: int = field(default=7, init=False)
    unset: int = field(init=False)
    b: int = 3
""",
    "repr and compare off": """
class C:
    a: int
    secret: str = field(default="s", repr=False)
    noise: float = field(default=0.0, compare=False)
""",
    "class variables and methods": """
class C:
    LIMIT: ClassVar[int] = 5
    a: int
    b: int = 2

    def total(self) -> int:
        return self.a + self.b + self.LIMIT
""",
    "post init": """
class C:
    a: int
    seen: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen.append(self.a)
""",
    "own eq and repr": """
class C:
    a: int

    def __eq__(self, other: object) -> bool:
        return True

    def __repr__(self) -> str:
        return "mine"
""",
    "own hash": """
class C:
    a: int

    def __hash__(self) -> int:
        return 42
""",
    "no fields": """
class C:
    pass
""",
}


def _make(source: str, decorate: Any) -> type:
    # dataclass reads `ClassVar` from the class's module: this one
    scope: dict[str, Any] = {"field": dataclasses.field, "ClassVar": ClassVar, "__name__": __name__}
    exec("from __future__ import annotations\n" + source, scope)
    cls: type = scope["C"]
    return decorate(cls)  # type: ignore[no-any-return]


def _calls(cls: type) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    required = [
        p
        for p in inspect.signature(cls).parameters.values()
        if p.default is inspect.Parameter.empty
    ]
    base = tuple(range(1, len(required) + 1))
    every = [p.name for p in inspect.signature(cls).parameters.values()]
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [(base, {})]
    if every:
        calls.append(((), {name: i for i, name in enumerate(every)}))
    calls.append((base + (99,) * 10, {}))  # too many arguments
    if required:
        calls.append(((), {}))  # missing ones
    return calls


def _attempt(work: Any) -> Any:
    try:
        return work()
    except (AttributeError, TypeError, ValueError) as exc:
        return ("error", type(exc).__name__)


def _observe(cls: type, *, params: bool = True) -> list[Any]:
    """Everything a caller can see of `cls`, as plain values (errors by their type)."""
    seen: list[Any] = [
        str(inspect.signature(cls)),
        getattr(cls, "__match_args__", None),
        [(f.name, f.type, f.init, f.repr, f.compare) for f in dataclasses.fields(cls)],
        dataclasses.is_dataclass(cls),
        params and repr(cls.__dataclass_params__),  # type: ignore[attr-defined]
        cls.__hash__ is None,
        {
            k: v
            for k, v in vars(cls).items()
            if not k.startswith("_") and not callable(v) and not inspect.ismemberdescriptor(v)
        },
    ]
    for args, kwargs in _calls(cls):
        seen.extend(_observe_call(cls, args, kwargs))
    return seen


def _observe_call(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    made = _attempt(lambda: (cls(*args, **kwargs), cls(*args, **kwargs)))
    if isinstance(made[0], str):
        return [made]
    one, two = made
    values = {n: getattr(one, n) for n in getattr(one, "__dict__", {})}
    seen = [
        _attempt(lambda: repr(one).replace(cls.__qualname__, "C")),
        _attempt(lambda: one == two),
        one == object(),
        values,
        [values[n] is getattr(two, n) for n in values if isinstance(values[n], list | dict)],
        _attempt(lambda: dataclasses.asdict(one)),
    ]
    first = dataclasses.fields(one)[0] if dataclasses.fields(one) else None
    if first is not None and first.init:
        changed = _attempt(lambda: dataclasses.replace(one, **{first.name: 123}))
        seen.append(_attempt(lambda: (getattr(changed, first.name), changed == one)))
    if cls.__hash__ is not None:
        seen.append(_attempt(lambda: hash(one) == hash(two)))
    return seen


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_mutable_behaves_as_dataclass(shape: str) -> None:
    theirs = _make(SHAPES[shape], dataclasses.dataclass)
    ours = _make(SHAPES[shape], mutable)
    assert _observe(ours) == _observe(theirs)
    # made without dataclass's own per-class work, not by falling back to it
    assert "_record_compare" in vars(ours) or shape in {"own eq and repr"}


@pytest.mark.parametrize("shape", ["plain", "factories", "not in init"])
def test_mutable_without_eq_keeps_identity_and_hash(shape: str) -> None:
    theirs = _make(SHAPES[shape], dataclasses.dataclass(eq=False))
    ours = _make(SHAPES[shape], mutable(eq=False))
    assert _observe(ours) == _observe(theirs)
    one = ours(1)
    assert one != ours(1)
    assert one == one  # identity, as dataclass(eq=False)
    assert hash(one) == object.__hash__(one)


def test_mutable_repr_of_a_cycle_does_not_recurse() -> None:
    Node = _make("class C:\n    name: str\n    other: object = None\n", mutable)
    a = Node("a")
    a.other = a
    assert repr(a) == "C(name='a', other=...)"


FALLBACKS = {
    "mutable default": ("class C:\n    a: list = []\n", ValueError),
    "default before required": ("class C:\n    a: int = 1\n    b: int\n", TypeError),
}


@pytest.mark.parametrize("shape", sorted(FALLBACKS))
def test_mutable_raises_what_dataclass_raises(shape: str) -> None:
    source, error = FALLBACKS[shape]
    with pytest.raises(error):
        _make(source, dataclasses.dataclass)
    with pytest.raises(error):
        _make(source, mutable)


def test_mutable_with_a_dataclass_base_is_a_dataclass() -> None:
    base = _make("class C:\n    a: int\n", dataclasses.dataclass)

    @mutable
    class Child(base):  # type: ignore[valid-type,misc]
        b: int = 2

    assert [f.name for f in dataclasses.fields(Child)] == ["a", "b"]
    assert Child(1) == Child(1, 2)
    assert repr(Child(1)).endswith("Child(a=1, b=2)")


@pytest.mark.parametrize(
    "source",
    [
        'class C:\n    a: int\n    b: str = "x"\n',
        "class C:\n    a: int\n    b: dict[str, int] = field(default_factory=dict)\n",
        "class C:\n    a: int\n\n    def __post_init__(self) -> None:\n"
        "        if self.a > 2:\n            raise ValueError(self.a)\n",
    ],
)
def test_frozen_behaves_as_a_frozen_dataclass(source: str) -> None:
    theirs = _make(source, dataclasses.dataclass(frozen=True, slots=True))
    ours = _make(source, frozen)
    # (not frozen=True in its parameters: the type checker keeps it immutable, keel.frozen)
    assert _observe(ours, params=False) == _observe(theirs, params=False)
    assert ours(1) == ours(1)
    assert ours(1) != ours(2)
    assert "_frozen_fields" in vars(ours)
