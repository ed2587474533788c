"""Modal cards of the terminal UI: a permission question, plan approval, a picker and the quit
question. Each one returns its answer through `dismiss`; none of them touches the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from keel.agent.events import QuestionRequest
from keel.permissions.gate import PermissionReply, PermissionRequest
from keel.tui.format import call_preview, key_argument
from keel.tui.view import Choice
from keel.tui.widgets import diff_text

#: A reply that means "stop the turn" (Esc on a question): the app interrupts instead.
INTERRUPT = PermissionReply(False, reason="")


class _Question(ModalScreen[PermissionReply]):
    """Options in a list (digits pick them), and a reason box for the "no" option."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "interrupt", "interrupt", show=False),
    ]
    DEFAULT_CSS = """
    _Question { align: center bottom; background: $background 40%; }
    _Question > #card {
        width: 100%; height: auto; max-height: 90%; border: round $accent;
        padding: 0 1; background: $surface;
    }
    _Question #title { text-style: bold; }
    _Question #why { color: $text-muted; }
    _Question #preview { height: auto; max-height: 16; margin: 1 0 0 0; }
    _Question OptionList { height: auto; border: none; margin: 1 0 0 0; padding: 0; }
    _Question OptionList:focus { border: none; }
    _Question #preview Markdown { margin: 0; padding: 0; }
    _Question #preview MarkdownHeader { content-align: left top; text-align: left; margin: 0; }
    _Question Input { margin: 0 0 1 0; }
    _Question #hint { color: $text-muted; }
    """
    #: The option index that asks for a reason before answering.
    deny_index = 0

    def __init__(self, request: PermissionRequest) -> None:
        super().__init__()
        self.request = request
        self.interrupted = False
        self.reason = Input(placeholder="what should keel do instead? (Enter to send)")
        self.reason.display = False

    def options(self) -> list[str]:
        raise NotImplementedError

    def answer(self, index: int, reason: str) -> PermissionReply:
        raise NotImplementedError

    def body(self) -> list[Any]:
        raise NotImplementedError

    def compose(self) -> Any:
        with Vertical(id="card"):
            yield from self.body()
            yield OptionList(
                *[
                    Option(f"{i}. {label}", id=str(i - 1))
                    for i, label in enumerate(self.options(), 1)
                ],
                id="options",
            )
            yield self.reason
            yield Static(Text("↑/↓ and Enter, or a digit · Esc stops the turn"), id="hint")

    def on_mount(self) -> None:
        self.query_one("#options", OptionList).focus()

    def on_key(self, event: Any) -> None:
        if self.reason.display:
            return
        key = getattr(event, "key", "")
        digits = {str(i): i - 1 for i in range(1, len(self.options()) + 1)}
        shortcuts = {"y": 0, "n": self.deny_index}
        if key in digits or key in shortcuts:
            event.stop()
            self._choose(digits.get(key, shortcuts.get(key, 0)))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._choose(int(event.option.id or 0))

    def _choose(self, index: int) -> None:
        if index == self.deny_index:
            self.reason.display = True
            self.reason.focus()
            return
        self.dismiss(self.answer(index, ""))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(self.answer(self.deny_index, event.value.strip()))

    def action_interrupt(self) -> None:
        self.interrupted = True
        self.dismiss(INTERRUPT)


class PermissionScreen(_Question):
    """Allow once / for the session / always (saving the suggested rule) / deny with a reason."""

    deny_index = 3

    def __init__(self, request: PermissionRequest, saved_to: str) -> None:
        super().__init__(request)
        self.saved_to = saved_to
        if request.confirm:  # a confirmation: nothing to save, so no "always"
            self.deny_index = 2

    def body(self) -> list[Any]:
        call = self.request.call
        title = Text(f"Allow {call.name}", style="bold")
        argument = key_argument(call, 70)
        if argument:
            title.append(f"  {argument}", style="")
        parts: list[Any] = [
            Static(title, id="title"),
            Static(Text(f"keel wants to {self.request.reason}"), id="why"),
        ]
        preview = call_preview(call)
        if preview:
            parts.append(VerticalScroll(Static(diff_text(preview)), id="preview"))
        return parts

    def options(self) -> list[str]:
        rule = self.request.suggestion
        if self.request.confirm:
            return [
                "Yes",
                f"Yes, and don't ask again for {self.request.call.name} until keel exits",
                "No, and tell keel what to do instead",
            ]
        return [
            "Yes",
            f"Yes, and don't ask again for {rule} in this session",
            f"Yes, and always allow {rule} (saved to {self.saved_to})",
            "No, and tell keel what to do instead",
        ]

    def answer(self, index: int, reason: str) -> PermissionReply:
        if index == self.deny_index:
            return PermissionReply(False, reason=reason)
        return PermissionReply(True, ("once", "session", "always")[index])


class PlanScreen(_Question):
    """Plan approval: the plan as Markdown, then the mode to carry it out in."""

    deny_index = 2

    def body(self) -> list[Any]:
        from textual.widgets import Markdown  # (markdown-it: loaded when first needed)

        return [
            Static(Text("Here is the plan. Go ahead?", style="bold"), id="title"),
            VerticalScroll(Markdown(self.request.plan), id="preview"),
        ]

    def options(self) -> list[str]:
        return [
            "Yes, and accept edits",
            "Yes, but ask before each edit",
            "No, keep planning (tell keel what to change)",
        ]

    def answer(self, index: int, reason: str) -> PermissionReply:
        if index == self.deny_index:
            return PermissionReply(False, reason=reason)
        return PermissionReply(True, mode="accept-edits" if index == 0 else "default")


class PickerScreen(ModalScreen[str | None]):
    """Pick one of `choices`; typing filters them; Esc backs out."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "cancel", show=False)]
    DEFAULT_CSS = """
    PickerScreen { align: center bottom; background: $background 40%; }
    PickerScreen > #card {
        width: 100%; height: auto; max-height: 80%; border: round $accent;
        padding: 0 1; background: $surface;
    }
    PickerScreen OptionList { height: auto; max-height: 20; border: none; }
    """

    def __init__(self, title: str, choices: Sequence[Choice]) -> None:
        super().__init__()
        self.title_text = title
        self.choices = list(choices)
        self.filter = Input(placeholder="type to filter")

    def compose(self) -> Any:
        with Vertical(id="card"):
            yield Static(Text(self.title_text, style="bold"))
            yield self.filter
            yield OptionList(*self._options(""), id="choices")

    def _options(self, needle: str) -> list[Option]:
        out = []
        for choice in self.choices:
            if needle and needle.lower() not in f"{choice.label} {choice.detail}".lower():
                continue
            label = Text(choice.label, style="dim" if choice.muted else "")
            if choice.detail:
                label.append(f"  {choice.detail}", style="dim")
            out.append(Option(label, id=choice.value))
        return out

    def on_mount(self) -> None:
        self.filter.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        options = self.query_one("#choices", OptionList)
        options.clear_options()
        options.add_options(self._options(event.value))
        options.highlighted = 0 if options.option_count else None

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        options = self.query_one("#choices", OptionList)
        if options.highlighted is not None:
            self.dismiss(options.get_option_at_index(options.highlighted).id)

    def on_key(self, event: Any) -> None:
        if getattr(event, "key", "") in ("up", "down"):
            options = self.query_one("#choices", OptionList)
            if event.key == "up":
                options.action_cursor_up()
            else:
                options.action_cursor_down()
            event.stop()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class QuitScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,enter,ctrl+c", "answer(True)", "quit", show=False),
        Binding("n,escape", "answer(False)", "stay", show=False),
    ]
    DEFAULT_CSS = """
    QuitScreen { align: center bottom; background: $background 40%; }
    QuitScreen > Static {
        width: 100%; height: auto; border: round $warning; padding: 0 1; background: $surface;
    }
    """

    def compose(self) -> Any:
        text = Text("Quit keel? ", style="bold")
        text.append("y / Enter quits · n / Esc stays", style="dim")
        yield Static(text)

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class QuestionScreen(ModalScreen["dict[str, Any] | None"]):
    """An MCP server's question (elicitation): one input per field of its schema. Enter on the
    last field sends the answers (converted to the field's type); Esc declines."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "decline", "decline", show=False)]
    DEFAULT_CSS = """
    QuestionScreen { align: center bottom; background: $background 40%; }
    QuestionScreen > #card {
        width: 100%; height: auto; max-height: 90%; border: round $accent;
        padding: 0 1; background: $surface;
    }
    QuestionScreen #title { text-style: bold; }
    QuestionScreen #hint, QuestionScreen #error { color: $text-muted; }
    """

    def __init__(self, question: QuestionRequest) -> None:
        super().__init__()
        self.question = question
        properties = question.schema.get("properties")
        self.fields: dict[str, dict[str, Any]] = (
            {k: v if isinstance(v, dict) else {} for k, v in properties.items()}
            if isinstance(properties, dict)
            else {}
        )
        required = question.schema.get("required")
        self.required = set(required) if isinstance(required, list) else set()
        self.inputs = {
            name: Input(placeholder=field_hint(name, spec, name in self.required), id=f"f-{i}")
            for i, (name, spec) in enumerate(self.fields.items())
        }
        self.error = Static("", id="error")

    def compose(self) -> Any:
        with Vertical(id="card"):
            yield Static(Text(f"MCP server {self.question.source} asks"), id="title")
            yield Static(Text(self.question.message))
            yield from self.inputs.values()
            yield self.error
            yield Static(Text("Enter: next field / send · Esc declines"), id="hint")

    def on_mount(self) -> None:
        first = next(iter(self.inputs.values()), None)
        if first is not None:
            first.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        inputs = list(self.inputs.values())
        index = inputs.index(event.input) if event.input in inputs else len(inputs) - 1
        if index + 1 < len(inputs):
            inputs[index + 1].focus()
            return
        answers, problem = form_values(self.fields, self.required, {
            name: box.value for name, box in self.inputs.items()
        })  # fmt: skip
        if problem:
            self.error.update(Text(problem, style="red"))
            return
        self.dismiss(answers)

    def action_decline(self) -> None:
        self.dismiss(None)


def field_hint(name: str, spec: dict[str, Any], required: bool) -> str:
    kind = spec.get("type", "string")
    choices = spec.get("enum")
    what = f"one of {', '.join(map(str, choices))}" if isinstance(choices, list) else str(kind)
    title = spec.get("title") or spec.get("description") or name
    return f"{title} ({what}{', required' if required else ''})"


def form_values(
    fields: dict[str, dict[str, Any]], required: set[str], typed: dict[str, str]
) -> tuple[dict[str, Any], str]:
    """The typed answers converted to each field's JSON type, or a problem to show."""
    values: dict[str, Any] = {}
    for name, spec in fields.items():
        raw = typed.get(name, "").strip()
        if not raw:
            if name in required:
                return {}, f"{name} is required"
            continue
        kind = spec.get("type", "string")
        try:
            if kind == "integer":
                values[name] = int(raw)
            elif kind == "number":
                values[name] = float(raw)
            elif kind == "boolean":
                if raw.lower() not in ("true", "false", "yes", "no", "y", "n"):
                    return {}, f"{name}: answer yes or no"
                values[name] = raw.lower() in ("true", "yes", "y")
            else:
                values[name] = raw
        except ValueError:
            return {}, f"{name} must be {'an' if kind == 'integer' else 'a'} {kind}"
    return values, ""


__all__ = [
    "INTERRUPT",
    "PermissionScreen",
    "PickerScreen",
    "PlanScreen",
    "QuestionScreen",
    "QuitScreen",
    "form_values",
]
