"""The session file: records, write ordering, locking, torn tails, corruption and migrations."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from keel.errors import UserError
from keel.llm.messages import Message, Text, Thinking, ToolUse, Usage, tool_result, user
from keel.session.journal import (
    CorruptSession,
    Journal,
    JournalWriteError,
    SessionLocked,
    read_records,
)
from keel.session.records import (
    FORMAT,
    AssistantRecord,
    Fingerprint,
    Meta,
    NoteRecord,
    Payload,
    Record,
    TerminalRecord,
    ToolResultRecord,
    UserRecord,
    decode,
    encode,
)
from keel.session.store import SessionLog, check_id, keel_home, project_key, sessions_dir

FP = Fingerprint("anthropic", "claude-sonnet-4-5", "aaaa", "bbbb", 200, None, 5.0)


def meta(sid: str = "s1") -> Meta:
    return Meta(sid, "/work/p", "anthropic/claude-sonnet-4-5", FP, None, None, "0.1.0")


def test_every_record_type_round_trips() -> None:
    msg = Message(
        "assistant",
        (
            Thinking("hmm", "c2lnbmF0dXJl+/=", source="anthropic"),
            Text("hi"),
            ToolUse("t1", "read", {"path": "a"}),
        ),
        "anthropic",
        "claude-sonnet-4-5",
    )
    payloads: list[Payload] = [
        meta(),
        UserRecord(user("hello"), "prompt"),
        AssistantRecord(msg, Usage(10, 5, 100, 7), 0.0123, "tool_use", 1),
        ToolResultRecord(tool_result("t1", "out", is_error=True), 0.25),
        NoteRecord("undo"),
        TerminalRecord("completed", ""),
    ]
    for seq, payload in enumerate(payloads, start=1):
        record = Record(seq, "2026-11-30T00:00:00.000Z", payload)
        line = encode(record)
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1
        assert decode(line) == record


def test_encoded_assistant_record_is_the_documented_shape() -> None:
    msg = Message("assistant", (Text("hi"),), "openai", "gpt-5")
    line = encode(
        Record(
            3,
            "2026-11-30T00:00:00.000Z",
            AssistantRecord(msg, Usage(1, 2, 3, 4), 0.5, "end_turn", 2),
        )
    )
    assert json.loads(line) == {
        "v": 1,
        "seq": 3,
        "type": "assistant",
        "ts": "2026-11-30T00:00:00.000Z",
        "message": {
            "v": 1,
            "role": "assistant",
            "content": [{"type": "text", "text": "hi"}],
            "provider": "openai",
            "model": "gpt-5",
        },
        "usage": {"input": 1, "output": 2, "cache_read": 3, "cache_write": 4},
        "cost": 0.5,
        "stop_reason": "end_turn",
        "turn": 2,
    }


def test_version_0_records_are_migrated() -> None:
    old = {
        "seq": 2,
        "kind": "user",
        "ts": 1796000000.5,
        "message": {"role": "user", "blocks": [{"type": "text", "text": "legacy"}]},
    }
    record = decode(json.dumps(old))
    assert record.v == FORMAT  # migrated, in memory, to the current format
    assert record.ts == "2026-11-30T00:53:20.500Z"
    assert record.payload == UserRecord(Message("user", (Text("legacy"),)), "prompt")


def test_newer_versions_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="record format 9 is newer than this keel reads"):
        decode(json.dumps({"v": 9, "seq": 1, "type": "meta"}))


def test_create_sets_modes_and_fsyncs_meta(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "s1.jsonl"
    journal = Journal.create(path, meta())
    journal.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    (record,) = read_records(path).records
    assert record.seq == 1
    assert record.payload == meta()


def test_second_writer_gets_an_error_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "s1.jsonl"
    Journal.create(path, meta()).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; from pathlib import Path; from keel.session.journal import Journal;"
            "j, _ = Journal.open(Path(sys.argv[1])); print('locked', flush=True); time.sleep(30)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SessionLocked, match=f"already open for writing by pid {holder.pid}"):
            Journal.open(path)
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    journal, _ = Journal.open(path)  # the kernel released the dead holder's lock
    journal.close()


def test_torn_tail_is_cut_before_the_next_append(tmp_path: Path) -> None:
    """Appending after a torn fragment must not glue the new record onto it (the bug another
    implementation has: the glued line later becomes interior corruption)."""
    path = tmp_path / "s1.jsonl"
    journal = Journal.create(path, meta())
    journal.append(UserRecord(user("one")))
    journal.close()
    whole = path.read_bytes()
    fragment = encode(Record(3, "2026-11-30T00:00:00.000Z", UserRecord(user("two"))))[:25]
    path.write_bytes(whole + fragment)

    loaded = read_records(path)  # a reader sees the good records and leaves the file alone
    assert [r.seq for r in loaded.records] == [1, 2]
    assert loaded.repaired_bytes == 25
    assert path.read_bytes() == whole + fragment

    journal, loaded = Journal.open(path)
    assert loaded.repaired_bytes == 25
    assert path.read_bytes() == whole + fragment  # opening writes nothing
    journal.append(UserRecord(user("three")))  # the fragment is cut before this append
    (saved,) = tmp_path.glob("s1.jsonl.torn-*")
    assert saved.read_bytes() == fragment
    journal.append(UserRecord(user("four")))
    journal.close()
    records = read_records(path, allow_torn_tail=False).records
    assert [r.seq for r in records] == [1, 2, 3, 4]
    assert [r.payload.message.text for r in records[1:]] == ["one", "three", "four"]  # type: ignore[union-attr]


def test_unparsable_complete_last_line_is_an_error_not_a_torn_tail(tmp_path: Path) -> None:
    """A newline-terminated line was written whole: it is never cut (issue 12: resume deleted
    such lines). Only bytes after the last newline count as torn."""
    path = tmp_path / "s1.jsonl"
    Journal.create(path, meta()).close()
    damaged = path.read_bytes() + b'{"v":1,"seq":2,"type":"us\x00\x00\n'
    path.write_bytes(damaged)
    with pytest.raises(CorruptSession, match=r"s1.jsonl: line 2 is not a valid record"):
        Journal.open(path)
    assert path.read_bytes() == damaged


def test_corrupt_middle_line_is_reported_with_its_number_and_nothing_is_touched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s1.jsonl"
    journal = Journal.create(path, meta())
    journal.append(UserRecord(user("one")))
    journal.append(UserRecord(user("two")))
    journal.close()
    lines = path.read_bytes().split(b"\n")
    lines[1] = b'{"v":1,"seq":2,"type":"user", broken'
    damaged = b"\n".join(lines)
    path.write_bytes(damaged)
    with pytest.raises(CorruptSession, match=r"s1.jsonl: line 2 is not a valid record \(not JSON"):
        Journal.open(path)
    with pytest.raises(CorruptSession, match="line 2"):
        read_records(path)
    assert path.read_bytes() == damaged


def test_seq_gaps_are_corruption(tmp_path: Path) -> None:
    path = tmp_path / "s1.jsonl"
    path.write_bytes(encode(Record(1, "t", meta())) + encode(Record(3, "t", NoteRecord("x"))))
    with pytest.raises(CorruptSession, match=r"line 2 .*seq 3, expected 2"):
        read_records(path)


def test_append_failure_stops_with_a_clear_error_and_leaves_the_file_readable(
    tmp_path: Path,
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    path = tmp_path / "s1.jsonl"
    journal = Journal.create(path, meta())
    journal.close()
    journal, _ = Journal.open(path)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, journal._fd)  # every write now fails with ENOSPC
    os.close(full)
    with pytest.raises(
        JournalWriteError, match=r"cannot write session file .*No space left on device"
    ):
        journal.append(NoteRecord("lost"))
    journal.close()
    assert [r.seq for r in read_records(path).records] == [1]


def test_session_log_writes_through_the_journal(tmp_path: Path) -> None:
    log = SessionLog.create(
        cwd=tmp_path, model="scripted:x", fingerprint=FP, directory=tmp_path / "d"
    )
    log.user(user("hi"))
    log.assistant(Message("assistant", (Text("yo"),)), Usage(1, 1), 0.0, "end_turn", 1)
    log.tool_result(tool_result("t", "r"), 0.5)
    log.terminal("completed")
    log.close()
    types = [r.payload.type for r in read_records(log.path).records]
    assert types == ["meta", "user", "assistant", "tool_result", "terminal"]
    assert log.path.name == f"{log.id}.jsonl"


def test_session_paths_and_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_HOME", str(tmp_path / "home"))
    assert keel_home() == tmp_path / "home"
    key = project_key(Path("/srv/my project"))
    assert key.startswith("my_project-")
    assert len(key) == len("my_project-") + 8
    assert sessions_dir(Path("/srv/my project")) == tmp_path / "home" / "sessions" / key
    assert check_id("20261130-041918-a1b2c3") == "20261130-041918-a1b2c3"
    with pytest.raises(UserError, match="is not a session id"):
        check_id("../../etc/passwd")


async def test_a_failing_journal_stops_the_run_with_a_clear_error(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    from keel.agent.loop import Agent
    from keel.llm.providers.scripted import ScriptedProvider
    from keel.llm.script import reply

    log = SessionLog.create(cwd=tmp_path, model="scripted", directory=tmp_path / "s")
    full = os.open("/dev/full", os.O_WRONLY)
    assert isinstance(log.journal, Journal)
    os.dup2(full, log.journal._fd)  # the disk is now full
    os.close(full)
    agent = Agent(
        provider=ScriptedProvider([reply("never stored")]),
        model="scripted",
        cwd=tmp_path,
        system="s",
        session=log,
    )
    result = await agent.run("go")
    assert result.stop_reason == "error"
    assert result.error is not None
    assert result.error.startswith(f"cannot write session file {log.path}: No space left on device")
    assert "the run stopped and the file is readable" in result.error
    log.close()
    assert [r.payload.type for r in read_records(log.path).records] == ["meta"]
