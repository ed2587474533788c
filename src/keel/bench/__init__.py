"""`keel bench`: graded tasks, each run in a throwaway directory, compared across models.

This module owns the task model (built-in tasks shipped as package data under `tasks/`, the
user's own under `.keel/bench/<task>/`, and Harbor's layout: `task.toml`, `instruction.md`,
`tests/test.sh`), the runner (one `keel -p` subprocess per model, task and run, with its own keel
home so nothing of the user's sessions or approvals is touched), the mechanical grading (a
command's exit status or exact expected files; never a model) and the report (per run, then
medians and ranges per model and task, then per model). It never judges an answer with a model,
and it never runs a task that needs a container: such a task is skipped and says why.

`scripted:oracle` is the one special model: each task plays its own reference solution
(`oracle.yaml`, a scripted run through the real loop and real tools), so the whole suite and its
graders are proven offline.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from keel.errors import UserError
from keel.frozen import mutable

#: Where the built-in tasks live (package data).
BUILTIN_DIR = Path(__file__).resolve().parent / "tasks"
#: The user's own tasks, relative to the directory keel bench runs in.
USER_DIR = Path(".keel") / "bench"
ORACLE = "scripted:oracle"
DEFAULT_AGENT_TIMEOUT = 600.0
DEFAULT_GRADE_TIMEOUT = 120.0
#: Dockerfile instructions that need no container to reproduce (a base image and a directory).
_PLAIN_DOCKER = ("FROM", "WORKDIR", "ENV", "ARG", "LABEL", "USER", "CMD", "ENTRYPOINT")
#: Report format version (the JSON's `version`).
REPORT_VERSION = 1

Status = Literal["pass", "fail", "error", "skipped"]


# -- tasks ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One graded task, whatever layout it came from."""

    name: str
    source: Literal["builtin", "user", "harbor"]
    directory: Path
    prompt: str
    #: A starting tree copied into the work directory (None: start empty).
    tree: Path | None = None
    #: A script run in the work directory before the agent starts.
    setup: Path | None = None
    #: A shell command run in the work directory after the agent; exit 0 passes.
    grade: str | None = None
    #: Files that must match byte for byte (relative paths under this directory).
    expected: Path | None = None
    #: A directory copied next to (never into) the work directory for the grader (Harbor tests).
    grade_files: Path | None = None
    oracle: Path | None = None
    #: An oracle given as one shell script (Harbor's solution/solve.sh), played as one bash call.
    oracle_script: Path | None = None
    description: str = ""
    tags: tuple[str, ...] = ()
    #: Programs that must be on PATH, else the task is skipped.
    needs: tuple[str, ...] = ()
    #: A context window (tokens) the model gets for this task, so that it compacts.
    window: int | None = None
    #: Settings the run gets as the user's own (`settings:` in task.yaml), over the user's.
    settings: Mapping[str, Any] = field(default_factory=dict, hash=False)
    agent_timeout: float = DEFAULT_AGENT_TIMEOUT
    grade_timeout: float = DEFAULT_GRADE_TIMEOUT
    #: Why this task cannot run here (a container it needs); None: it can.
    unrunnable: str | None = None


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def load_task(directory: Path, source: Literal["builtin", "user"] = "user") -> Task:
    """A task from its directory: keel's layout (`prompt.md` / `task.yaml`) or Harbor's."""
    if (directory / "task.toml").is_file() and (directory / "instruction.md").is_file():
        return _harbor_task(directory)
    meta = _yaml(directory / "task.yaml") if (directory / "task.yaml").is_file() else {}
    where = f"bench task {directory}"
    prompt = meta.get("prompt")
    if prompt is None and (directory / "prompt.md").is_file():
        prompt = _read(directory / "prompt.md")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError(f"{where} has no prompt", hint="write prompt.md, or `prompt:` in task.yaml")
    grade = meta.get("grade")
    if grade is None and (directory / "grade.sh").is_file():
        grade = f'bash "{directory / "grade.sh"}"'
    expected = directory / "expected"
    has_expected = expected.is_dir()
    if grade is None and not has_expected:
        raise UserError(
            f"{where} has no grader",
            hint="add grade.sh, `grade:` in task.yaml, or an expected/ tree of exact files",
        )
    if grade is not None and not isinstance(grade, str):
        raise UserError(f"{where}: `grade` must be a shell command")
    tree = directory / "tree"
    setup = directory / "setup.sh"
    window = meta.get("window")
    if window is not None and (not isinstance(window, int) or window < 1000):
        raise UserError(f"{where}: `window` must be a whole number of tokens (at least 1000)")
    settings = meta.get("settings", {})
    if not isinstance(settings, dict):
        raise UserError(f"{where}: `settings` must be a mapping, as in settings.json")
    return Task(
        name=directory.name,
        source=source,
        directory=directory,
        prompt=prompt,
        tree=tree if tree.is_dir() else None,
        setup=setup if setup.is_file() else None,
        grade=grade,
        expected=expected if has_expected else None,
        oracle=directory / "oracle.yaml" if (directory / "oracle.yaml").is_file() else None,
        description=str(meta.get("description", "")),
        tags=tuple(str(t) for t in meta.get("tags", ())),
        needs=tuple(str(n) for n in meta.get("needs", ())),
        window=window,
        settings=settings,
        agent_timeout=float(meta.get("timeout", DEFAULT_AGENT_TIMEOUT)),
        grade_timeout=float(meta.get("grade_timeout", DEFAULT_GRADE_TIMEOUT)),
    )


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(_read(path))
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must be a mapping")
    return data


def _harbor_task(directory: Path) -> Task:
    """Harbor's layout: `instruction.md` is the prompt, `tests/test.sh` the grader (exit status),
    `solution/solve.sh` the oracle, `environment/Dockerfile` the container it would run in."""
    try:
        meta = tomllib.loads(_read(directory / "task.toml"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{directory / 'task.toml'} is not valid TOML: {exc}") from exc
    tests = directory / "tests"
    if not (tests / "test.sh").is_file():
        raise UserError(f"Harbor task {directory} has no tests/test.sh")
    agent = meta.get("agent", {}) if isinstance(meta.get("agent"), dict) else {}
    verifier = meta.get("verifier", {}) if isinstance(meta.get("verifier"), dict) else {}
    solve = directory / "solution" / "solve.sh"
    metadata = meta.get("metadata", {}) if isinstance(meta.get("metadata"), dict) else {}
    tags = metadata.get("tags", [])
    return Task(
        name=directory.name,
        source="harbor",
        directory=directory,
        prompt=_read(directory / "instruction.md"),
        grade='bash "$GRADE_DIR/tests/test.sh"',
        grade_files=tests,
        oracle_script=solve if solve.is_file() else None,
        description=str(metadata.get("description", "")),
        tags=tuple(str(t) for t in tags) if isinstance(tags, list) else (),
        agent_timeout=float(agent.get("timeout_sec", DEFAULT_AGENT_TIMEOUT)),
        grade_timeout=float(verifier.get("timeout_sec", DEFAULT_GRADE_TIMEOUT)),
        unrunnable=_needs_container(directory / "environment" / "Dockerfile"),
    )


def _needs_container(dockerfile: Path) -> str | None:
    """Why a Harbor task needs its container (None: its Dockerfile only names a base image)."""
    if not dockerfile.is_file():
        return None
    for line in _read(dockerfile).splitlines():
        word = line.strip().split(" ", 1)[0].upper()
        if word and not word.startswith("#") and word not in _PLAIN_DOCKER:
            return f"needs its container (environment/Dockerfile: {line.strip()[:60]})"
    return None


def discover(cwd: Path) -> list[Task]:
    """The built-in tasks, then the user's (`.keel/bench/<task>/` under `cwd`), by name."""
    tasks = [
        load_task(d, "builtin")
        for d in sorted(BUILTIN_DIR.iterdir())
        if d.is_dir() and not d.name.startswith(("_", "."))
    ]
    builtin = {t.name for t in tasks}
    user_dir = cwd / USER_DIR
    if user_dir.is_dir():
        for d in sorted(user_dir.iterdir()):
            if not d.is_dir() or d.name.startswith("."):
                continue
            if d.name in builtin:
                raise UserError(
                    f"user task {d} has the name of a built-in task",
                    hint="rename its directory",
                )
            tasks.append(load_task(d, "user"))
    return tasks


# -- trust: a repository's tasks run code (setup, graders) on this machine ----------------------


#: The approvals kind under which bench tasks are pinned (keel.config.trust).
TRUST_KIND = "bench"


def task_pin(task: Task) -> str:
    """A content hash of everything in the task's directory: any change needs a new approval."""
    digest = hashlib.sha256(task.name.encode())
    for path in sorted(p for p in task.directory.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(task.directory).as_posix()
        body = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(b"\0" + rel.encode() + b"\0" + hashlib.sha256(body).digest())
    return digest.hexdigest()[:16]


def came_with_repo(directory: Path) -> bool:
    """Whether the task in `directory` came with the project it lies in (`keel.config.intake`:
    by where it is, never by git's opinion; a task in keel's user folder is the user's own)."""
    from keel.config.intake import intake_for

    return intake_for(directory).supplied(directory)


def unapproved(
    tasks: Sequence[Task], cwd: Path, env: Mapping[str, str] | None = None
) -> list[Task]:
    """The user tasks that came with the project and whose current content is not approved.
    Built-in tasks ship with keel and need none."""
    from keel.config.settings import user_config_dir
    from keel.config.trust import approved_pins, project_key

    repo = [t for t in tasks if t.source != "builtin" and came_with_repo(t.directory)]
    if not repo:
        return []
    pins = approved_pins(user_config_dir(env), project_key(cwd), TRUST_KIND)
    return [t for t in repo if task_pin(t) not in pins]


def approve_tasks(tasks: Sequence[Task], cwd: Path, env: Mapping[str, str] | None = None) -> None:
    from keel.config.settings import user_config_dir
    from keel.config.trust import approvals_file, approve, project_key

    path = approvals_file(user_config_dir(env), project_key(cwd))
    for task in tasks:
        approve(path, TRUST_KIND, task_pin(task))


def revoke_tasks(cwd: Path, env: Mapping[str, str] | None = None) -> int:
    """Forget every bench approval of the project at `cwd`; how many there were."""
    from keel.config.settings import user_config_dir
    from keel.config.trust import approvals_file, project_key, revoke

    return revoke(approvals_file(user_config_dir(env), project_key(cwd)), TRUST_KIND)


def scripts_of(task: Task) -> list[Path]:
    """The files of a task that run on this machine outside the agent's sandbox."""
    found = [task.setup, task.oracle_script]
    if task.grade_files is not None:
        found.extend(sorted(task.grade_files.rglob("*")))
    if task.grade is not None and (task.directory / "grade.sh").is_file():
        found.append(task.directory / "grade.sh")
    return [p for p in found if p is not None and p.is_file()]


def select(tasks: Sequence[Task], names: Sequence[str] | None) -> list[Task]:
    if not names:
        return list(tasks)
    by_name = {t.name: t for t in tasks}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise UserError(
            f"unknown bench task(s): {', '.join(unknown)}",
            hint=f"tasks here: {', '.join(by_name)}",
        )
    return [by_name[n] for n in names]


# -- one run --------------------------------------------------------------------------------------


@mutable
class RunResult:
    """One model on one task, once."""

    model: str
    task: str
    run: int
    status: Status
    reason: str = ""
    turns: int = 0
    usage: dict[str, int] = field(
        default_factory=lambda: {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
    )
    cost_usd: float = 0.0
    wall_s: float = 0.0
    model_s: float = 0.0
    peak_context: int = 0
    compactions: int = 0
    stop_reason: str = ""
    workdir: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def cache_read_share(self) -> float:
        prompt = self.usage["input"] + self.usage["cache_read"] + self.usage["cache_write"]
        return self.usage["cache_read"] / prompt if prompt else 0.0

    @property
    def overhead_s(self) -> float:
        """Wall time the model did not account for: keel, the tools, process start."""
        return max(0.0, self.wall_s - self.model_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "task": self.task,
            "run": self.run,
            "status": self.status,
            "passed": self.passed,
            "reason": self.reason,
            "turns": self.turns,
            "usage": dict(self.usage),
            "cache_read_share": round(self.cache_read_share, 4),
            "cost_usd": round(self.cost_usd, 6),
            "wall_s": round(self.wall_s, 3),
            "model_s": round(self.model_s, 3),
            "overhead_s": round(self.overhead_s, 3),
            "peak_context": self.peak_context,
            "compactions": self.compactions,
            "stop_reason": self.stop_reason,
            "workdir": self.workdir,
        }


@dataclass(frozen=True)
class BenchOptions:
    #: Edits run unasked; bash runs unasked only inside the sandbox, and an unsandboxed command
    #: (or any command where no sandbox works) is refused, since nobody is there to ask.
    mode: str = "accept-edits"
    keep_failed: bool = False
    #: Where kept work directories go (None: the system's temporary directory).
    keep_dir: Path | None = None
    #: The environment the agent runs in (None: this process's).
    env: Mapping[str, str] | None = None
    #: The command that runs keel (default: this Python's `-m keel`).
    keel: tuple[str, ...] = (sys.executable, "-m", "keel")


def model_spec(model: str, task: Task, scratch: Path) -> str:
    """What `--model` the run gets: `scripted:oracle` becomes the task's own oracle script."""
    if model != ORACLE:
        return model
    if task.oracle is not None:
        return f"scripted:{task.oracle}"
    if task.oracle_script is not None:
        script = {
            "model": "oracle",
            "turns": [
                {
                    "tool_calls": [
                        {
                            "name": "bash",
                            "input": {
                                "command": _read(task.oracle_script),
                                "description": "the task's reference solution",
                                "timeout": int(task.agent_timeout),
                            },
                        }
                    ]
                },
                {"text": "Ran the reference solution."},
            ],
        }
        path = scratch / "oracle.json"
        path.write_text(json.dumps(script), encoding="utf-8")
        return f"scripted:{path}"
    raise _Skip("has no oracle (oracle.yaml or solution/solve.sh)")


class _Skip(Exception):
    pass


def _settings(task: Task, spec: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The run's user settings: the user's own, with this task's settings over them and its
    window for this model."""
    from keel.config.settings import user_config_dir

    settings: dict[str, Any] = {}
    own = user_config_dir(env) / "settings.json"
    if own.is_file():
        try:
            loaded = json.loads(_read(own))
        except ValueError as exc:
            raise UserError(f"{own} is not valid JSON: {exc}") from exc
        if isinstance(loaded, dict):
            settings = loaded
    settings.update(task.settings)
    if task.window is not None:
        from keel.llm.catalog import lookup, parse_model
        from keel.llm.provider import model_info

        ref = parse_model(spec)
        info = model_info(ref, {}) if ref.provider != "scripted" else lookup(ref.model)
        entry: dict[str, Any] = {
            "window": task.window,
            "max_output": min(info.max_output, max(1000, task.window // 4)),
        }
        for key in ("input_price", "output_price", "cache_read_price", "cache_write_price"):
            if getattr(info, key) is not None:
                entry[key] = getattr(info, key)
        models = settings.setdefault("models", {})
        if isinstance(models, dict):
            models[str(ref)] = entry
    return settings


def run_one(task: Task, model: str, run: int, options: BenchOptions) -> RunResult:
    """Run `model` on `task` once in a fresh directory and grade it."""
    result = RunResult(model, task.name, run, "error")
    if task.unrunnable:
        result.status, result.reason = "skipped", task.unrunnable
        return result
    missing = [p for p in task.needs if shutil.which(p) is None]
    if missing:
        result.status, result.reason = "skipped", f"needs {', '.join(missing)} on PATH"
        return result
    scratch = Path(tempfile.mkdtemp(prefix=f"keel-bench-{task.name}-", dir=options.keep_dir))
    keep = False
    try:
        keep = _run_in(scratch, task, model, result, options)
    finally:
        if keep:
            result.workdir = str(scratch / "work")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return result


#: What an installer's byte-compiling leaves in a packaged task's files: never part of the task.
_BYTECODE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _run_in(
    scratch: Path, task: Task, model: str, result: RunResult, options: BenchOptions
) -> bool:
    work, home, grade_dir = scratch / "work", scratch / "home", scratch / "grade"
    home.mkdir()
    grade_dir.mkdir()
    if task.tree is not None:
        shutil.copytree(task.tree, work, symlinks=True, ignore=_BYTECODE)
    else:
        work.mkdir()
    base_env = dict(options.env if options.env is not None else os.environ)
    try:
        spec = model_spec(model, task, scratch)
    except _Skip as exc:
        result.status, result.reason = "skipped", str(exc)
        return False
    task_env = {**base_env, "TASK_DIR": str(task.directory), "GRADE_DIR": str(grade_dir)}
    if task.setup is not None:
        done = _shell(f'bash "{task.setup}"', work, task_env, task.grade_timeout)
        if done.returncode != 0:
            result.reason = f"setup.sh failed (exit {done.returncode}): {_tail(done.stdout)}"
            return options.keep_failed
    config = home / "config"
    config.mkdir()
    settings = _settings(task, spec, base_env)
    if settings:
        (config / "settings.json").write_text(json.dumps(settings, indent=2), encoding="utf-8")
    # `~` is a throwaway too, so a command that reaches for the user's home finds nothing.
    user_home = home / "user-home"
    user_home.mkdir()
    agent_env = {
        **base_env,
        "KEEL_HOME": str(home),
        "KEEL_CONFIG_DIR": str(config),
        "HOME": str(user_home),
    }
    agent_env.pop("KEEL_DEBUG", None)
    command = [*options.keel, "-p", "--model", spec, "--output-format", "json", "-q"]
    command += ["--mode", options.mode]
    started = time.monotonic()
    agent = _run_agent(command, task.prompt, work, agent_env, task.agent_timeout)
    if agent is None:
        result.wall_s = time.monotonic() - started
        result.reason = f"the agent ran past the task's {task.agent_timeout:.0f} s"
        return options.keep_failed
    result.wall_s = time.monotonic() - started
    final = _last_json(agent.stdout)
    if final is None:
        result.reason = f"keel exited {agent.returncode} without a result: {_tail(agent.stderr)}"
        return options.keep_failed
    _measure(result, final)
    if task.grade_files is not None:
        shutil.copytree(task.grade_files, grade_dir / task.grade_files.name, ignore=_BYTECODE)
    session = final.get("session_path") or ""
    calls = grade_dir / "calls.jsonl"
    calls.write_text(
        "".join(json.dumps(c) + "\n" for c in tool_calls(Path(session)) if session),
        encoding="utf-8",
    )
    verdict = grade(
        task,
        work,
        {**task_env, "KEEL_BENCH_SESSION": session, "KEEL_BENCH_CALLS": str(calls)},
    )
    if verdict is None:
        result.status = "pass"
        return False
    result.status, result.reason = "fail", verdict
    if final.get("is_error"):
        result.reason = f"{verdict}; the run ended in error: {final.get('error')}"
    return options.keep_failed


def _run_agent(
    command: list[str], prompt: str, cwd: Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str] | None:
    """Run keel; None when it ran out of time (then its whole process group is killed, so no
    tool it started outlives the run)."""
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=dict(env),
        text=True,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(prompt, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _shell(
    command: str, cwd: Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        return subprocess.CompletedProcess(command, 124, f"{out}\n(timed out after {timeout} s)")


def grade(task: Task, work: Path, env: Mapping[str, str]) -> str | None:
    """None when the work directory passes; else why it fails, in one line."""
    if task.expected is not None:
        for path in sorted(p for p in task.expected.rglob("*") if p.is_file()):
            rel = path.relative_to(task.expected)
            got = work / rel
            if not got.is_file():
                return f"expected file {rel} is missing"
            if got.read_bytes() != path.read_bytes():
                return f"{rel} differs from the expected file"
    if task.grade is not None:
        done = _shell(task.grade, work, env, task.grade_timeout)
        if done.returncode != 0:
            return f"grader exited {done.returncode}: {_tail(done.stdout)}"
    return None


def _tail(text: str, limit: int = 160) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else "(no output)"
    return last if len(last) <= limit else last[: limit - 1] + "…"


def _last_json(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("type") == "result":
            return value
    return None


def _measure(result: RunResult, final: Mapping[str, Any]) -> None:
    """Fill the run's numbers from keel's result object and its session journals.

    Tokens and cost are summed over every model request the journals hold: the turns, any
    compaction summary, and the subagents' requests (their own files), so nothing is counted
    twice or missed. Model time and peak context are the main agent's (subagents run beside
    it, so their time would overlap)."""
    usage = final.get("usage") or {}
    result.usage = {k: int(usage.get(k, 0)) for k in result.usage}
    result.turns = int(final.get("turns", 0))
    result.cost_usd = float(final.get("cost_usd", 0.0))
    result.stop_reason = str(final.get("stop_reason", ""))
    path = final.get("session_path")
    if not path or not Path(path).is_file():
        return
    from keel.session.journal import read_records
    from keel.session.records import AssistantRecord, CompactionRecord

    session = Path(path)
    totals = dict.fromkeys(result.usage, 0)
    cost = 0.0
    for file in [session, *_subagent_files(session)]:
        main = file == session
        for record in read_records(file).records:
            payload = record.payload
            if not isinstance(payload, AssistantRecord | CompactionRecord):
                continue
            u = payload.usage
            for key in totals:
                totals[key] += getattr(u, key)
            cost += payload.cost
            if not main:
                continue
            peak = u.input + u.cache_read + u.cache_write
            if isinstance(payload, CompactionRecord) and (r := payload.repair_usage) is not None:
                # Two requests journaled as one sum: the summary's, and its repair's.
                repair = r.input + r.cache_read + r.cache_write
                peak = max(peak - repair, repair)
            result.peak_context = max(result.peak_context, peak)
            if isinstance(payload, CompactionRecord):
                result.compactions += 1
            elif payload.timing is not None:
                result.model_s += payload.timing.duration_ms / 1000
    result.usage, result.cost_usd = totals, cost


def _subagent_files(session: Path) -> list[Path]:
    return sorted(session.parent.glob(f"{session.stem}.agents/**/*.jsonl"))


def tool_calls(session: Path) -> list[dict[str, Any]]:
    """Every tool call of a session (subagents' included), in order: {name, input, agent}."""
    if not session.is_file():
        return []
    from keel.session.journal import read_records
    from keel.session.records import AssistantRecord

    calls: list[dict[str, Any]] = []
    files = [session, *_subagent_files(session)]
    for path in files:
        agent = "" if path == session else path.stem
        for record in read_records(path).records:
            if isinstance(record.payload, AssistantRecord):
                calls.extend(
                    {"name": c.name, "input": c.input, "agent": agent}
                    for c in record.payload.message.tool_uses
                )
    return calls


# -- the whole bench ------------------------------------------------------------------------------


def run_bench(
    tasks: Sequence[Task],
    models: Sequence[str],
    *,
    runs: int = 1,
    options: BenchOptions | None = None,
    progress: Callable[[RunResult], None] | None = None,
) -> Report:
    options = options or BenchOptions()
    results: list[RunResult] = []
    for model in models:
        for task in tasks:
            for run in range(1, runs + 1):
                one = run_one(task, model, run, options)
                results.append(one)
                if progress is not None:
                    progress(one)
    return Report(list(models), [t.name for t in tasks], runs, results)


def _spread(values: Iterable[float]) -> dict[str, float]:
    vals = list(values)
    if not vals:
        return {"median": 0.0, "min": 0.0, "max": 0.0}
    return {
        "median": round(statistics.median(vals), 6),
        "min": round(min(vals), 6),
        "max": round(max(vals), 6),
    }


_METRICS: dict[str, Callable[[RunResult], float]] = {
    "turns": lambda r: r.turns,
    "tokens": lambda r: sum(r.usage.values()),
    "input": lambda r: r.usage["input"],
    "output": lambda r: r.usage["output"],
    "cache_read": lambda r: r.usage["cache_read"],
    "cache_write": lambda r: r.usage["cache_write"],
    "cache_read_share": lambda r: r.cache_read_share,
    "cost_usd": lambda r: r.cost_usd,
    "wall_s": lambda r: r.wall_s,
    "overhead_s": lambda r: r.overhead_s,
    "peak_context": lambda r: r.peak_context,
}


@mutable
class Report:
    models: list[str]
    tasks: list[str]
    runs: int
    results: list[RunResult]

    def of(self, model: str, task: str | None = None) -> list[RunResult]:
        return [
            r
            for r in self.results
            if r.model == model and (task is None or r.task == task) and r.status != "skipped"
        ]

    def cell(self, model: str, task: str) -> dict[str, Any]:
        """One model on one task across its runs: passes, then a median and range per metric."""
        ran = self.of(model, task)
        skipped = [r for r in self.results if r.model == model and r.task == task and r not in ran]
        out: dict[str, Any] = {
            "model": model,
            "task": task,
            "runs": len(ran),
            "passes": sum(r.passed for r in ran),
            "pass_rate": round(sum(r.passed for r in ran) / len(ran), 4) if ran else None,
            "skipped": skipped[0].reason if skipped and not ran else None,
        }
        for name, metric in _METRICS.items():
            out[name] = _spread(metric(r) for r in ran)
        return out

    def model_summary(self, model: str) -> dict[str, Any]:
        """A model across the suite: pass rate over every graded run, and the median per run of
        the suite's total cost and time (the sum over tasks of one run each)."""
        ran = self.of(model)
        per_run: dict[int, list[RunResult]] = {}
        for r in ran:
            per_run.setdefault(r.run, []).append(r)
        return {
            "model": model,
            "graded": len(ran),
            "passes": sum(r.passed for r in ran),
            "pass_rate": round(sum(r.passed for r in ran) / len(ran), 4) if ran else 0.0,
            "cost_usd": _spread(sum(r.cost_usd for r in rs) for rs in per_run.values()),
            "wall_s": _spread(sum(r.wall_s for r in rs) for rs in per_run.values()),
            "tokens": _spread(sum(sum(r.usage.values()) for r in rs) for rs in per_run.values()),
            "failed": sorted({r.task for r in ran if not r.passed}),
        }

    @property
    def all_passed(self) -> bool:
        graded = [r for r in self.results if r.status != "skipped"]
        return bool(graded) and all(r.passed for r in graded)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "models": self.models,
            "tasks": self.tasks,
            "runs": self.runs,
            "summary": [self.model_summary(m) for m in self.models],
            "cells": [self.cell(m, t) for m in self.models for t in self.tasks],
            "results": [r.to_json() for r in self.results],
        }

    # -- rendering --------------------------------------------------------------------------

    def _rows(self) -> list[list[str]]:
        rows = []
        for m in self.models:
            for t in self.tasks:
                c = self.cell(m, t)
                if c["runs"] == 0:
                    rows.append([m, t, "skip", c["skipped"] or "", *[""] * 8])
                    continue
                rows.append(
                    [
                        m,
                        t,
                        f"{c['passes']}/{c['runs']}",
                        _fmt(c["turns"], "{:.0f}"),
                        _fmt(c["input"], "{:.0f}"),
                        _fmt(c["output"], "{:.0f}"),
                        _fmt(c["cache_read"], "{:.0f}"),
                        _fmt(c["cache_write"], "{:.0f}"),
                        _fmt(c["cache_read_share"], "{:.0%}"),
                        _fmt(c["cost_usd"], "${:.4f}"),
                        _fmt(c["wall_s"], "{:.1f}s") + " / " + _fmt(c["overhead_s"], "{:.1f}s"),
                        _fmt(c["peak_context"], "{:.0f}"),
                    ]
                )
        return rows

    HEADER = (
        "model",
        "task",
        "pass",
        "turns",
        "input",
        "output",
        "cache rd",
        "cache wr",
        "cache %",
        "cost",
        "wall / overhead",
        "peak ctx",
    )

    def table(self) -> str:
        rows = [list(self.HEADER), *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER))]
        lines = [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append("")
        lines.extend(self._summary_lines())
        return "\n".join(lines) + "\n"

    def _summary_lines(self) -> list[str]:
        out = []
        for m in self.models:
            s = self.model_summary(m)
            failed = f"; failed: {', '.join(s['failed'])}" if s["failed"] else ""
            out.append(
                f"{m}: {s['passes']}/{s['graded']} passed ({s['pass_rate']:.0%}), "
                f"suite cost ${s['cost_usd']['median']:.4f}, "
                f"wall {s['wall_s']['median']:.1f}s (median of {self.runs} run(s)){failed}"
            )
        return out

    def markdown(self) -> str:
        head = "| " + " | ".join(self.HEADER) + " |"
        rule = "|" + "|".join("---" for _ in self.HEADER) + "|"
        body = ["| " + " | ".join(r) + " |" for r in self._rows()]
        note = (
            f"\nMedians over {self.runs} runs, [min–max] where runs differ. Wall time / harness "
            "overhead (wall time minus the model's time).\n"
            if self.runs > 1
            else "\n"
        )
        return (
            "\n".join([head, rule, *body])
            + "\n"
            + note
            + "\n"
            + "\n".join(f"- {line}" for line in self._summary_lines())
            + "\n"
        )


def _fmt(spread: Mapping[str, float], pattern: str) -> str:
    med, low, high = (pattern.format(spread[k]) for k in ("median", "min", "max"))
    return med if low == high else f"{med} [{low}–{high}]"


def write_report(report: Report, out: Path) -> dict[str, Path]:
    """report.json, report.md and plot.svg in `out`; returns their paths."""
    from keel.bench.plot import plot_svg

    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "report.json",
        "markdown": out / "report.md",
        "plot": out / "plot.svg",
    }
    paths["json"].write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    paths["markdown"].write_text(report.markdown(), encoding="utf-8")
    paths["plot"].write_text(
        plot_svg([report.model_summary(m) for m in report.models]), encoding="utf-8"
    )
    return paths


__all__ = [
    "BUILTIN_DIR",
    "ORACLE",
    "TRUST_KIND",
    "BenchOptions",
    "Report",
    "RunResult",
    "Task",
    "approve_tasks",
    "came_with_repo",
    "discover",
    "grade",
    "load_task",
    "revoke_tasks",
    "run_bench",
    "run_one",
    "scripts_of",
    "select",
    "task_pin",
    "tool_calls",
    "unapproved",
    "write_report",
]
