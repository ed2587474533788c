"""Issue 26, "the first hour", items 1 and 3, through the real CLI, the TUI's controller and a
real `keel serve`.

1. A project with a memory note: a fork, a `/rewind` or a load went on only with `--force`
   ("system prompt: changed …") though nothing had changed. The memory index is not part of what
   a resume compares, a fork goes on with the index (and date) its first ancestor started with,
   and a refused resume names exactly what changed. The TUI's `/rewind` asks and forces on a yes;
   the HTTP load and fork routes take `force`.
3. `keel -p` stopped at 200,000 tokens (cache reads count): the default now lets a 100-turn task
   at a 30k-token context finish and still stops a runaway, naming the flag; a resume with a
   higher budget goes on; a replay is not "diverged" because keel's default is not the session's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from keel import __version__
from keel.agent.limits import DEFAULT_UNATTENDED_TOKENS
from keel.agent.prompt import context_text
from keel.app import Options, resume_agent
from keel.llm.events import Notice
from keel.session.fold import fold
from keel.session.journal import read_records
from keel.session.records import Fingerprint, Meta, Record, UserRecord
from keel.session.resume import NOT_COMPARED, check_resume, config_diff
from keel.testing import ScriptedProvider, reply
from keel.testing.anthropic_server import AnthropicServer
from tests.helpers import context_of, unsandboxed_line_dropped
from tests.server_helpers import MODEL, Servers
from tests.test_cli import keel, session_files, write_script
from tests.test_server import (  # noqa: F401 (fixtures)
    anthropic,
    create,
    run,
    servers,
)
from tests.tui_helpers import Recorder, make_controller

HINT = "(hint: resume with the same model and settings, or pass --force to accept the change)"
NOTE: dict[str, Any] = {
    "action": "save",
    "name": "test-commands",
    "description": "how to run the tests",
    "body": "pytest -q",
}
SAVE_NOTE = {"name": "memory", "input": NOTE}


def prompt_seq(path: Path, text: str) -> int:
    return next(
        r.seq
        for r in read_records(path).records
        if isinstance(r.payload, UserRecord)
        and r.payload.source == "prompt"
        and r.payload.message.text == text
    )


def meta_of(path: Path) -> Meta:
    meta = read_records(path).records[0].payload
    assert isinstance(meta, Meta)
    return meta


def session_after_a_note(project: Path, tmp_path: Path, home: Path) -> tuple[str, str, Path]:
    """A note saved by the model in one session, then a second session of two prompts that
    started with the note in its index: (the second session's id, its model, its file)."""
    note = write_script(tmp_path / "note.json", [{"tool_calls": [SAVE_NOTE]}, {"text": "Saved."}])
    out = keel("-p", "remember how to test", "--model", f"scripted:{note}", cwd=project)
    assert (out.returncode, out.stdout) == (0, "Saved.\n"), out.stderr
    talk = write_script(tmp_path / "talk.json", [{"text": "One."}, {"text": "Two."}])
    model = f"scripted:{talk}"
    out = keel("-p", "first", "--model", model, "--output-format", "json", cwd=project)
    assert out.returncode == 0, out.stderr
    sid = json.loads(out.stdout)["session_id"]
    out = keel("-p", "--resume", sid, "second", "--model", model, cwd=project)
    assert (out.returncode, out.stdout) == (0, "Two.\n"), out.stderr
    (path,) = [p for p in session_files(home) if p.stem == sid]
    return sid, model, path


# -- 1. forks and loads after a memory note ----------------------------------------------------


async def test_a_fork_of_a_session_started_after_a_memory_note_resumes_without_force(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    sid, model, path = session_after_a_note(project, tmp_path, isolated_env)
    parent = meta_of(path).fingerprint
    assert parent is not None
    assert "<memory-index> section" in dict(parent.system_parts)
    out = keel("fork", sid, "--at", str(prompt_seq(path, "second")), cwd=project)
    assert out.returncode == 0, out.stderr
    fork = out.stdout.splitlines()[0]
    out = keel("-p", "--resume", fork, "second, differently", "--model", model, cwd=project)
    assert (out.returncode, out.stdout) == (0, "Two.\n"), out.stderr
    assert "configuration" not in out.stderr
    # The fork rebuilds the very prompt its parent started with (its memory index, its date):
    # byte for byte, so the provider's prompt cache still holds.
    (fork_path,) = [p for p in session_files(isolated_env) if p.stem == fork]
    opened = await resume_agent(fork_path, Options(cwd=project))
    try:
        assert opened.agent.fingerprint().system_hash == parent.system_hash
        assert opened.agent.fingerprint().system_parts == parent.system_parts
        assert "- test-commands [project]: how to run the tests" in opened.agent.context
    finally:
        await opened.agent.aclose()


def test_a_lost_memory_snapshot_or_a_newer_note_does_not_refuse_a_resume(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    sid, model, path = session_after_a_note(project, tmp_path, isolated_env)
    out = keel("fork", sid, "--at", str(prompt_seq(path, "second")), cwd=project)
    fork = out.stdout.splitlines()[0]
    # The index kept beside the notes is gone, and another note was saved since: the fork goes
    # on with no index, as the memory index is not compared.
    for kept in (isolated_env / "memory" / "_index").iterdir():
        kept.unlink()
    lint = {"name": "memory", "input": {**NOTE, "name": "lint"}}
    note = write_script(tmp_path / "lint.json", [{"tool_calls": [lint]}, {"text": "Saved."}])
    out = keel("-p", "remember the lint command", "--model", f"scripted:{note}", cwd=project)
    assert out.returncode == 0, out.stderr
    out = keel("-p", "--resume", fork, "again", "--model", model, cwd=project)
    assert (out.returncode, out.stdout, unsandboxed_line_dropped(out.stderr)) == (0, "Two.\n", "")


def test_a_refused_resume_names_the_instruction_file_that_changed(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    sid, model, _path = session_after_a_note(project, tmp_path, isolated_env)
    (project / "AGENTS.md").write_text("Indent with tabs.\n", encoding="utf-8")
    out = keel("-p", "--resume", sid, "third", "--model", model, cwd=project)
    assert out.returncode == 2
    assert unsandboxed_line_dropped(out.stderr) == (
        f"keel: error: session {sid} was made with a different configuration: system prompt: "
        f"instruction file {project.resolve() / 'AGENTS.md'} added {HINT[:-1]} (the "
        "conversation keeps the instructions it was sent; changed ones reach the model at its "
        "next compaction or /clear))\n"
    )


def test_each_change_is_named_and_what_does_not_decide_is_not_compared() -> None:
    stored = Fingerprint(
        "anthropic",
        "claude-sonnet-4-5",
        "s1",
        "t1",
        200,
        10_000_000,
        system_parts=(
            ("keel's base prompt", "a"),
            ("working directory", "b"),
            ("platform", "c"),
            ("date", "d"),
            ("instruction file /p/AGENTS.md", "e"),
            ("<memory-index> section", "f"),
        ),
        tool_hashes=(("read", "r"), ("task", "t"), ("knowledge_search", "k")),
    )
    current = Fingerprint(
        "anthropic",
        "claude-sonnet-4-5",
        "s2",
        "t2",
        200,
        20_000_000,
        system_parts=(
            ("keel's base prompt", "A"),
            ("working directory", "B"),
            ("platform", "C"),
            ("date", "D"),
            ("<skills> section", "S"),
        ),
        tool_hashes=(("read", "r"), ("task", "T"), ("skill", "s")),
    )
    assert config_diff(stored, current, keel_version="0.0.9") == [
        f"system prompt: keel's base prompt changed (keel 0.0.9 -> {__version__})",
        "system prompt: working directory changed",
        "system prompt: instruction file /p/AGENTS.md removed",
        "system prompt: <skills> section added",
        "tool: task changed",
        "tool: knowledge_search removed",
        "tool: skill added",
    ]
    # The memory index, the platform and the date alone, and a limit given: no refusal.
    quiet = replace(
        current,
        system_parts=tuple(
            (name, value.upper() if name in NOT_COMPARED else value)
            for name, value in stored.system_parts
        ),
        tool_hashes=stored.tool_hashes,
    )
    state = fold([Record(1, "2026-12-01T00:00:00.000Z", Meta("s", "/p", "m", stored))])
    assert check_resume(state, quiet, force=False) == ["max_tokens: 10000000 -> 20000000"]


async def test_rewind_asks_when_the_configuration_changed_and_forces_on_a_yes(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    provider = ScriptedProvider([reply("A."), reply("B."), reply("B again.")], model="m")
    recorder = Recorder()
    controller = await make_controller(project, provider)
    controller.attach(recorder)
    for prompt in ("first", "second"):
        controller.submit(prompt)
        await controller.wait()
    before = controller.agent.session_id
    opening = [block.text for block in controller.agent.messages[0].blocks]  # type: ignore[union-attr]
    assert opening == [context_text(controller.agent.context), "first"]
    (project / "AGENTS.md").write_text("Indent with tabs.\n", encoding="utf-8")
    agents = project.resolve() / "AGENTS.md"
    asked = (
        "The configuration changed since this session began: system prompt: instruction file "
        f"{agents} added"
    )
    # Cancel: nothing switches, and the user is told where the fork is.
    session = controller.agent.session
    assert session is not None
    seq = str(prompt_seq(session.path, "second"))
    recorder.picks.append("cancel")
    controller.submit(f"/rewind {seq}")
    await controller.wait()
    title, choices = recorder.offered[-1]
    assert title == asked
    assert [(c.value, c.label) for c in choices] == [
        ("force", "Go on anyway"),
        ("cancel", "Cancel"),
    ]
    assert controller.agent.session_id == before
    said = [e.text for e in recorder.events if isinstance(e, Notice)]
    assert said[-1].startswith("not rewound; the fork ")
    assert said[-1].endswith('--force "…" continues it)')
    # Yes: the fork goes on as `--force` would, each change a warning.
    recorder.picks.append("force")
    controller.submit(f"/rewind {seq}")
    await controller.wait()
    assert controller.agent.session_id != before
    assert recorder.inputs == ["second"]
    # The fork's transcript opens with the context its parent started with (no AGENTS.md).
    assert [[b.text for b in m.blocks] for m in controller.agent.messages] == [  # type: ignore[union-attr]
        opening,
        ["A."],
    ]
    warned = [e.text for e in recorder.events if isinstance(e, Notice) and e.level == "warning"]
    assert (
        f"rewound despite a changed configuration: system prompt: instruction file {agents} added"
        in warned
    )
    await controller.close()


def test_the_http_load_and_fork_routes_take_force(
    servers: Servers,  # noqa: F811
    anthropic: AnthropicServer,  # noqa: F811
    project: Path,
) -> None:
    anthropic.add(
        reply("", ("memory", NOTE)),
        reply("Saved."),
        reply("One."),
        reply("Two."),
        reply("Two, again."),
    )
    served = servers.start()
    with served.client() as c:
        noted = create(c)["id"]
        assert run(c, noted, "remember how to test")["result"] == "Saved."
        sid = create(c)["id"]  # its index lists the note
        assert run(c, sid, "first")["result"] == "One."
        assert run(c, sid, "second")["result"] == "Two."
        first_system = anthropic.model_requests[-2].json["system"]
        first_context = context_of(anthropic.model_requests[-2].json)
        assert "- test-commands [project]: how to run the tests" in first_context
        seq = prompt_seq(Path(c.get(f"/v1/sessions/{sid}").json()["path"]), "second")
        # A fork loaded at once: no force needed, and the same system prompt, byte for byte.
        fork = c.post(f"/v1/sessions/{sid}/fork", json={"at": seq, "load": True})
        assert fork.status_code == 201, fork.text
        body = fork.json()
        assert (body["parent"], body["prompt"], body["loaded"]) == (sid, "second", True)
        assert body["session"]["id"] == body["id"]
        assert run(c, body["id"], "second, differently")["result"] == "Two, again."
        assert anthropic.model_requests[-1].json["system"] == first_system
        assert context_of(anthropic.model_requests[-1].json) == first_context
        # A change: named, refused (409) without force, loaded with it.
        (project / "AGENTS.md").write_text("Indent with tabs.\n", encoding="utf-8")
        agents = project.resolve() / "AGENTS.md"
        refused = c.post(f"/v1/sessions/{sid}/fork", json={"at": seq, "load": True})
        assert refused.status_code == 409, refused.text
        kept = _newest_fork(c, sid, body["id"])
        assert refused.json() == {
            "error": f"session {kept} was made with a different configuration: system prompt: "
            f"instruction file {agents} added",
            "hint": 'load it with "force": true to go on with the configuration as it is now',
        }
        again = c.post("/v1/sessions", json={"resume": kept})
        assert (again.status_code, again.json()["error"]) == (409, refused.json()["error"])
        loaded = c.post("/v1/sessions", json={"resume": kept, "force": True})
        assert loaded.status_code == 201, loaded.text
        assert loaded.json()["id"] == kept
        forced = c.post(f"/v1/sessions/{sid}/fork", json={"at": seq, "load": True, "force": True})
        assert (forced.status_code, forced.json()["loaded"]) == (201, True)
        lone = c.post(f"/v1/sessions/{sid}/fork", json={"force": True})
        assert (lone.status_code, lone.json()) == (
            400,
            {"error": "force applies to loading the fork", "hint": 'give it with "load": true'},
        )
        fresh = c.post("/v1/sessions", json={"model": MODEL, "force": True})
        assert (fresh.status_code, fresh.json()["error"]) == (
            400,
            "force applies to loading a session",
        )


def _newest_fork(c: httpx.Client, parent: str, other: str) -> str:
    """The fork of `parent` that is not `other` nor loaded: the one a refused load left."""
    listed = c.get("/v1/sessions").json()["sessions"]
    (found,) = [
        s["id"] for s in listed if s["parent"] == parent and s["id"] != other and not s["loaded"]
    ]
    return str(found)


# -- 3. the unattended token budget ------------------------------------------------------------


def files_and_script(
    project: Path, tmp_path: Path, turns: int, usage: dict[str, int], final: str
) -> str:
    """`turns` tool rounds, each reading a file of its own (so no round repeats), each reporting
    `usage`, then `final`."""
    steps: list[dict[str, object]] = []
    for i in range(turns):
        (project / f"f{i:03}.txt").write_text(f"{i}\n", encoding="utf-8")
        steps.append(
            {"tool_calls": [{"name": "read", "input": {"path": f"f{i:03}.txt"}}], "usage": usage}
        )
    steps.append({"text": final, "usage": usage})
    return f"scripted:{write_script(tmp_path / 'work.json', steps)}"


#: A turn at a 30,000-token context, as a real model reports it: mostly cache reads.
AT_30K = {"input": 1_500, "cache_read": 28_000, "cache_write": 500, "output": 300}


def test_a_100_turn_task_at_a_30k_context_finishes_under_the_default_budget(
    project: Path, tmp_path: Path
) -> None:
    model = files_and_script(project, tmp_path, 100, AT_30K, "All read.")
    out = keel("-p", "read them all", "--model", model, "--output-format", "json", cwd=project)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["stop_reason"], result["result"], result["turns"]) == (
        "end_turn",
        "All read.",
        101,
    )
    used = sum(result["usage"].values())
    assert used == 101 * 30_300 > 3_000_000
    assert "budget" not in out.stderr


def test_a_runaway_stops_at_the_default_budget_naming_the_flag(
    project: Path, tmp_path: Path
) -> None:
    # Ten times the task above: 300 turns at a 100,000-token context.
    at_100k = {"input": 5_000, "cache_read": 95_000, "output": 300}
    model = files_and_script(project, tmp_path, 300, at_100k, "unreached")
    out = keel(
        "-p", "loop", "--model", model, "--max-turns", "1000", "--output-format", "json",
        cwd=project, timeout=180,
    )  # fmt: skip
    assert out.returncode == 3, out.stderr
    result = json.loads(out.stdout)
    sid = result["session_id"]
    # After 99 turns (9,929,700 tokens) the 100th would reread the 100k context: not sent.
    assert (result["stop_reason"], result["turns"]) == ("budget", 99)
    lines = unsandboxed_line_dropped(out.stderr).splitlines()
    assert lines[-2].startswith(
        "keel: warning: budget: 70,300 tokens left of the 10,000,000-token budget; the next "
        "request needs ~10"
    )
    assert lines[-1:] == [
        "keel: the session stopped at its budget; raise it with --max-tokens-budget N (or "
        "budget.tokens in settings; 0 for none), and continue this session with: keel resume "
        f"{sid} --max-tokens-budget 20000000",
    ]
    warned = "keel: warning: 80% of the token budget used (8,024,000 tokens of 10,000,000 tokens)"
    assert warned in lines
    assert DEFAULT_UNATTENDED_TOKENS == 10_000_000


def test_a_resume_with_a_higher_budget_goes_on(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    model = files_and_script(project, tmp_path, 3, {"input": 60_000, "output": 0}, "Finished.")
    out = keel("-p", "go", "--model", model, "--max-tokens-budget", "100000", cwd=project)
    assert out.returncode == 3, out.stderr
    (path,) = session_files(isolated_env)
    sid = path.stem
    lines = unsandboxed_line_dropped(out.stderr).splitlines()
    # The second request would reread the 60k context with 40k left: it is not sent.
    assert lines[-3].startswith(
        "keel: warning: budget: 40,000 tokens left of the 100,000-token budget; the next "
        "request needs ~61,"
    )
    assert lines[-2:] == [
        "keel: stopped: budget",
        "keel: the session stopped at its budget; raise it with --max-tokens-budget N (or "
        "budget.tokens in settings; 0 for none), and continue this session with: keel resume "
        f"{sid} --max-tokens-budget 200000",
    ]
    # Three more requests at 60k each: 240k in all.
    out = keel("resume", sid, "--model", model, "--max-tokens-budget", "300000", cwd=project)
    assert (out.returncode, out.stdout) == (0, "Finished.\n"), out.stderr
    assert unsandboxed_line_dropped(out.stderr).splitlines()[0] == (
        "keel: resuming with max_tokens: 100000 -> 300000 (as given)"
    )
    terminal = read_records(path).records[-1].payload
    assert getattr(terminal, "reason", None) == "completed"


@pytest.mark.parametrize("recorded", [None, 200_000], ids=["no budget", "the old default"])
def test_replay_of_an_unchanged_session_is_identical_whatever_the_default(
    project: Path, tmp_path: Path, isolated_env: Path, recorded: int | None
) -> None:
    talk = write_script(tmp_path / "talk.json", [{"text": "Hello."}])
    out = keel("-p", "hi", "--model", f"scripted:{talk}", cwd=project)
    assert out.returncode == 0, out.stderr
    (path,) = session_files(isolated_env)
    # As an interactive session (no token budget) or one of an older keel records it.
    lines = path.read_bytes().splitlines(keepends=True)
    meta = json.loads(lines[0])
    meta["fingerprint"]["max_tokens"] = recorded
    path.write_bytes(json.dumps(meta).encode() + b"\n" + b"".join(lines[1:]))
    out = keel("replay", path.stem, "--json", cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert (report["result"], report["settings"], report["notes"]) == ("identical", [], [])
