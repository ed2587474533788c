"""The fleet's live workers: one entry per worker in the KV bucket `keel-workers`.

A worker rewrites its entry every `streams.WORKER_BEAT` seconds (who it is, what it runs, what it
can serve) and deletes it when it stops cleanly; the bucket's TTL drops an entry that a dead
worker left. An entry whose last beat is older than `streams.WORKER_SILENT` seconds is a silent
worker: dead, stopped or cut off. Readers (`keel workers`, `keel submit`'s checks, a worker
asking whether every live worker refused a run) read the whole bucket with one watch, never key
by key. This module only says who is alive and what each said of itself; it decides nothing
about a run. nats-py is imported only inside the functions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from keel.errors import UserError
from keel.fleet import streams

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

    from keel.fleet.runs import Fleet


async def workers_bucket(js: JetStreamContext, *, create: bool = False) -> KeyValue | None:
    """The `keel-workers` bucket; with `create`, made when missing (a fleet initialised before
    the bucket existed), with as many replicas as the runs' bucket. None when it is missing and
    not made."""
    from nats.js.errors import BucketNotFoundError, NotFoundError

    try:
        return await js.key_value(streams.WORKERS_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        if not create:
            return None
    from keel.fleet.setup import ensure_bucket

    replicas = 1
    try:
        runs = await js.key_value(streams.KV_BUCKET)
        replicas = (await runs.status()).stream_info.config.num_replicas or 1
    except (BucketNotFoundError, NotFoundError):
        pass
    await ensure_bucket(js, streams.WORKERS_BUCKET, replicas=replicas)
    return await js.key_value(streams.WORKERS_BUCKET)


class Registration:
    """One worker's entry: `put` at every beat, `remove` on a clean stop."""

    def __init__(self, kv: KeyValue, name: str) -> None:
        self.kv = kv
        self.key = streams.worker_key(name)

    async def put(self, entry: Mapping[str, Any]) -> None:
        await self.kv.put(self.key, json.dumps(entry, separators=(",", ":")).encode())

    async def remove(self) -> None:
        await self.kv.delete(self.key)


def stamp_beat(entry: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """`entry` with this moment as its beat (`beat` ISO, `beat_at` unix seconds)."""
    now = time.time() if now is None else now
    entry["beat"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    entry["beat_at"] = round(now, 3)
    return entry


async def read_workers(fleet: Fleet, now: float | None = None) -> list[dict[str, Any]]:
    """Every entry in the bucket, by name, each with `age` (seconds since its last beat) and
    `silent` (no beat for `streams.WORKER_SILENT` s). One watch over the bucket; [] when the
    bucket does not exist (no worker of this keel version ever ran)."""
    kv = await workers_bucket(fleet.js)
    if kv is None:
        return []
    from keel.fleet.view import bucket_entries

    out: list[dict[str, Any]] = []
    for entry in await bucket_entries(kv):
        try:
            value = json.loads(entry.value)
        except ValueError:
            continue  # not a worker's entry: someone else wrote it
        if isinstance(value, dict):
            out.append(value)
    now = time.time() if now is None else now
    for value in out:
        try:
            age = max(0.0, now - float(value.get("beat_at") or 0.0))
        except (TypeError, ValueError):
            age = float("inf")
        value["age"] = round(age, 1)
        value["silent"] = age > streams.WORKER_SILENT
    return sorted(out, key=lambda v: str(v.get("name", "")))


async def live_workers(fleet: Fleet) -> list[dict[str, Any]]:
    """The workers whose last beat is recent and that are not stopping."""
    return [w for w in await read_workers(fleet) if not w["silent"] and not w.get("stopping")]


def servable_providers(env: Mapping[str, str], settings: Any = None) -> list[str]:
    """The providers a worker with this environment (and settings) can build a client for: a key
    where one is required, a base URL where there is no default; `scripted` always."""
    from keel.llm.presets import PRESETS, custom_preset
    from keel.llm.provider import env_key

    configs: Mapping[str, Any] = getattr(settings, "providers", None) or {}
    names = ["scripted"]
    for name, preset in PRESETS.items():
        conf = configs.get(name)
        keys = (conf.api_key_env,) if conf is not None and conf.api_key_env else preset.key_envs
        url = (conf.base_url if conf is not None else "") or env_key(preset.url_envs, env)
        if (not preset.key_required or env_key(keys, env)) and (preset.base_url or url):
            names.append(name)
    for name, conf in configs.items():
        if name in PRESETS or not getattr(conf, "wire", ""):
            continue
        try:
            preset = custom_preset(
                name, wire=conf.wire, base_url=conf.base_url, api_key_env=conf.api_key_env
            )
        except UserError:  # a broken entry: the worker cannot serve it
            continue
        if (not preset.key_required or env_key(preset.key_envs, env)) and preset.base_url:
            names.append(name)
    return sorted(names)


def ago(seconds: float) -> str:
    """`2 s ago`, `3 min ago`, `2 h ago`."""
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"
