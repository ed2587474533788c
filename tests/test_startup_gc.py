"""`keel -p` pauses the cyclic collector during its start-up and the first model reply resumes
it (keel.startup). Each case runs in its own interpreter: the collector's state is per process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: Runs keel's `main` in a fresh interpreter, with a spy on `resume_gc` (installed before the
#: loop imports it), and prints what the spy saw and the collector's state afterwards.
CHILD = r"""
import gc, json, sys
import keel.startup as startup
seen = []
real = startup.resume_gc
def spy():
    by = sys._getframe(1).f_code.co_name
    seen.append({"by": by, "enabled": gc.isenabled(), "paused": startup.gc_paused()})
    real()
startup.resume_gc = spy
from keel.cli.main import main
how, args = sys.argv[1], sys.argv[2:]
if how == "process":
    sys.argv = ["keel", *args]
    rc = main()
else:
    rc = main(args)
print(json.dumps({"rc": rc, "first": seen[0] if seen else None, "enabled": gc.isenabled(),
                  "frozen": gc.get_freeze_count() > 0}), file=sys.stderr)
"""


def child(how: str, *args: str, cwd: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, how, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    last = out.stderr.strip().splitlines()[-1]
    result: dict[str, object] = json.loads(last)
    return result


@pytest.mark.usefixtures("isolated_env")
def test_keel_p_runs_its_start_up_without_the_collector_and_the_first_reply_resumes_it(
    project: Path,
) -> None:
    got = child("process", "-p", "hi", "--model", "scripted:demo", cwd=project)
    assert got == {
        "rc": 0,
        "first": {"by": "_stream", "enabled": False, "paused": True},  # off until the first reply
        "enabled": True,
        "frozen": True,  # what start-up built is frozen, not walked by later collections
    }


@pytest.mark.usefixtures("isolated_env")
def test_a_run_that_fails_before_any_reply_still_turns_the_collector_back_on(
    project: Path,
) -> None:
    got = child("process", "-p", "hi", "--model", "anthropic/claude-sonnet-4-5", cwd=project)
    assert got == {
        "rc": 2,  # no key
        "first": {"by": "main", "enabled": False, "paused": True},  # resumed as main ends
        "enabled": True,
        "frozen": True,
    }


@pytest.mark.usefixtures("isolated_env")
def test_a_caller_of_main_and_other_commands_keep_their_collector(project: Path) -> None:
    # A program calling main(argv) keeps its own collector: nothing paused, nothing frozen.
    called = child("call", "-p", "hi", "--model", "scripted:demo", cwd=project)
    assert called == {
        "rc": 0,
        "first": {"by": "_stream", "enabled": True, "paused": False},
        "enabled": True,
        "frozen": False,
    }
    # Commands that may wait long before a reply (or never make one) do not pause it.
    listed = child("process", "sessions", "list", cwd=project)
    assert listed == {
        "rc": 0,
        "first": {"by": "main", "enabled": True, "paused": False},
        "enabled": True,
        "frozen": False,
    }
