"""`keel fleet up|down|status|init`: the fleet's NATS server, from the command line.

`up` starts a local nats-server in the background and prints its URL as the LAST line (scripts
take `tail -1`); `down` stops it; `status` shows the server, the streams, the consumers and the
work queue's depth; `init` creates the streams on any server (`KEEL_NATS_URL`), or with
`--check` verifies a set an operator made. Parsing and printing only: keel.fleet.local and
keel.fleet.setup do the work (docs/fleet.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def parser() -> argparse.ArgumentParser:
    from keel.cli.main import _Parser

    p = _Parser(prog="keel fleet", description="The fleet's NATS server (docs/fleet.md).")
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("up", help="start a local nats-server with JetStream in the background")
    s.add_argument(
        "--port",
        type=int,
        default=0,
        help="client port (default: the one it had last, else a free one)",
    )
    s.add_argument(
        "--data",
        type=Path,
        default=None,
        help="JetStream directory (default: KEEL_HOME/fleet/data)",
    )
    s = sub.add_parser("down", help="stop the local nats-server")
    s.add_argument("--purge", action="store_true", help="also delete its JetStream data")
    s = sub.add_parser("status", help="the server, streams, consumers and queue depth")
    s.add_argument("--url", default="", help="the server (default: KEEL_NATS_URL, else local)")
    s.add_argument("--json", action="store_true", help="JSON output")
    s = sub.add_parser("init", help="create the fleet's streams (or --check them) on a server")
    s.add_argument("--url", default="", help="the server (default: KEEL_NATS_URL, else local)")
    s.add_argument("--replicas", type=int, default=1, help="stream replicas (1, 3 or 5)")
    s.add_argument(
        "--check", action="store_true", help="create nothing: verify streams an operator made"
    )
    return p


def fleet(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.action == "up":
        return _up(args)
    if args.action == "down":
        return _down(args)
    if args.action == "status":
        return _status(args)
    return _init(args)


def _up(args: argparse.Namespace) -> int:
    from keel.errors import UserError
    from keel.fleet import local

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a port", hint="0 picks a free one")
    result = local.up(args.port, args.data)
    for note in result.notes:
        print(f"keel: note: {note}", file=sys.stderr)
    for warning in result.warnings:
        print(f"keel: warning: {warning}", file=sys.stderr)
    named = os.environ.get("KEEL_NATS_URL", "")
    if named and named != result.url:
        print(
            f"keel: warning: KEEL_NATS_URL is set ({named}): fleet commands use that server, "
            "not this local fleet (unset it to use this one)",
            file=sys.stderr,
        )
    if result.started:
        print(f"local fleet up: nats-server pid {result.pid}, JetStream in {result.data_dir}")
    else:
        print(f"local fleet already up: nats-server pid {result.pid}")
    print(result.url)
    return 0


def _down(args: argparse.Namespace) -> int:
    from keel.fleet import local

    result = local.down(purge=args.purge)
    for note in result.notes:
        print(f"keel: note: {note}", file=sys.stderr)
    if result.stopped is None:
        print("no local fleet was running")
    else:
        print(f"local fleet down: nats-server pid {result.stopped} stopped")
    if result.purged is not None:
        print(f"removed {result.purged}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from keel.fleet import local
    from keel.fleet.connect import FleetError

    try:
        report = local.status(url=args.url)
    except FleetError as exc:
        if args.json:
            print(json.dumps({"local": local.local_status().as_json(), "error": exc.one_line()}))
        else:
            print(_local_text(local.local_status().as_json()))
        print(f"keel: error: {exc.one_line()}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_status_text(report))
    return 0


def _local_text(loc: dict[str, Any]) -> str:
    if loc["up"]:
        return f"local fleet: up, pid {loc['pid']}, {loc['url']}, data {loc['data_dir']}"
    return f"local fleet: down ({loc['note']})"


def _status_text(report: dict[str, Any]) -> str:
    server = report["server"]
    js = server["jetstream"]
    lines = [
        _local_text(report["local"]),
        f"server: {report['target']} (nats-server {server['version']}"
        + (f", {server['name']}" if server["name"] else "")
        + f"); JetStream: {js['streams']} streams, {js['consumers']} consumers, "
        f"{js['storage_bytes']} bytes stored",
    ]
    for s in report["streams"]:
        if not s["present"]:
            lines.append(f"  {s['name']}: missing (`keel fleet init` creates it)")
            continue
        cluster = ""
        if s["peers"]:
            peers = ", ".join(
                p["name"] + ("" if p["current"] and not p["offline"] else " (behind)")
                for p in s["peers"]
            )
            cluster = f", leader {s['leader']}, peers {peers}"
        lines.append(
            f"  {s['name']}: {s['messages']} messages, {s['bytes']} bytes, "
            f"R{s['replicas']}, {s['retention']}{cluster}"
        )
    for c in report["consumers"]:
        lines.append(
            f"  consumer {c['stream']}/{c['name']}: {c['pending']} pending, "
            f"{c['in_flight']} in flight, {c['redelivered']} redelivered, {c['waiting']} waiting"
        )
    queue = report["queue"]
    if queue["pending"] is not None:
        lines.append(f"queue: {queue['pending']} pending, {queue['in_flight']} in flight")
    return "\n".join(lines)


def _init(args: argparse.Namespace) -> int:
    import asyncio

    from keel.errors import UserError
    from keel.fleet import local
    from keel.fleet.connect import FleetError, connect, resolve_url

    if args.replicas < 1 or args.replicas > 5:
        raise UserError(
            f"--replicas {args.replicas}: JetStream takes 1 to 5", hint="3 for a 3-node cluster"
        )
    try:
        from keel.fleet.setup import ensure_streams
    except ImportError:
        raise UserError(
            "this keel cannot create streams yet (keel.fleet.setup is missing)",
            hint="update keel",
        ) from None
    url = resolve_url(given=args.url)
    local.preflight(url)

    async def run() -> list[str]:
        import nats.errors

        nc = await connect(url, name="keel fleet init", reconnect=False)
        try:
            return list(
                await ensure_streams(nc.jetstream(), replicas=args.replicas, create=not args.check)
            )
        except (nats.errors.Error, TimeoutError) as exc:
            # e.g. more replicas than the cluster has servers ("insufficient resources")
            why = str(exc) or type(exc).__name__
            raise FleetError(
                f"cannot set up the fleet's streams on {url}: {why}",
                hint="--replicas must not exceed the servers in the cluster (`keel fleet status`)",
            ) from None
        finally:
            await nc.close()

    notes = asyncio.run(run())
    for note in notes:
        print(f"keel: note: {note}", file=sys.stderr)
    verb = "checked" if args.check else "ready"
    print(f"fleet streams {verb} on {url}")
    return 0
