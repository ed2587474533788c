"""Resume never deletes data, and processes do not outlive their run (issue 12).

Attacks, each through the real CLI where it matters:
- a complete last line keel cannot read (a newer format, an unknown record type, garbage) used
  to be cut by any `keel resume`, even one that then failed: now every command that reads the
  file stops with one line naming the file, the line and the format, and the file is untouched;
- a resume failing for a missing API key must leave even a torn tail in place (byte-identical);
  a resume that goes on cuts only the unterminated tail and keeps its bytes beside the file;
- a kill between the final answer and its terminal record left the session `crashed`; it reads,
  resumes and forks as completed;
- without the sandbox, a SIGKILLed keel's command kept running while the resumed run started it
  again: the journal records each process group (pgid + start time) and a resume kills what a
  dead run left before anything runs again, never touching a recycled pid.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keel import __version__
from keel.llm.messages import Message, Text, ToolUse, Usage, tool_result, user
from keel.session.fold import fold
from keel.session.journal import read_records
from keel.session.records import (
    FORMAT,
    AssistantRecord,
    Meta,
    ProcessRecord,
    Record,
    TerminalRecord,
    ToolResultRecord,
    UserRecord,
)
from keel.session.resume import boot_id, reap, start_time
from tests.test_cli import keel, session_files, write_script

RUNNER = Path(__file__).with_name("crash_runner.py")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def crash_keel(
    *args: str, cwd: Path, crash: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """keel's real CLI with a planted SIGKILL (tests/crash_runner.py)."""
    return subprocess.run(
        [sys.executable, str(RUNNER), *args],
        cwd=cwd,
        env={**os.environ, "KEEL_CRASH": crash, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def completed_session(project: Path, tmp_path: Path, home: Path) -> Path:
    script = write_script(
        tmp_path / "s.json", [{"text": "First answer."}, {"text": "Second answer."}]
    )
    out = keel("-p", "go", "--model", f"scripted:{script}", cwd=project)
    assert out.returncode == 0, out.stderr
    (path,) = session_files(home)
    return path


# -- a complete line that cannot be read is never deleted ---------------------------------------

UNREADABLE = {
    "newer format": (
        b'{"v":9,"seq":4,"type":"assistant","ts":"2027-01-01T00:00:00.000Z","x":1}\n',
        f"record format 9 is newer than this keel reads (keel {__version__} reads formats up "
        f"to {FORMAT}); a newer keel wrote it",
        "upgrade keel to read this session; the file was left untouched",
    ),
    "unknown type": (
        b'{"v":1,"seq":4,"type":"bookmark","ts":"2027-01-01T00:00:00.000Z"}\n',
        f"unknown record type 'bookmark' in a format-1 record (keel {__version__} reads "
        f"formats up to {FORMAT}; a newer keel may have written it)",
        "the file was left untouched; inspect it (keel sessions show ID --json), or fork from "
        "an earlier prompt (keel fork ID --at SEQ)",
    ),
    "garbage": (
        b"\x00\x00 not a record \x00\n",
        "not JSON: ",
        "the file was left untouched; inspect it (keel sessions show ID --json), or fork from "
        "an earlier prompt (keel fork ID --at SEQ)",
    ),
}


@pytest.mark.parametrize("kind", sorted(UNREADABLE))
def test_a_complete_unreadable_last_line_stops_every_reader_and_is_kept(
    kind: str, project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    path = completed_session(project, tmp_path, isolated_env)
    line, why, hint = UNREADABLE[kind]
    lines = path.read_bytes().count(b"\n")
    with path.open("ab") as f:
        f.write(line)
    before = sha(path)
    sid = path.stem
    for args in (
        ("resume", sid),
        ("resume", sid, "and then?"),
        ("-p", "--resume", sid, "and then?"),
        ("sessions", "show", sid),
        ("fork", sid),
        ("compact", sid),
    ):
        out = keel(*args, cwd=project)
        assert out.returncode == 2, (args, out)
        assert out.stdout == ""
        (message,) = out.stderr.splitlines()  # one line, no traceback
        assert message.startswith(
            f"keel: error: {path}: line {lines + 1} is not a valid record ({why}"
        ), (args, message)
        assert message.endswith(f"(hint: {hint})"), (args, message)
        assert sha(path) == before, args  # not one byte written
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, f"{sid}.jsonl.lock"]


def test_a_resume_failing_for_a_missing_key_leaves_the_file_byte_identical(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    path = completed_session(project, tmp_path, isolated_env)
    with path.open("ab") as f:
        f.write(b'{"v":1,"seq":4,"type":"us')  # a torn tail: cut only once resuming goes on
    before = sha(path)
    out = keel(
        "resume", path.stem, "again", "--model", "anthropic/claude-sonnet-4-5", "--force",
        cwd=project,
    )  # fmt: skip
    assert out.returncode == 2
    assert "ANTHROPIC_API_KEY is not set" in out.stderr
    assert sha(path) == before
    assert not list(path.parent.glob("*.torn-*"))


def test_a_torn_tail_is_cut_after_the_checks_and_its_bytes_kept_beside(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    path = completed_session(project, tmp_path, isolated_env)
    fragment = b'{"v":1,"seq":4,"type":"user","ts":"2026-'
    whole = path.read_bytes()
    path.write_bytes(whole + fragment)
    out = keel("resume", path.stem, "again", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Second answer.\n"
    (saved,) = path.parent.glob(f"{path.name}.torn-*")
    assert saved.read_bytes() == fragment
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
    assert (
        f"keel: cut {len(fragment)} bytes of a torn last record (a crash mid-write); they are "
        f"kept in {saved}\n"
    ) in out.stderr
    assert path.read_bytes().startswith(whole)  # nothing before the tail changed
    records = read_records(path, allow_torn_tail=False).records
    assert [r.seq for r in records] == list(range(1, len(records) + 1))


# -- killed between the final answer and its terminal record -----------------------------------


def test_fold_takes_a_final_answer_without_terminal_record_as_completed() -> None:
    meta = Meta("s", "/p", "scripted:x")

    def state(*payloads: object) -> tuple[str, bool]:
        recs = [Record(i, "t", p) for i, p in enumerate((meta, *payloads), start=1)]  # type: ignore[arg-type]
        s = fold(recs)
        return s.status, s.recovered

    answer = Message("assistant", (Text("Done."),))
    calls = Message("assistant", (ToolUse("a", "bash", {"command": "true"}),))
    u = Usage(1, 1)
    assert state(UserRecord(user("go")), AssistantRecord(answer, u, 0.0, "end_turn", 1)) == (
        "completed",
        True,
    )
    assert state(UserRecord(user("go")), AssistantRecord(answer, u, 0.0, "max_tokens", 1)) == (
        "max_tokens",
        True,
    )
    # Not a final answer: the turn was paused, calls tools, or a later record moved on.
    assert state(UserRecord(user("go")), AssistantRecord(answer, u, 0.0, "pause_turn", 1)) == (
        "open",
        False,
    )
    assert state(UserRecord(user("go")), AssistantRecord(calls, u, 0.0, "tool_use", 1)) == (
        "open",
        False,
    )
    assert state(
        UserRecord(user("go")),
        AssistantRecord(answer, u, 0.0, "end_turn", 1),
        UserRecord(user("<task-notification/>"), "task_notification"),
    ) == ("open", False)
    # A real terminal record is kept as written.
    assert state(
        UserRecord(user("go")),
        AssistantRecord(answer, u, 0.0, "end_turn", 1),
        TerminalRecord("completed", turns=1),
    ) == ("completed", False)


@pytest.mark.needs("sandbox")  # its bash runs unasked only in the sandbox
def test_a_kill_after_the_final_answer_resumes_as_completed(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": "echo ran >> log"}}]},
            {"text": "First answer."},
            {"text": "Second answer."},
        ],
    )
    model = f"scripted:{script}"
    # The reference: the same run, not killed.
    count = tmp_path / "count.json"
    ref = crash_keel(
        "-p", "go", "--model", model, cwd=project, env={"KEEL_CRASH_COUNT": str(count)}
    )
    assert ref.returncode == 0, ref.stderr
    appends = json.loads(count.read_text(encoding="utf-8"))["append"]
    (ref_path,) = session_files(isolated_env)
    ref_path.rename(tmp_path / "reference.jsonl")
    # Killed right after the final answer is durable, before the terminal record.
    out = crash_keel("-p", "go", "--model", model, cwd=project, crash=f"append-after:{appends - 1}")
    assert out.returncode == -signal.SIGKILL
    (path,) = session_files(isolated_env)
    last = read_records(path).records[-1].payload
    assert isinstance(last, AssistantRecord)
    assert last.message.text == "First answer."
    (tmp_path / "reference.jsonl").rename(ref_path)

    listing = keel("sessions", "list", "--json", cwd=project)
    statuses = {e["id"]: e["status"] for e in map(json.loads, listing.stdout.splitlines())}
    assert statuses == {path.stem: "completed", ref_path.stem: "completed"}
    for p in (path, ref_path):  # the killed one behaves exactly as the completed one
        again = keel("resume", p.stem, cwd=project)
        assert (again.returncode, again.stdout, again.stderr) == (
            2,
            "",
            f"keel: error: session {p.stem} has nothing left to resume: its last turn completed "
            f'(hint: continue it with a prompt: keel -p --resume {p.stem} "…")\n',
        )
        forked = keel("fork", p.stem, cwd=project)
        assert forked.returncode == 0, forked.stderr
        more = keel("resume", p.stem, "and then?", cwd=project)
        assert (more.returncode, more.stdout) == (0, "Second answer.\n"), more.stderr
    assert (project / "log").read_text(encoding="utf-8") == "ran\nran\n"  # once per session


# -- processes do not outlive their run ----------------------------------------------------------

#: Each run of the command notes its start, then ticks every 0.1 s for 3 s. It ignores SIGTERM,
#: so only a SIGKILL (or the deadline) stops it. Works inside the sandbox too (no pids needed).
MARKED = (
    "trap '' TERM; tag=$RANDOM$RANDOM; echo start $tag >> marks; "
    "for i in $(seq 30); do echo tick $tag >> marks; sleep 0.1; done; echo end $tag >> marks"
)


def overlaps(marks: list[str]) -> list[str]:
    """Lines an earlier run wrote after a later one started."""
    started: list[str] = []
    bad = []
    for line in marks:
        kind, tag = line.split()
        if kind == "start":
            started.append(tag)
        elif tag != started[-1]:
            bad.append(line)
    return bad


def sandbox_works() -> bool:
    from keel.permissions.sandbox import probe

    return probe().ok


@pytest.mark.parametrize("sandboxed", [False, True], ids=["unsandboxed", "sandboxed"])
def test_a_resume_kills_what_the_killed_run_left_before_running_it_again(
    sandboxed: bool, project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    if sandboxed and not sandbox_works():
        pytest.skip("no working sandbox (bubblewrap) here")
    env = {} if sandboxed else {"KEEL_NO_SANDBOX": "1"}
    script = write_script(
        tmp_path / "s.json",
        [{"tool_calls": [{"name": "bash", "input": {"command": MARKED}}]}, {"text": "Done."}],
    )
    mode = ("--mode", "bypass")
    out = crash_keel(
        "-p", "go", "--model", f"scripted:{script}", *mode, cwd=project, crash="spawn:1:0.5",
        env=env,
    )  # fmt: skip
    assert out.returncode == -signal.SIGKILL, out.stderr
    (path,) = session_files(isolated_env)
    (process,) = [
        r.payload for r in read_records(path).records if isinstance(r.payload, ProcessRecord)
    ]
    assert (process.tool_use_id, process.boot_id) == ("toolu_scripted_000001", boot_id())
    # With the sandbox this also proves the placeholders of missing protected paths a killed
    # run left are gone before the resume reads the project (else its fingerprint changes).
    out = crash_keel("resume", path.stem, *mode, cwd=project, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Done.\n"
    marks = (project / "marks").read_text(encoding="utf-8").splitlines()
    assert overlaps(marks) == []  # the first run was dead before the re-run started
    first, second = (m.split()[1] for m in marks if m.startswith("start"))
    assert [m.split()[0] for m in marks if m.endswith(second)][-1] == "end"
    assert not any(m == f"end {first}" for m in marks)
    # Who stops the first run's command is a race: its supervisor (keel._reaper, once it sees keel
    # die and the grace for SIGTERM passes) or the resume (its reap, said on stderr), whichever
    # comes first; a loaded machine starts the resume later. The outcome is asserted above: it
    # ended, unfinished, before the re-run started; the test_reap_* tests below cover the reap.
    assert start_time(process.pgid) != process.start_time  # the first run's group is gone


def test_process_records_are_written_as_the_command_starts(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "input": {"command": "echo $PPID > parent"}}]},
            {"text": "Done."},
        ],
    )
    out = keel(
        "-p", "go", "--model", f"scripted:{script}", "--mode", "bypass", cwd=project,
        env={"KEEL_NO_SANDBOX": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (path,) = session_files(isolated_env)
    types = [r.payload.type for r in read_records(path).records]
    assert types == ["meta", "user", "assistant", "process", "tool_result", "assistant", "terminal"]
    line = path.read_bytes().split(b"\n")[3]
    assert json.loads(line)["v"] == 2  # a format-1 reader stops at it with "newer format"


# -- reap: by start time, never by name -----------------------------------------------------------


def spawn_group(command: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["bash", "-c", command], start_new_session=True)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return b") Z" not in f.read()
    except FileNotFoundError:
        return False


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            if int(data[data.rfind(b")") + 2 :].split()[1]) == pid:
                out.append(int(entry))
    return out


def wait_until(predicate: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_reap_kills_a_live_group_and_its_descendants() -> None:
    proc = spawn_group("sleep 30 & setsid sleep 31 & wait")
    try:
        wait_until(lambda: len(children_of(proc.pid)) == 2)
        kids = children_of(proc.pid)
        started = start_time(proc.pid)
        assert started is not None
        reaped = reap([ProcessRecord("call1", proc.pid, started, boot_id())])
        assert [(r.tool_use_id, r.pgid, r.pids) for r in reaped] == [
            ("call1", proc.pid, tuple(sorted([proc.pid, *kids])))
        ]
        proc.wait(5)
        assert proc.returncode == -signal.SIGKILL
        wait_until(lambda: not any(alive(k) for k in kids))  # the setsid one too
    finally:
        proc.kill()
        proc.wait()


def test_reap_never_touches_a_recycled_pid_or_another_boot() -> None:
    proc = spawn_group("sleep 30")
    try:
        started = start_time(proc.pid)
        assert started is not None
        # Same pid, another start time: the pid was recycled; the process is someone else's.
        assert reap([ProcessRecord("c", proc.pid, started - 1, boot_id())], wait=0.2) == []
        # Same pid and start time, but from another boot: nothing of that boot runs now.
        assert reap([ProcessRecord("c", proc.pid, started, "another-boot")], wait=0.2) == []
        assert alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_reap_kills_what_outlived_its_group_leader() -> None:
    proc = spawn_group("sleep 30 & exit 0")
    proc.wait(5)  # the leader is gone; its background sleep is still in its group
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = Path(f"/proc/{entry}/stat").read_bytes()
            except FileNotFoundError:
                continue
            fields = data[data.rfind(b")") + 2 :].split()
            if int(fields[2]) == proc.pid and fields[0] != b"Z":
                members.append(int(entry))
    (member,) = members  # the background sleep, still in the dead leader's group
    member_start = start_time(member)
    assert member_start is not None
    reaped = reap([ProcessRecord("c", proc.pid, member_start - 1, boot_id())])
    assert [(r.pgid, r.pids) for r in reaped] == [(proc.pid, (member,))]
    wait_until(lambda: not alive(member))


def test_old_process_records_from_a_clean_run_are_not_reaped() -> None:
    """Groups recorded before a terminal record belong to a run that ended and stopped them."""
    meta = Meta("s", "/p", "scripted:x")
    payloads = [
        meta,
        UserRecord(user("go")),
        AssistantRecord(
            Message("assistant", (ToolUse("a", "bash", {"command": "x"}),)), Usage(), 0, "", 1
        ),
        ProcessRecord("a", 4242, 1, "b"),
        ToolResultRecord(tool_result("a", "ok")),
        AssistantRecord(Message("assistant", (Text("ok"),)), Usage(), 0, "end_turn", 2),
        TerminalRecord("completed"),
        UserRecord(user("more")),
        AssistantRecord(
            Message("assistant", (ToolUse("b", "bash", {"command": "y"}),)), Usage(), 0, "", 3
        ),
        ProcessRecord("b", 4343, 2, "b"),
    ]
    state = fold([Record(i, "t", p) for i, p in enumerate(payloads, start=1)])  # type: ignore[arg-type]
    assert state.processes == [ProcessRecord("b", 4343, 2, "b")]


def test_a_resume_also_kills_what_a_subagent_of_the_dead_run_left(
    project: Path, tmp_path: Path, isolated_env: Path
) -> None:
    """A subagent runs in its parent's process and journals to its own file (`<id>.agents/`):
    its commands die with nothing else to stop them either."""
    from keel.session.store import SessionLog

    path = completed_session(project, tmp_path, isolated_env)
    proc = spawn_group("sleep 30")
    try:
        started = start_time(proc.pid)
        assert started is not None
        child = SessionLog.create(
            cwd=project,
            model="scripted:x",
            directory=path.with_name(f"{path.stem}.agents"),
            parent=path.stem,
            agent="general",
        )
        child.process("toolu_child", proc.pid, started, boot_id())
        child.close()
        out = keel("resume", path.stem, cwd=project)
        assert out.returncode == 2  # the parent itself has nothing left to do
        assert (
            "keel: warning: stopped what the killed run left running for call toolu_child: "
            f"process group {proc.pid} (pids {proc.pid})\n"
        ) in out.stderr
        proc.wait(5)
        assert proc.returncode == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
