"""`keel -p --input-format stream-json`: a parent program drives one long-lived keel process
over real pipes: prompts in order, permission questions answered on stdin, interrupts, bad
lines answered with an `input_error` and skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.cli.streaminput import InputError, parse_line
from keel.permissions.gate import PermissionReply
from keel.session.journal import read_records
from keel.session.records import DecisionRecord
from tests.test_cli import write_script


class Driver:
    """A keel process and the lines it printed so far."""

    def __init__(self, project: Path, script: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keel",
                "-p",
                "--input-format",
                "stream-json",
                "--output-format",
                "stream-json",
                "--model",
                f"scripted:{script}",
                *extra,
            ],
            cwd=project,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []

    def send(self, obj: dict[str, Any] | str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def until(self, kind: str) -> dict[str, Any]:
        """Read lines until one of type `kind` (returned)."""
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line: dict[str, Any] = json.loads(raw)
            self.lines.append(line)
            if line["type"] == kind:
                return line
        raise AssertionError(
            f"keel exited ({self.proc.wait()}) before a {kind} line: {self.proc.stderr.read()}"  # type: ignore[union-attr]
        )

    def finish(self) -> int:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.lines += [json.loads(raw) for raw in self.proc.stdout]
        code = self.proc.wait(timeout=30)
        self.stderr = self.proc.stderr.read() if self.proc.stderr else ""
        self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()
        return code

    def types(self) -> list[str]:
        skip = {"text_delta", "thinking_delta", "tool_use_start", "tool_use_delta", "usage"}
        return [
            line["type"]
            for line in self.lines
            if line["type"] not in skip
            # this machine's sandbox status (a notice only where bubblewrap is missing)
            and not (line["type"] == "notice" and line["text"].startswith("no sandbox"))
        ]


def test_two_prompts_and_a_permission_answer(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"text": "one"},
            {
                "text": "writing",
                "tool_calls": [
                    {"name": "write", "input": {"path": "out.txt", "content": "hello\n"}}
                ],
            },
            {"text": "done"},
        ],
    )
    keel = Driver(project, script)
    keel.send({"type": "user", "message": {"role": "user", "content": "first"}})
    first = keel.until("result")
    assert (first["result"], first["stop_reason"]) == ("one", "end_turn")
    keel.send({"type": "prompt", "text": "second"})
    asked = keel.until("permission_request")
    assert asked == {
        "type": "permission_request",
        "request_id": asked["request_id"],
        "tool_use_id": asked["tool_use_id"],
        "tool": "write",
        "input": {"path": "out.txt", "content": "hello\n"},
        "reason": "change out.txt",
        "suggestion": "write",
    }
    assert not (project / "out.txt").exists()  # it waits for the answer
    keel.send({"type": "permission_response", "request_id": asked["request_id"], "allow": True})
    answered = keel.until("permission_answered")
    assert answered["allow"] is True
    assert answered["by"] == "user"
    assert answered["tool_use_id"] == asked["tool_use_id"]
    second = keel.until("result")
    assert (second["result"], second["stop_reason"]) == ("done", "end_turn")
    assert keel.finish() == 0
    assert (project / "out.txt").read_text() == "hello\n"
    assert keel.types() == [
        "turn_started",
        "request",
        "assistant",
        "result",
        "turn_started",
        "request",
        "assistant",
        "permission_request",
        "permission_answered",
        "tool_started",
        "tool_finished",
        "request",
        "assistant",
        "result",
    ]
    assert first["session_id"] == second["session_id"]  # one session, one process
    decisions = [
        r.payload
        for r in read_records(Path(second["session_path"])).records
        if isinstance(r.payload, DecisionRecord)
    ]
    assert [(d.tool, d.outcome, d.source) for d in decisions] == [("write", "allow", "user:once")]


def test_a_denied_answer_reaches_the_model_and_bad_lines_are_skipped(
    project: Path, tmp_path: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "text": "writing",
                "tool_calls": [{"name": "write", "input": {"path": "x.txt", "content": "x"}}],
            },
            {"text": "understood"},
        ],
    )
    keel = Driver(project, script)
    keel.send("this is not json")
    keel.send({"type": "prompt", "text": "go"})
    asked = keel.until("permission_request")
    keel.send({"type": "permission_response", "request_id": "perm-999", "allow": True})
    keel.send(
        {
            "type": "control_response",
            "response": {
                "subtype": "success",
                "request_id": asked["request_id"],
                "response": {"behavior": "deny", "message": "not that file"},
            },
        }
    )
    finished = keel.until("tool_finished")
    assert finished["is_error"] is True
    assert "the user denied this: not that file" in finished["output"]
    keel.until("result")
    assert keel.finish() == 0
    assert not (project / "x.txt").exists()
    errors = [line for line in keel.lines if line["type"] == "input_error"]
    assert errors == [
        {"type": "input_error", "line": 1, "error": errors[0]["error"]},
        {"type": "input_error", "line": 3, "error": "no question 'perm-999' is waiting"},
    ]
    assert errors[0]["error"].startswith("not JSON")


def test_an_interrupt_stops_the_running_prompt(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"text": "waiting", "tool_calls": [{"name": "bash", "input": {"command": "sleep 30"}}]},
            {"text": "never"},
        ],
    )
    keel = Driver(project, script, "--allowed-tools", "bash(sleep *)")
    keel.send({"type": "prompt", "text": "wait"})
    keel.until("tool_started")
    keel.send({"type": "control_request", "request_id": "r1", "request": {"subtype": "interrupt"}})
    result = keel.until("result")
    assert result["stop_reason"] == "interrupted"
    from keel.cli.headless import EXIT_CODES

    assert keel.finish() == EXIT_CODES["interrupted"]


def test_input_that_ends_while_a_question_waits_refuses_it(project: Path, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "text": "writing",
                "tool_calls": [{"name": "write", "input": {"path": "x.txt", "content": "x"}}],
            },
            {"text": "understood"},
        ],
    )
    keel = Driver(project, script)
    keel.send({"type": "prompt", "text": "go"})
    keel.until("permission_request")
    assert keel.finish() == 0  # stdin closed: nobody can answer any more
    finished = next(line for line in keel.lines if line["type"] == "tool_finished")
    assert finished["is_error"] is True
    assert "the input ended before an answer" in finished["output"]
    assert [line["result"] for line in keel.lines if line["type"] == "result"] == ["understood"]
    assert not (project / "x.txt").exists()


def test_needs_stream_json_output(project: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "keel", "-p", "--input-format", "stream-json"],
        cwd=project,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2  # a usage error
    assert out.stderr == (
        "keel: error: --input-format stream-json needs --output-format stream-json (hint: the "
        "questions it answers arrive as stream-json lines on stdout)\n"
    )


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ('{"type": "prompt", "text": "hi"}', ("prompt", "hi")),
        (
            '{"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}}',
            ("prompt", "a\nb"),
        ),
        (
            '{"type": "permission_response", "request_id": "perm-1", "allow": false, "reason": "no"}',
            ("answer", "perm-1", PermissionReply(False, "once", "no")),
        ),
        (
            '{"type": "permission_response", "request_id": "perm-2", "allow": true, "scope": "always"}',
            ("answer", "perm-2", PermissionReply(True, "always", "")),
        ),
        (
            '{"type": "question_response", "request_id": "question-3", "values": {"name": "x"}}',
            ("answer", "question-3", {"name": "x"}),
        ),
        ('{"type": "question_response", "request_id": "q", "values": null}', ("answer", "q", None)),
        ('{"type": "interrupt"}', ("interrupt",)),
    ],
)
def test_parse_line(line: str, command: tuple[object, ...]) -> None:
    assert parse_line(line) == command


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("[1]", "not a JSON object"),
        ('{"type": "nope"}', "unknown type 'nope'"),
        ('{"type": "prompt", "text": "  "}', "the prompt is empty"),
        (
            '{"type": "permission_response", "request_id": "p"}',
            '"permission_response" needs "allow": true or false',
        ),
        ('{"type": "permission_response", "allow": true}', '"request_id" is missing'),
        (
            '{"type": "permission_response", "request_id": "p", "allow": true, "scope": "forever"}',
            '"scope" is one of once, session, always',
        ),
        (
            '{"type": "control_request", "request": {"subtype": "initialize"}}',
            "the only control_request keel takes is interrupt",
        ),
    ],
)
def test_parse_line_errors(line: str, error: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_line(line)
    assert str(caught.value) == error
