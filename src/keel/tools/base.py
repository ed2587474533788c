"""The Tool protocol, the `@tool` decorator and the context every tool receives.

A tool is a typed async function: its name, docstring and signature give the model its name,
description and JSON schema; its first parameter is a `ToolContext` the model never sees
(STYLE.md 5). Failures the model can act on are `ToolError`s, which become error results.

Every tool also has a kind (`tool_kind`: builtin, local, mcp, memory, remote, subagent; an
accounting and display axis the gate never trusts) and metadata (`tool_meta`: read-only,
destructive, idempotent, needs-confirmation), read from optional attributes of the same names so
that any object implementing `Tool` may declare them (docs/tools.md "Tool kinds", "Tool
metadata"). This module must not import the loop or any front end.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import field
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    Protocol,
    TypeAlias,
    get_args,
    get_origin,
    overload,
    runtime_checkable,
)

from keel.frozen import frozen, mutable
from keel.llm.messages import Image, Text
from keel.llm.request import ToolSpec
from keel.tools.effects import DEFAULT_UNSAFE_TO_REPEAT

if TYPE_CHECKING:
    from keel.checkpoints import Checkpoints
    from keel.checkpoints.tree import TreeLimits
    from keel.lsp.manager import LspManager
    from keel.permissions.sandbox import Sandbox
    from keel.tools.background import BackgroundTasks


#: The id of the tool call running in the current task (set by the tool runner), for tools that
#: label what they start with it.
current_call_id: ContextVar[str] = ContextVar("keel_current_call_id", default="")


class ToolError(Exception):
    """A failure the model should see: the message says what went wrong and how to do better."""


class AnswerLater(Exception):
    """Raised by a tool whose answer comes later (a person approves, a job finishes elsewhere).
    In a fleet run the run parks: the worker is released, `keel runs list` shows what the run
    waits on, and `keel runs answer RUN CALL --result TEXT` supplies the result; the tool is not
    called again. Anywhere else nobody can wait, and the model gets an error saying so."""

    def __init__(self, note: str = "") -> None:
        super().__init__(note)
        self.note = note


@frozen
class FileStamp:
    mtime_ns: int
    size: int


@mutable
class ToolContext:
    """What a tool may use at run time. Owned by one agent; shared by its tools."""

    cwd: Path
    #: The project root: writes are confined below it.
    root: Path
    session_id: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    #: Files read in this context, for read-before-write checks.
    read_files: dict[Path, FileStamp] = field(default_factory=dict)
    #: Ranges already returned by `read` whose file has not changed since: (path, offset, limit).
    read_ranges: dict[tuple[Path, int, int], FileStamp] = field(default_factory=dict)
    #: The bash sandbox, when one works here (None: commands run unsandboxed).
    sandbox: Sandbox | None = None
    #: Where whole outputs of truncated results are kept (beside the session file), if anywhere.
    raw_dir: Path | None = None
    #: Snapshots taken before writes, for `/undo` (None: none are kept). Subagents share it.
    checkpoints: Checkpoints | None = None
    #: Bounds of bash capture outside git (settings `checkpoints`; None: the defaults).
    checkpoint_limits: TreeLimits | None = None
    #: Background shells and subagents (None: `run_in_background` is refused).
    background: BackgroundTasks | None = None
    #: Commands not safe to run twice (settings `unsafe_to_repeat`; keel.tools.effects).
    unsafe_to_repeat: tuple[str, ...] = DEFAULT_UNSAFE_TO_REPEAT
    #: Told the pid of each process group leader a tool starts, right after it starts (the tool
    #: runner journals it, so a resume can stop what a killed run left running).
    on_process: Callable[[int], None] | None = None
    #: Directories besides the root that writes may go to (`permissions.additionalDirectories`).
    extra_roots: tuple[Path, ...] = ()
    #: Why the model may not see a file's content (a `read` deny rule), or None: set by the
    #: agent from its permission gate (`PermissionGate.content_denied`). Tools that return the
    #: content of files they find themselves (grep, knowledge_search) ask it for each file.
    content_denied: Callable[[Path], str | None] | None = None
    #: The largest file `write`, `edit` and `multi_edit` may leave, in bytes (None: no limit),
    #: and why, in words the model reads. A fleet worker sets it from its workspace limits, so
    #: a file its saves would leave out is refused before it is written.
    max_file_size: int | None = None
    max_file_reason: str = ""
    #: The session's language servers (keel.lsp): `write`, `edit` and `multi_edit` append the
    #: errors they report to their results (None: no server can run here; nothing is added).
    lsp: LspManager | None = None

    def resolve(self, path: str) -> Path:
        """`path` relative to cwd, made absolute (not checked against the root)."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.cwd / p


@frozen
class ToolOutput:
    """A tool's result. `display` is for the UI only (a diff, a summary); the model sees `content`."""

    content: str | tuple[Text | Image, ...]
    is_error: bool = False
    display: str | None = None
    #: A warning for the user, shown as a notice when the call finishes ("" = none).
    notice: str = ""

    def blocks(self) -> tuple[Text | Image, ...]:
        return (Text(self.content),) if isinstance(self.content, str) else self.content


@runtime_checkable
class Tool(Protocol):
    """Optional attributes the runner also reads: `repeat_safe: bool` (False: a call must not
    run twice blindly after a crash) and `repeat_risk(ctx, args) -> str | None` (the same, per
    call), see keel.tools.effects; `kind` (`tool_kind`) and `destructive`, `idempotent`,
    `confirm` (`tool_meta`)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    #: Read-only tools run without asking and may run concurrently with each other.
    read_only: bool

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput: ...


def spec(tool: Tool) -> ToolSpec:
    return ToolSpec(tool.name, tool.description, tool.input_schema)


# ---------------------------------------------------------------------------------------------
# Kinds and metadata: optional attributes of any tool.

ToolKind: TypeAlias = Literal["builtin", "local", "mcp", "memory", "remote", "subagent"]
KINDS: tuple[ToolKind, ...] = ("builtin", "local", "mcp", "memory", "remote", "subagent")


def tool_kind(tool: object) -> ToolKind:
    """Where `tool` comes from: its `kind` attribute when it names one of `KINDS`, else
    `local` (a user's tool). For events, the journal, the UI and stats; never for trust."""
    kind = getattr(tool, "kind", "local")
    for known in KINDS:
        if kind == known:
            return known
    return "local"


@frozen
class ToolMeta:
    """What a tool says about its effects (docs/tools.md "Tool metadata").

    - `read_only`: it changes nothing; runs without asking (the gate's step 7) and alongside
      other read-only calls.
    - `destructive`: it may destroy or overwrite what it cannot put back; such a call that is
      not also idempotent is journaled before it runs and never repeated blindly on resume.
    - `idempotent`: running it twice with the same arguments has the effect of running it once.
    - `confirm`: the user confirms every call, in every mode but `bypass`; allow rules and
      hooks do not stand in for the user; never served to other agents.
    """

    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    confirm: bool = False


def tool_meta(tool: object) -> ToolMeta:
    """`tool`'s metadata from its optional attributes `read_only`, `destructive`, `idempotent`
    (None or absent: the same as `read_only`) and `confirm`. Only a literal `True` counts, and
    a tool that says it is both read-only and destructive is taken as not read-only (failing
    closed: it is asked about)."""
    destructive = getattr(tool, "destructive", False) is True
    read_only = getattr(tool, "read_only", False) is True and not destructive
    idempotent = getattr(tool, "idempotent", None)
    return ToolMeta(
        read_only=read_only,
        destructive=destructive,
        idempotent=read_only if idempotent is None else idempotent is True,
        confirm=getattr(tool, "confirm", False) is True,
    )


# ---------------------------------------------------------------------------------------------
# @tool: a typed function becomes a Tool.

ToolFunc = Callable[..., Awaitable[str | ToolOutput]]


@mutable
class FunctionTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    func: ToolFunc
    _params: dict[str, _Param]
    #: False: calls are not safe to repeat (a deploy, a payment); keel.tools.effects.
    repeat_safe: bool = True
    #: Per call: why this one is not safe to repeat, or None.
    repeat_risk: Callable[[ToolContext, dict[str, Any]], str | None] | None = None
    #: Where it comes from (`tool_kind`); a user's `@tool` is `local`.
    kind: ToolKind = "local"
    #: Metadata (`tool_meta`); `idempotent` None: the same as `read_only`.
    destructive: bool = False
    idempotent: bool | None = None
    confirm: bool = False

    async def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        unknown = sorted(set(args) - set(self._params))  # only a read-only tool runs with them
        out = await self.func(ctx, **{k: v for k, v in args.items() if k in self._params})
        out = out if isinstance(out, ToolOutput) else ToolOutput(out)
        if not unknown or not isinstance(out.content, str):
            return out
        note = f"(ignored unknown argument(s) {', '.join(unknown)}; accepted: "
        note += f"{', '.join(self._params)})\n"
        return dataclasses.replace(out, content=note + out.content)

    def validate(self, args: Any) -> str | None:
        """None if `args` fits the schema, else what is wrong (for an INVALID_ARGUMENTS result).
        A read-only tool ignores arguments it does not have (small models add some: `read`
        with a `content`), saying so in its result: running it changes nothing either way."""
        if not isinstance(args, dict):
            return f"arguments must be a JSON object, got {type(args).__name__}"
        problems = []
        unknown = sorted(set(args) - set(self._params))
        if unknown and not self.read_only:
            problems.append(
                f"unknown argument(s) {', '.join(unknown)}; accepted: {', '.join(self._params)}"
            )
        for pname, param in self._params.items():
            if pname not in args:
                if param.required:
                    problems.append(f"missing required argument {pname!r}")
                continue
            error = param.check(args[pname])
            if error:
                problems.append(f"{pname}: {error}")
        return "; ".join(problems) or None


@frozen
class _Param:
    schema: dict[str, Any]
    required: bool
    check: Callable[[Any], str | None]


RepeatRisk = Callable[[ToolContext, dict[str, Any]], str | None]


@overload
def tool(func: ToolFunc, /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    read_only: bool = False,
    repeat_safe: bool | None = None,
    repeat_risk: RepeatRisk | None = None,
    destructive: bool = False,
    idempotent: bool | None = None,
    confirm: bool = False,
    kind: ToolKind = "local",
) -> Callable[[ToolFunc], FunctionTool]: ...


def tool(
    func: ToolFunc | None = None,
    /,
    *,
    name: str | None = None,
    read_only: bool = False,
    repeat_safe: bool | None = None,
    repeat_risk: RepeatRisk | None = None,
    destructive: bool = False,
    idempotent: bool | None = None,
    confirm: bool = False,
    kind: ToolKind = "local",
) -> FunctionTool | Callable[[ToolFunc], FunctionTool]:
    """Decorator: `@tool` or `@tool(name="x", read_only=True)` on `async def f(ctx, a: str, …)`.
    `repeat_safe=False` (or a `repeat_risk` check per call) marks calls that must not run twice
    blindly after a crash (keel.tools.effects); left unset, a `destructive` tool that is not
    `idempotent` is not safe to repeat. `confirm=True`: the user confirms every call in every
    mode but bypass (docs/tools.md "Tool metadata"). `kind`: where the tool comes from
    (`local` unless keel's own code says otherwise).

    The docstring's first paragraph is the description; an `Args:` section gives parameter
    descriptions (`name: text`, continuation lines indented)."""
    tool_name = name
    if read_only and destructive:
        raise TypeError(f"tool {tool_name or '?'}: a tool cannot be read-only and destructive")
    if kind not in KINDS:
        raise TypeError(f"tool {tool_name or '?'}: kind must be one of {', '.join(KINDS)}")

    def wrap(f: ToolFunc) -> FunctionTool:
        built = _build(f, tool_name or f.__name__, read_only)
        if repeat_safe is None:
            unsafe = destructive and not (read_only if idempotent is None else idempotent)
            built.repeat_safe = not unsafe
        else:
            built.repeat_safe = repeat_safe
        built.repeat_risk = repeat_risk
        built.kind, built.destructive, built.idempotent, built.confirm = (
            kind,
            destructive,
            idempotent,
            confirm,
        )
        return built

    return wrap(func) if func is not None else wrap


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    lines = inspect.cleandoc(doc).splitlines()
    desc_lines: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args = True
            continue
        if not in_args:
            desc_lines.append(line)
            continue
        m = re.match(r"^\s{0,4}(\w+)\s*(\([^)]*\))?:\s*(.*)$", line)
        if m and not line.startswith(" " * 6):
            current = m.group(1)
            params[current] = m.group(3).strip()
        elif current and line.strip():
            params[current] = (params[current] + " " + line.strip()).strip()
        elif not line.strip():
            current = None
    return "\n".join(desc_lines).strip(), params


def _build(func: ToolFunc, name: str, read_only: bool) -> FunctionTool:
    if not inspect.iscoroutinefunction(func):
        raise TypeError(f"tool {name} must be an async function")
    hints = typing.get_type_hints(func)
    sig = inspect.signature(func)
    description, arg_docs = _parse_doc(func.__doc__ or "")
    if not description:
        raise TypeError(f"tool {name} needs a docstring: it is the model's description")
    params = list(sig.parameters.values())
    if not params or hints.get(params[0].name) is not ToolContext:
        raise TypeError(f"tool {name}: first parameter must be `ctx: ToolContext`")
    properties: dict[str, Any] = {}
    required: list[str] = []
    checked: dict[str, _Param] = {}
    for p in params[1:]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"tool {name}: parameter {p.name} must be a plain or keyword argument")
        annotation = hints.get(p.name)
        if annotation is None:
            raise TypeError(f"tool {name}: parameter {p.name} needs a type annotation")
        schema, check = _schema_for(annotation)
        if p.name in arg_docs:
            schema = {**schema, "description": arg_docs[p.name]}
        is_required = p.default is inspect.Parameter.empty
        if not is_required and p.default is not None:
            schema = {**schema, "default": p.default}
        properties[p.name] = schema
        if is_required:
            required.append(p.name)
        checked[p.name] = _Param(schema, is_required, check)
    input_schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return FunctionTool(name, description, input_schema, read_only, func, checked)


_JSON_TYPES: dict[type, tuple[str, tuple[type, ...]]] = {
    str: ("string", (str,)),
    int: ("integer", (int,)),
    float: ("number", (int, float)),
    bool: ("boolean", (bool,)),
}


def _schema_for(annotation: Any) -> tuple[dict[str, Any], Callable[[Any], str | None]]:
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:  # Optional[X]: null is accepted as "not given"
            inner, check = _schema_for(members[0])
            return inner, lambda v: None if v is None else check(v)
        raise TypeError(f"unsupported union type {annotation!r}")
    if origin is Literal:
        choices = list(get_args(annotation))
        return {"type": _JSON_TYPES[type(choices[0])][0], "enum": choices}, (
            lambda v: None if v in choices else f"must be one of {choices}, got {v!r}"
        )
    if origin is list:
        (item,) = get_args(annotation) or (str,)
        item_schema, item_check = _schema_for(item)

        def check_list(v: Any) -> str | None:
            if not isinstance(v, list):
                return f"must be an array, got {type(v).__name__}"
            for i, x in enumerate(v):
                err = item_check(x)
                if err:
                    return f"item {i} {err}"
            return None

        return {"type": "array", "items": item_schema}, check_list
    if origin is dict or annotation is dict:
        return {"type": "object"}, (
            lambda v: None if isinstance(v, dict) else f"must be an object, got {type(v).__name__}"
        )
    if annotation in _JSON_TYPES:
        json_type, accepted = _JSON_TYPES[annotation]

        def check_scalar(v: Any) -> str | None:
            # bool is an int in Python; JSON keeps them apart.
            if isinstance(v, accepted) and (annotation is bool or not isinstance(v, bool)):
                return None
            return f"must be {json_type}, got {_json_type_name(v)}"

        return {"type": json_type}, check_scalar
    raise TypeError(f"unsupported parameter type {annotation!r}")


def _json_type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(v), type(v).__name__)
