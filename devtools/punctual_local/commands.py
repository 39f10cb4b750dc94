"""The development commands of ``punctual``: ``local up|env|down`` (the whole system on
this machine) and ``stats`` (its operations figures). They reach the CLI through the entry
point group ``punctual.commands`` (pyproject.toml): the client names none of them."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from punctual_client.commands import CommandFailed, UsageError, stop_on_signals

if TYPE_CHECKING:
    from punctual.services import Services

DEFAULT_PORT = 8766


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


PORT = _int_at_least(0, 65535)  # 0: any free port
POSITIVE = _int_at_least(1)


DATA_HELP = "data folder (default: $PUNCTUAL_LOCAL_DATA, else .data in the repo)"


def add_local_commands(commands: Any) -> None:
    """Register ``local`` and ``stats`` on the ``punctual`` subparsers."""
    stats = commands.add_parser("stats", help="operations figures of the local stack")
    stats.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    stats.add_argument(
        "--minutes", type=POSITIVE, default=60, help="occurrences of the last N (60)"
    )
    stats.add_argument(
        "--data",
        type=Path,
        help="the stack's data folder, whose engines are read (default: "
        "$PUNCTUAL_LOCAL_DATA, else .data in the repo; "
        "the exports of `punctual local env`, when set, come first)",
    )
    stats.set_defaults(run=run_stats)

    local = commands.add_parser("local", help="the whole system on this machine")
    local_commands = local.add_subparsers(dest="action", required=True)
    up = local_commands.add_parser("up", help="start engines and drivers (Ctrl-C stops)")
    up.add_argument(
        "--port", type=PORT, default=DEFAULT_PORT, help=f"the API's port ({DEFAULT_PORT})"
    )
    up.add_argument("--data", type=Path, help=DATA_HELP)
    up.add_argument("--tick", type=POSITIVE, default=60, help="seconds between ticks (60)")
    up.add_argument(
        "--lookahead", type=_int_at_least(0), default=180, help="materializer lookahead (180)"
    )
    up.add_argument("--reconcile-every", type=POSITIVE, default=600, help="seconds (600)")
    up.add_argument("--demo", action="store_true", help="create demo schedules, run a worker")
    env = local_commands.add_parser(
        "env", help="print the exports that point AWS SDKs and workers at the local engines"
    )
    env.add_argument("--data", type=Path, help=DATA_HELP)
    env.add_argument(
        "--port", type=PORT, help="the API's port (default: the one the stack on --data serves)"
    )
    down = local_commands.add_parser(
        "down", help="stop the engines a killed `local up` left running (data is kept)"
    )
    down.add_argument("--data", type=Path, help=DATA_HELP)
    local.set_defaults(run=run_local)


def run_local(args: argparse.Namespace) -> int:
    from punctual_local.stack import DATA

    data = args.data or DATA
    if args.action == "env":
        from punctual_local.engines import running_environment

        found = running_environment(data)
        if found is None:
            raise UsageError("no local engines are running; start them with `punctual local up`")
        for name, value in {**found, "PUNCTUAL_ENDPOINT": _local_api(data, args.port)}.items():
            print(f"export {name}={value}")
        return 0
    if args.action == "down":
        return _local_down(data)
    return _local_up(args, data)


def _local_api(data: Path, port: int | None) -> str:
    """The API's URL: ``port`` if given, else the one the stack on ``data`` serves (its lock
    file names it). Engines without a stack (its `local up` was killed): the URL it served,
    said on stderr (what `eval` leaves on the terminal)."""
    from punctual_local.stack import recorded_api

    if port is not None:
        return f"http://127.0.0.1:{port}"
    found = recorded_api(data)
    if found is not None and found.serving:
        return found.url
    url = found.url if found is not None else f"http://127.0.0.1:{DEFAULT_PORT}"
    print(
        f"punctual: note: no `local up` serves the API on {data} now (its engines run on: "
        f"was it killed?); `punctual local up --data {data}` reattaches to them. "
        f"PUNCTUAL_ENDPOINT is the API it served last, {url}",
        file=sys.stderr,
    )
    return url


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
    if args.demo and not stop.is_set():  # (asked to stop while starting: no demo)
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
    from punctual.domain.drain import NOT_DRAINING

    if not drain["backlog"]:
        return "0"
    seconds = drain["drain_seconds"]
    eta = "not draining" if seconds >= NOT_DRAINING else f"drains in ~{seconds} s"
    return (
        f"{drain['backlog']}, oldest due {drain['oldest_due']} "
        f"({drain['oldest_age_seconds']} s ago), {drain['taken_per_minute']}/min taken, {eta}"
    )


def _counts(counts: dict[str, int]) -> str:
    """``{'SUCCEEDED': 3, 'RUNNING': 1}`` as ``3 SUCCEEDED, 1 RUNNING`` (most first)."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{n} {state}" for state, n in ranked if n) or "none"


# How `punctual stats` names each step of an occurrence's time (stats.state_time_figures).
STEP_WORDS = {
    "to_receivable": "due -> receivable",
    "to_claim": "receivable -> claimed",
    "run": "run",
    "retry_wait": "retry wait",
}


def stats_lines(found: dict[str, Any], minutes: int) -> list[str]:
    """`punctual stats` for people: one line per figure, the largest tenants' backlogs
    indented under the overall one."""
    from punctual.timing import utc_text

    lines = [f"occurrences (last {minutes} min): {_counts(found['occurrences'])}"]
    if found.get("unreadable"):
        lines.append(
            f"occurrence items unreadable, whole table (a tenant's bad data, left out of "
            f"every figure): {found['unreadable']}"
        )
    for kind, lag in found["lag_seconds"].items():
        lines.append(
            f"schedule lag {kind}: p50 {lag['p50']:.0f} s, p95 {lag['p95']:.0f} s, "
            f"p99 {lag['p99']:.0f} s ({lag['n']} sent)"
        )
    if not found["lag_seconds"]:
        lines.append(f"schedule lag: nothing sent in the last {minutes} min")
    if waited := found.get("waited_for_a_worker_seconds"):
        lines.append(
            f"waited for a worker (claimed - due): p50 {waited['p50']:.0f} s, "
            f"p95 {waited['p95']:.0f} s, p99 {waited['p99']:.0f} s ({waited['n']} claimed)"
        )
    for lane, steps in found.get("time_in_state_seconds", {}).items():
        spent = "; ".join(
            f"{STEP_WORDS[step]} p50 {spread['p50']:.0f} s, p99 {spread['p99']:.0f} s"
            f" ({spread['n']})"
            for step, spread in steps.items()
        )
        lines.append(f"time in each state, {lane}: {spent}")
    lines.append(
        f"schedules: {_counts(found['schedules'])}; "
        f"fires recorded MISSED (misfire policy): {found['missed_summarized']}"
    )
    drain = found["drain"]
    lines.append(f"backlog (due, not taken): {_drain_line(drain)}")
    lines += [f"  {t['tenant_id']}: {_drain_line(t)}" for t in drain["largest_tenants"]]
    r = found["reconcile"]
    window = f"{utc_text(r['window_start'])} .. {utc_text(r['window_end'])}"
    if not r["shards_reported"]:
        lines.append(f"reconciler, last window {window}: not reconciled yet")
    else:
        lines.append(
            f"reconciler, last window {window}: {r['shards_reported']} shard reports, "
            f"MISSING {r['missing']}, UNEXPECTED {r['unexpected']}"
        )
    return lines


def _local_services(data: Path) -> Services:
    """The services over the local engines: those `eval "$(punctual local env)"` exported,
    else those of the stack on ``data`` (never AWS's: the figures scan whole tables)."""
    from punctual.services import Services
    from punctual.settings import get_settings
    from punctual_local.engines import running_environment

    if not os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"):
        found = running_environment(data)
        if found is None:
            raise UsageError(
                f"no local engines are running on {data}; start them with `punctual local up` "
                "(or give the stack's --data)"
            )
        os.environ.update(found)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
        get_settings.cache_clear()
    return Services.from_environment()


def run_stats(args: argparse.Namespace) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    from punctual_local.stack import DATA
    from punctual_local.stats import figures

    services = _local_services(args.data or DATA)
    try:
        found = figures(services, int(services.now()) - args.minutes * 60)
    except (BotoCoreError, ClientError) as error:
        raise CommandFailed(f"reading the local tables: {error}") from None
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    for line in stats_lines(found, args.minutes):
        print(line)
    return 0
