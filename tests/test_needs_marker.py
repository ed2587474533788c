"""The `needs` marker of tests/conftest.py: a test that needs a program skips with the reason and
the package when the program is not on PATH, runs when it is, and a misspelt name stops the run.
Each case is a real pytest run over a one-test file, with PATH chosen by the case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SAMPLE = """
import pytest

@pytest.mark.needs({needs})
def test_sample():
    assert True
"""


def run_sample(
    tmp_path: Path, needs: str, path: str, **env: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    needs(*programs): see tests/conftest.py\n", encoding="utf-8"
    )
    (tmp_path / "test_sample.py").write_text(SAMPLE.format(needs=needs), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-rs", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path, "PYTHONPATH": str(REPO), **env},
        timeout=120,
        check=False,
    )


def summary(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in out.stdout.splitlines() if line.startswith(("SKIPPED", "ERROR"))]


def test_a_program_not_on_path_skips_with_the_package_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    out = run_sample(tmp_path, '"rg"', str(empty))
    assert out.returncode == 0, out.stdout + out.stderr
    assert summary(out) == ["SKIPPED [1] test_sample.py:4: needs rg: not on PATH (install ripgrep)"]
    assert "1 skipped" in out.stdout


def test_a_program_on_path_runs_the_test(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("node", "npm"):
        (bin_dir / name).write_text("#!/bin/sh\n", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    out = run_sample(tmp_path, '"node", "npm"', str(bin_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert summary(out) == []
    assert "1 passed" in out.stdout


def test_one_missing_program_of_several_is_named(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "node").write_text("#!/bin/sh\n", encoding="utf-8")
    (bin_dir / "node").chmod(0o755)
    out = run_sample(tmp_path, '"node", "npm"', str(bin_dir))
    assert summary(out) == ["SKIPPED [1] test_sample.py:4: needs npm: not on PATH (install npm)"]


def test_the_sandbox_is_what_keel_s_probe_finds(tmp_path: Path) -> None:
    out = run_sample(tmp_path, '"sandbox"', os.environ["PATH"], KEEL_NO_SANDBOX="1")
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = summary(out)
    # The rest of the line is keel's own wording (keel.permissions.sandbox.probe).
    assert line.startswith(
        "SKIPPED [1] test_sample.py:4: needs a working sandbox: sandbox turned off (KEEL_NO_SANDBOX"
    )


def test_a_name_the_marker_does_not_know_stops_the_run(tmp_path: Path) -> None:
    out = run_sample(tmp_path, '"ripgrep"', os.environ["PATH"])
    assert out.returncode == 4  # a usage error: a misspelt name must not skip silently
    assert (
        "test_sample.py::test_sample: needs('ripgrep') is not a known program "
        "(add it to PROGRAMS in tests/conftest.py)"
    ) in out.stderr
