"""Crash tests: the durability contract, proven by killing keel with SIGKILL.

A scripted two-prompt task runs bash tools whose side effect is visible (each appends its own
token to effects.log). A planted SIGKILL stops the process at a chosen point: before or after a
journal write, after a tool's side effect but before its result is journaled, or mid-stream.
Then the test does what a user would: `keel resume ID` (re-issuing a prompt only if it never
reached the journal), possibly crashing again, until the task is done. Afterwards:

- the run reached its final answer;
- no tool ran more than twice, and at most one tool per crash ran twice (with several crashes in
  one scenario: at most one repeated run per crash);
- every tool_use has exactly one tool_result record;
- the file parses with no torn tail, and seq is contiguous from 1;
- each prompt the user typed is in the transcript exactly once;
- a kill between a final answer and its terminal record leaves a session that reads and resumes
  as completed (`keel resume` says "completed", as for a session that was not killed).

The unsandboxed suite (KEEL_NO_SANDBOX=1) runs slower commands and also kills keel while one
runs (`spawn:N:SECONDS`): nothing stops that command but the resume, so it also checks that no
call overlaps its re-run (every command logs ticks; none of an earlier run may follow the start
of a later run of the same call).

The default suite runs a seeded sample (`CRASH_FAST`, `CRASH_FAST_UNSANDBOXED`); `pytest -m slow`
runs 200+ kills.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from keel.llm.messages import ToolUse, without_context
from keel.session.journal import read_records
from keel.session.records import AssistantRecord, ToolResultRecord, UserRecord

RUNNER = Path(__file__).with_name("crash_runner.py")
PROMPTS = ("do part one", "now part two")
FINALS = ("Part one done.", "All done.")
TOKENS = [f"T{i}" for i in range(1, 8)]
CRASH_FAST = 24
CRASH_FULL = 210
CRASH_FAST_UNSANDBOXED = 4
CRASH_FULL_UNSANDBOXED = 40
UNSANDBOXED = {"KEEL_NO_SANDBOX": "1"}


def bash(token: str) -> dict[str, object]:
    return {"name": "bash", "input": {"command": f"echo {token} >> effects.log"}}


def slow_bash(token: str) -> dict[str, object]:
    """Ticks for 1.2 s (ignoring SIGTERM: only a SIGKILL stops it early; longer than a resume
    takes to start), then has its effect."""
    return {
        "name": "bash",
        "input": {
            "command": f"trap '' TERM; tag=$RANDOM$RANDOM; echo start {token} $tag >> marks; "
            f"for i in $(seq 12); do echo tick {token} $tag >> marks; sleep 0.1; done; "
            f"echo {token} >> effects.log"
        },
    }


def script(call: Callable[[str], dict[str, object]]) -> dict[str, object]:
    return {
        "model": "crash",
        "turns": [
            {"text": "Starting.", "tool_calls": [call("T1")]},
            {"thinking": "two at once", "tool_calls": [call("T2"), call("T3")]},
            {"tool_calls": [call("T4")]},
            {"text": FINALS[0]},
            {"text": "Three more.", "tool_calls": [call("T5"), call("T6"), call("T7")]},
            {"text": FINALS[1]},
        ],
    }


SCRIPT = script(bash)


@dataclass
class World:
    project: Path
    home: Path
    script: Path
    kills: int = 0
    runs: list[str] = field(default_factory=list)
    #: Without the sandbox: KEEL_NO_SANDBOX=1, and bypass mode so that commands run unasked.
    unsandboxed: bool = False

    def keel(
        self, *args: str, crash: str = "", count: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KEEL_HOME": str(self.home), "KEEL_CRASH": crash}
        env.pop("KEEL_CRASH_COUNT", None)
        if count is not None:
            env["KEEL_CRASH_COUNT"] = str(count)
        if self.unsandboxed:
            env.update(UNSANDBOXED)
            args = (*args, "--mode", "bypass")
        out = subprocess.run(
            [sys.executable, str(RUNNER), *args],
            cwd=self.project,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.runs.append(f"{' '.join(args)} [{crash or 'no crash'}] -> {out.returncode}")
        if out.returncode == -9:
            self.kills += 1
        return out

    def session(self) -> Path | None:
        files = sorted(self.home.glob("sessions/*/*.jsonl"))
        assert len(files) <= 1, files
        return files[0] if files else None


def make_world(tmp_path: Path, *, unsandboxed: bool = False) -> World:
    project = tmp_path / "project"
    project.mkdir(parents=True)
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script(slow_bash) if unsandboxed else SCRIPT), encoding="utf-8")
    return World(project, tmp_path / "home", path, unsandboxed=unsandboxed)


def prompt_texts(path: Path) -> list[str]:
    """The journaled prompts' texts, the context block that opens the first one included."""
    return [
        r.payload.message.text
        for r in read_records(path).records
        if isinstance(r.payload, UserRecord) and r.payload.source == "prompt"
    ]


def prompts_recorded(path: Path) -> list[str]:
    """The prompts as the user gave them."""
    return [without_context(text) for text in prompt_texts(path)]


def run_phase(world: World, phase: int, rng: random.Random, first_crash: str) -> None:
    """Get prompt `phase` done, crashing first with `first_crash`, then resuming as a user would
    (sometimes crashing again)."""
    crash = first_crash
    for _ in range(12):
        path = world.session()
        model = f"scripted:{world.script}"
        if path is None:
            out = world.keel("-p", PROMPTS[0], "--model", model, crash=crash)
        elif PROMPTS[phase] not in prompts_recorded(path):
            out = world.keel("-p", "--resume", path.stem, PROMPTS[phase], crash=crash)
        else:
            out = world.keel("resume", path.stem, crash=crash)
            if out.returncode == 2 and "nothing left to resume" in out.stderr:
                # It had finished; only the process died before it could say so (or write its
                # terminal record): it reads as completed all the same.
                assert "its last turn completed" in out.stderr, out.stderr
                return
        if out.returncode == 0:
            assert out.stdout == FINALS[phase] + "\n", out
            return
        assert out.returncode == -9, f"{out.returncode}: {out.stderr}\n" + "\n".join(world.runs)
        # A later run crashes again one time in three, somewhere early.
        again = [f"append-after:{rng.randint(1, 4)}", f"tool-after:{rng.randint(1, 2)}"]
        if world.unsandboxed:
            again.append(f"spawn:{rng.randint(1, 2)}:0.2")
        crash = rng.choice(["", "", *again])
    raise AssertionError("the task never finished:\n" + "\n".join(world.runs))


def check_invariants(world: World) -> None:
    path = world.session()
    assert path is not None
    records = read_records(path, allow_torn_tail=False).records
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    effects = (world.project / "effects.log").read_text(encoding="utf-8").split()
    counts = Counter(effects)
    assert set(counts) == set(TOKENS), counts
    # Each crash repeats at most the one tool in flight (bash calls run one at a time). With one
    # crash, no tool ran more than twice; crashes that keep hitting the same unfinished call
    # repeat it once each.
    repeats = sum(n - 1 for n in counts.values())
    assert repeats <= world.kills, (counts, world.kills)
    if world.kills == 1:
        assert all(n <= 2 for n in counts.values()), counts
    calls = [
        b.id
        for r in records
        if isinstance(r.payload, AssistantRecord)
        for b in r.payload.message.blocks
        if isinstance(b, ToolUse)
    ]
    results = Counter(
        r.payload.result.tool_use_id for r in records if isinstance(r.payload, ToolResultRecord)
    )
    assert sorted(calls) == sorted(set(calls)), "a model turn was journaled twice"
    assert results == Counter(calls), (results, calls)
    assert prompts_recorded(path) == list(PROMPTS)
    # One context, opening the first prompt: a resume continues it, never opens another.
    assert [text.startswith("<context>\n") for text in prompt_texts(path)] == [True, False]
    final = [r.payload.message.text for r in records if isinstance(r.payload, AssistantRecord)][-1]
    assert final == FINALS[1]
    if world.unsandboxed:
        marks = (world.project / "marks").read_text(encoding="utf-8").splitlines()
        assert overlaps(marks) == [], marks


def overlaps(marks: list[str]) -> list[str]:
    """Lines an earlier run of a call wrote after a later run of the same call started."""
    latest: dict[str, str] = {}
    bad = []
    for line in marks:
        kind, token, tag = line.split()
        if kind == "start":
            latest[token] = tag
        elif latest[token] != tag:
            bad.append(line)
    return bad


def kill_points(tmp_path: Path, *, unsandboxed: bool = False) -> dict[str, list[str]]:
    """Every planted-kill point of each phase, from a dry run that counts what happens."""
    world = make_world(tmp_path / "dry", unsandboxed=unsandboxed)
    counts = []
    out = world.keel(
        "-p", PROMPTS[0], "--model", f"scripted:{world.script}", count=tmp_path / "c1.json"
    )
    assert out.returncode == 0, out.stderr
    counts.append(json.loads((tmp_path / "c1.json").read_text(encoding="utf-8")))
    path = world.session()
    assert path is not None
    out = world.keel("-p", "--resume", path.stem, PROMPTS[1], count=tmp_path / "c2.json")
    assert out.returncode == 0, out.stderr
    counts.append(json.loads((tmp_path / "c2.json").read_text(encoding="utf-8")))
    points = {}
    for phase, c in enumerate(counts):
        p = [f"append-{w}:{n}" for n in range(1, c["append"] + 1) for w in ("before", "after")]
        p += [f"tool-after:{n}" for n in range(1, c["tool"] + 1)]
        p += [f"stream:{n}:{k}" for n in range(1, c["stream"] + 1) for k in (0, 1, 3)]
        if unsandboxed:  # mid-command, weighted so that most scenarios kill one
            p += [f"spawn:{n}:0.2" for n in range(1, c["spawn"] + 1) for _ in range(6)]
        points[str(phase)] = p
    return points


def crash_suite(tmp_path: Path, scenarios: int, seed: int, *, unsandboxed: bool = False) -> int:
    """Run `scenarios` seeded crash scenarios; returns how many SIGKILLs landed."""
    rng = random.Random(seed)
    points = kill_points(tmp_path, unsandboxed=unsandboxed)
    total_kills = 0
    for i in range(scenarios):
        world = make_world(tmp_path / f"s{i}", unsandboxed=unsandboxed)
        phase_to_crash = rng.randint(0, 1)
        plan = rng.choice(points[str(phase_to_crash)])
        run_phase(world, 0, rng, plan if phase_to_crash == 0 else "")
        run_phase(world, 1, rng, plan if phase_to_crash == 1 else "")
        try:
            check_invariants(world)
        except AssertionError as exc:
            raise AssertionError(
                f"scenario {i} (seed {seed}, plan {plan}): {exc}\n" + "\n".join(world.runs)
            ) from exc
        total_kills += world.kills
    assert total_kills >= scenarios * 0.8, f"only {total_kills} kills in {scenarios} scenarios"
    return total_kills


@pytest.mark.needs("sandbox")
def test_crash_sample(tmp_path: Path) -> None:
    crash_suite(tmp_path, CRASH_FAST, seed=20261130)


@pytest.mark.slow
def test_crash_full(tmp_path: Path) -> None:
    seed = int(os.environ.get("KEEL_CRASH_SEED", "7"))
    kills = crash_suite(tmp_path, CRASH_FULL, seed=seed)
    assert kills >= 200, kills


def test_crash_sample_unsandboxed(tmp_path: Path) -> None:
    crash_suite(tmp_path, CRASH_FAST_UNSANDBOXED, seed=20261201, unsandboxed=True)


@pytest.mark.slow
def test_crash_full_unsandboxed(tmp_path: Path) -> None:
    seed = int(os.environ.get("KEEL_CRASH_SEED", "7"))
    crash_suite(tmp_path, CRASH_FULL_UNSANDBOXED, seed=seed, unsandboxed=True)


@pytest.mark.parametrize(
    "unsandboxed",
    [pytest.param(False, marks=pytest.mark.needs("sandbox")), True],
    ids=["sandboxed", "unsandboxed"],
)
def test_a_kill_while_each_command_runs_never_overlaps_its_re_run(
    tmp_path: Path, unsandboxed: bool
) -> None:
    """Not random: a SIGKILL 0.2 s into each command of the first prompt, once each."""
    world = make_world(tmp_path / "dry", unsandboxed=True)
    world.unsandboxed = unsandboxed
    count = tmp_path / "c.json"
    out = world.keel("-p", PROMPTS[0], "--model", f"scripted:{world.script}", count=count)
    assert out.returncode == 0, out.stderr
    spawns = json.loads(count.read_text(encoding="utf-8"))["spawn"]
    assert spawns == 4  # T1..T4
    rng = random.Random(3)
    for n in range(1, spawns + 1):
        world = make_world(tmp_path / f"k{n}", unsandboxed=True)
        world.unsandboxed = unsandboxed
        run_phase(world, 0, rng, f"spawn:{n}:0.2")
        run_phase(world, 1, rng, "")
        assert world.kills >= 1
        check_invariants(world)
        marks = (world.project / "marks").read_text(encoding="utf-8").splitlines()
        assert overlaps(marks) == [], marks


@pytest.mark.needs("sandbox")
@pytest.mark.parametrize("phase", [0, 1])
def test_a_kill_between_the_final_answer_and_its_terminal_record(
    tmp_path: Path, phase: int
) -> None:
    """The final answer is durable, the terminal record never written: the session reads as
    completed (not crashed), `keel resume` says so as for a completed one, and the next prompt
    continues it."""
    points = [p for p in kill_points(tmp_path)[str(phase)] if p.startswith("append-after")]
    final_answer = points[-2]  # the last append is the terminal record; the one before, the answer
    world = make_world(tmp_path / "w")
    rng = random.Random(5)
    if phase == 1:
        run_phase(world, 0, rng, "")
        path = world.session()
        assert path is not None
        out = world.keel("-p", "--resume", path.stem, PROMPTS[1], crash=final_answer)
    else:
        out = world.keel(
            "-p", PROMPTS[0], "--model", f"scripted:{world.script}", crash=final_answer
        )
    assert out.returncode == -9, out.stderr
    path = world.session()
    assert path is not None
    last = read_records(path).records[-1].payload
    assert isinstance(last, AssistantRecord)
    assert last.message.text == FINALS[phase]
    listing = world.keel("sessions", "list", "--json")
    assert [json.loads(line)["status"] for line in listing.stdout.splitlines()] == ["completed"]
    again = world.keel("resume", path.stem)
    assert (again.returncode, again.stderr) == (
        2,
        f"keel: error: session {path.stem} has nothing left to resume: its last turn completed "
        f'(hint: continue it with a prompt: keel -p --resume {path.stem} "…")\n',
    )
    if phase == 0:
        run_phase(world, 1, rng, "")
        check_invariants(world)


@pytest.mark.needs("sandbox")
def test_every_kill_point_of_phase_one_in_order(tmp_path: Path) -> None:
    """Not random: each journal write of the first prompt, before and after, once."""
    points = [p for p in kill_points(tmp_path)["0"] if p.startswith("append")]
    rng = random.Random(1)
    for i, plan in enumerate(points):
        world = make_world(tmp_path / f"p{i}")
        run_phase(world, 0, rng, plan)
        run_phase(world, 1, rng, "")
        check_invariants(world)
        assert world.kills >= 1, plan
