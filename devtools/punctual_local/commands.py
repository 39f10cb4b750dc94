"""The development commands of ``punctual``: ``local up|env|down`` (the whole system on
this machine) and ``stats`` (its operations figures). They reach the CLI through the entry
point group ``punctual.commands`` (pyproject.toml): the client names none of them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from punctual_client.commands import CommandFailed, UsageError, stop_on_signals


def add_local_commands(commands: Any) -> None:
    """Register ``local`` and ``stats`` on the ``punctual`` subparsers."""
    stats = commands.add_parser("stats", help="operations figures of the local stack")
    stats.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    stats.add_argument("--minutes", type=int, default=60, help="occurrences of the last N (60)")
    stats.set_defaults(run=run_stats)

    local = commands.add_parser("local", help="the whole system on this machine")
    local_commands = local.add_subparsers(dest="action", required=True)
    up = local_commands.add_parser("up", help="start engines and drivers (Ctrl-C stops)")
    up.add_argument("--port", type=int, default=8766, help="the API's port (8766)")
    up.add_argument("--data", type=Path, help="data folder (default: .data in the repo)")
    up.add_argument("--tick", type=int, default=60, help="seconds between ticks (60)")
    up.add_argument("--lookahead", type=int, default=180, help="materializer lookahead (180)")
    up.add_argument("--reconcile-every", type=int, default=600, help="seconds (600)")
    up.add_argument("--demo", action="store_true", help="create demo schedules, run a worker")
    env = local_commands.add_parser(
        "env", help="print the exports that point AWS SDKs and workers at the local engines"
    )
    env.add_argument("--data", type=Path, help="data folder (default: .data in the repo)")
    env.add_argument("--port", type=int, default=8766, help="the API's port (8766)")
    down = local_commands.add_parser(
        "down", help="stop the engines a killed `local up` left running (data is kept)"
    )
    down.add_argument("--data", type=Path, help="data folder (default: .data in the repo)")
    local.set_defaults(run=run_local)


def run_local(args: argparse.Namespace) -> int:
    from punctual_local.stack import DATA

    data = args.data or DATA
    if args.action == "env":
        from punctual_local.engines import running_environment

        found = running_environment(data)
        if found is None:
            raise UsageError("no local engines are running; start them with `punctual local up`")
        for name, value in {**found, "PUNCTUAL_ENDPOINT": f"http://127.0.0.1:{args.port}"}.items():
            print(f"export {name}={value}")
        return 0
    if args.action == "down":
        return _local_down(data)
    return _local_up(args, data)


def _local_up(args: argparse.Namespace, data: Path) -> int:
    from punctual.dal.tables import SchemaMismatch
    from punctual_local.dynamodb import EngineMissing
    from punctual_local.stack import LocalStack, StackError, StackOptions

    options = StackOptions(
        port=args.port,
        data=data,
        tick_seconds=args.tick,
        lookahead_seconds=args.lookahead,
        reconcile_seconds=args.reconcile_every,
    )
    stack = LocalStack(options)
    stop = stop_on_signals()
    try:
        stack.start()
    except SchemaMismatch as error:
        raise UsageError(f"{error} (--data {data})") from None
    except (StackError, EngineMissing) as error:
        raise CommandFailed(str(error)) from None
    assert stack.engines is not None
    assert stack.gateway is not None
    engines = stack.engines
    state = "reattached to" if engines.reattached else "started"
    print(f"Punctual local: API {stack.gateway.url} (data in {data})", flush=True)
    print(f"  console {stack.gateway.url}/console (read-only, in a browser)", flush=True)
    print(
        f"  engines {state}: DynamoDB {engines.dynamodb.endpoint}, SQS {engines.sqs.endpoint}",
        flush=True,
    )
    if stack.restored:
        print(
            f"  re-created the missing queues of {', '.join(stack.restored)} (a data folder "
            "from before the SQS engine kept its data: messages sent before are gone)",
            flush=True,
        )
    print(
        "  sign requests with access key id 'demo' (tenant demo) or 'operator'; "
        "signatures are not verified (loopback only)",
        flush=True,
    )
    if args.demo:
        stack.start_demo()
    while not stop.wait(0.5):
        pass
    print("stopping: drivers, then engines...", flush=True)
    stack.stop()
    print(f"stopped; everything is kept in {data}: `local up` carries on from it", flush=True)
    return 0


def _local_down(data: Path) -> int:
    from punctual_local.engines import recorded
    from punctual_local.stack import StackError, claim

    try:
        lock = claim(data, "`local down`")
    except StackError as error:
        raise CommandFailed(str(error)) from None  # its Ctrl-C stops its engines
    with lock:
        running = [engine for engine in recorded(data).values() if engine.alive()]
        for engine in running:
            engine.stop()
    names = ", ".join(f"{e.name} (pid {e.pid})" for e in running) or "no engine was running"
    print(f"stopped: {names}; data kept in {data}", flush=True)
    return 0


def _drain_line(drain: dict[str, Any]) -> str:
    from punctual.drain import NOT_DRAINING

    if not drain["backlog"]:
        return "0"
    seconds = drain["drain_seconds"]
    eta = "not draining" if seconds >= NOT_DRAINING else f"drains in ~{seconds} s"
    return (
        f"{drain['backlog']}, oldest due {drain['oldest_due']} "
        f"({drain['oldest_age_seconds']} s ago), {drain['taken_per_minute']}/min taken, {eta}"
    )


def run_stats(args: argparse.Namespace) -> int:
    from punctual.services import Services
    from punctual_local.stats import figures

    services = Services.from_environment()
    found = figures(services, int(services.now()) - args.minutes * 60)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    print(f"occurrences (last {args.minutes} min): {found['occurrences']}")
    for kind, lag in found["lag_seconds"].items():
        print(
            f"schedule lag {kind}: p50 {lag['p50']:.0f} s, p95 {lag['p95']:.0f} s, "
            f"p99 {lag['p99']:.0f} s ({lag['n']} sent)"
        )
    print(f"schedules: {found['schedules']}, MISSED (summaries) {found['missed_summarized']}")
    drain = found["drain"]
    print(f"backlog (due, not taken): {_drain_line(drain)}")
    for tenant in drain["largest_tenants"]:
        print(f"  {tenant['tenant_id']}: {_drain_line(tenant)}")
    r = found["reconcile"]
    print(
        f"reconciler, last window: {r['shards_reported']} shard reports, "
        f"MISSING {r['missing']}, UNEXPECTED {r['unexpected']}"
    )
    return 0
