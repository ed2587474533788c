"""What `keel submit` and `POST /v1/runs` refuse before queueing, against the fleet's live workers
(keel.fleet.checks): the table of cases without a server, then `keel submit` against a real
nats-server whose `keel-workers` bucket holds the workers' entries."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from keel.errors import UserError
from keel.fleet.checks import check_against_workers
from keel.fleet.runs import RunRequest
from keel.llm.provider import ProviderConfig
from tests.fleet_helpers import keel, setup_fleet
from tests.nats_fixture import nats_server, nats_url  # noqa: F401


def _worker(name: str, **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "beat_at": time.time(),
        "providers": ["scripted", "anthropic"],
        "roots": ["/shared"],
        "labels": [],
    }
    entry.update(fields)
    return entry


def _req(model: str | None = "anthropic/claude-sonnet-4-5", **workspace: str) -> RunRequest:
    return RunRequest("r1", "hello", model=model, workspace=dict(workspace))


NO_WORKER = (
    "no worker is up: what the workers need (a key for the model, the workspace under their "
    "roots, labels) is checked when one takes the run"
)


def test_with_no_worker_up_only_an_unknown_provider_is_refused() -> None:
    assert check_against_workers(_req(path="/elsewhere"), [], {}) == [NO_WORKER]
    with pytest.raises(UserError) as caught:
        check_against_workers(_req("nosuch/model"), [], {})
    assert caught.value.message == "unknown provider 'nosuch' in model 'nosuch/model'"
    # A provider the submitter's settings define is known.
    conf = ProviderConfig(wire="openai-chat", base_url="http://127.0.0.1:1/v1")
    assert check_against_workers(_req("mine/m"), [], {"mine": conf}) == [NO_WORKER]
    # A silent worker (no heartbeat for a while) is not up.
    stale = _worker("w1", beat_at=time.time() - 60)
    assert check_against_workers(_req(path="/elsewhere"), [stale], {}) == [NO_WORKER]


def test_a_provider_only_a_worker_knows_is_accepted() -> None:
    worker = _worker("w1", providers=["scripted", "corp"])
    assert check_against_workers(_req("corp/big", path="/shared/app"), [worker], {}) == []


def test_what_no_live_worker_can_serve_is_refused_with_what_they_have() -> None:
    workers = [_worker("w1"), _worker("w2", providers=["openai"], roots=["/data"])]
    with pytest.raises(UserError) as caught:
        check_against_workers(_req("gemini/gemini-2.5-pro"), workers, {})
    assert caught.value.message == (
        "no live worker can run model gemini/gemini-2.5-pro: none has the provider 'gemini' "
        "configured (they have: anthropic, openai, scripted)"
    )
    with pytest.raises(UserError) as caught:
        check_against_workers(_req(path="/srv/app"), workers, {})
    assert caught.value.message == (
        "workspace /srv/app is not under any live worker's roots (/shared)"
    )
    assert "--no-check" in caught.value.hint
    # The root must be one of a worker that also has the model's provider: w2 shares /data but
    # has no anthropic key.
    with pytest.raises(UserError, match="not under any live worker's roots"):
        check_against_workers(_req(path="/data/app"), workers, {})
    assert check_against_workers(_req("openai/gpt-5", path="/data/app"), workers, {}) == []
    # A local git remote counts as the directory it names; a remote URL is the workers' to reach.
    with pytest.raises(UserError, match=r"workspace /srv/app\.git is not under"):
        check_against_workers(_req(git="file:///srv/app.git"), workers, {})
    assert check_against_workers(_req(git="https://example.invalid/app.git"), workers, {}) == []
    # `/shared2` is not under `/shared`.
    with pytest.raises(UserError, match="workspace /shared2/app is not under"):
        check_against_workers(_req(path="/shared2/app"), workers, {})


def test_labels_no_worker_has_are_a_warning() -> None:
    req = _req(path="/shared/app")
    req.needs = ["gpu"]
    warnings = check_against_workers(req, [_worker("w1", labels=["python"])], {})
    assert warnings == [
        "no live worker has the labels gpu (up: w1); the run waits for one "
        "(keel worker --labels gpu)"
    ]
    assert check_against_workers(req, [_worker("w1", labels=["gpu", "python"])], {}) == []


# -- keel submit against a real server ----------------------------------------------------------


async def _register(url: str, *entries: dict[str, Any]) -> None:
    import nats

    from keel.fleet import streams

    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(streams.WORKERS_BUCKET)
        for entry in entries:
            await kv.put(entry["name"], json.dumps(entry).encode())
    finally:
        await nc.close()


@pytest.mark.needs("nats-server")
def test_keel_submit_refuses_what_no_live_worker_can_serve(nats_url: str, tmp_path: Path) -> None:  # noqa: F811
    setup_fleet(nats_url)
    env = {**os.environ, "KEEL_NATS_URL": nats_url}
    shared = tmp_path / "shared"
    (shared / "app").mkdir(parents=True)
    asyncio.run(_register(nats_url, _worker("w1", roots=[str(shared)])))

    out = keel("submit", "hi", "--model", "nosuch/m", "--workspace", "none", env=env)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith("keel: error: unknown provider 'nosuch' in model 'nosuch/m'")

    out = keel("submit", "hi", "--model", "openai/gpt-5", "--workspace", "none", env=env)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        "keel: error: no live worker can run model openai/gpt-5: none has the provider 'openai' "
        "configured (they have: anthropic, scripted) (hint: give a worker a key for openai, or "
        "name another model; --no-check queues it anyway (for workers that are not up yet))\n"
    )

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = keel(
        "submit", "hi", "--model", "scripted:demo", "--workspace", f"path:{elsewhere}", env=env
    )
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].startswith(
        f"keel: error: workspace {elsewhere} is not under any live worker's roots ({shared})"
    )

    # Nothing was queued by the refusals; --no-check and a servable run are.
    listed = keel("runs", "list", "--json", env=env)
    assert json.loads(listed.stdout) == []
    ok = keel(
        "submit",
        "hi",
        "--model",
        "scripted:demo",
        "--workspace",
        f"path:{shared / 'app'}",
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    forced = keel(
        "submit", "hi", "--model", "openai/gpt-5", "--workspace", "none", "--no-check", env=env
    )
    assert forced.returncode == 0, forced.stderr
    listed = json.loads(keel("runs", "list", "--json", env=env).stdout)
    assert sorted(s["id"] for s in listed) == sorted([ok.stdout.strip(), forced.stdout.strip()])


@pytest.mark.needs("nats-server")
def test_an_answer_too_long_for_one_message_is_refused(nats_url: str) -> None:  # noqa: F811
    from keel.fleet.runs import Fleet

    setup_fleet(nats_url)
    waits = {"request": "toolu_1", "tool": "slow", "waits_for": "deferred", "question": ""}

    async def go() -> str:
        fleet = await Fleet.open(nats_url)
        try:
            await fleet.put_summary("r1", status="parked", waits_on=waits)
            with pytest.raises(UserError) as caught:
                await fleet.answer("r1", "toolu_1", None, result="x" * 2_000_000)
            assert await fleet.get_answer("r1", "toolu_1") is None  # nothing stored
            return caught.value.one_line()
        finally:
            await fleet.close()

    assert asyncio.run(go()) == (
        "the answer is 2,000,000 bytes: too long for one message on the fleet's NATS server "
        "(at most 1,032,192 bytes) (hint: put the text in a file in the run's workspace and "
        "answer with its path)"
    )


def test_a_summary_too_long_for_one_message_is_cut_to_fit() -> None:
    from keel.fleet.runs import fit_summary

    small = {"id": "r1", "status": "completed", "text": "done"}
    assert fit_summary(dict(small), 1 << 20) == json.dumps(small, separators=(",", ":")).encode()
    for char in ("x", "é", "\u2603", '"'):  # 1, 2 and 3 UTF-8 bytes; a quote JSON escapes
        summary = {
            "id": "r1",
            "status": "completed",
            "text": char * 1_500_000,
            "request": {"run": "r1", "prompt": "p" * 900_000},
        }
        value = fit_summary(summary, 1 << 20)
        assert len(value) <= (1 << 20) - 1024
        stored = json.loads(value)
        assert stored == summary  # cut in place: what is returned is what was stored
        assert stored["text"].endswith("more characters; the run's journal has the whole text]")
        assert stored["text"].startswith(char * 1000)
