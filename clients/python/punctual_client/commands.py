"""The API client commands of ``punctual`` (tenants, targets, schedules, occurrences)
and the worker. Exit codes: 0 success, 2 a 4xx answer or bad input
(one line on stderr), 1 any other failure."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from punctual.domain.occurrence import OccurrenceState
from punctual.timing import utc_text
from punctual_client.http import (
    ApiError,
    BadAnswer,
    BadArgument,
    BadEndpoint,
    Client,
    segment,
)

if TYPE_CHECKING:
    from punctual_client.worker import Job


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


class CommandFailed(Exception):
    """Anything else that stops a command: one line on stderr, exit code 1."""


# `punctual worker` polls this long: Ctrl-C stops it within that (and its handlers' time).
WORKER_POLL_SECONDS = 2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: the terminal closed


# --- parser -----------------------------------------------------------------------------


def spec_flags(parser: argparse.ArgumentParser, required: bool) -> None:
    kind = parser.add_mutually_exclusive_group(required=required)
    kind.add_argument("--cron", metavar="EXPR", help="5-field cron expression or @macro")
    kind.add_argument("--rate", metavar="SPEC", help="e.g. 'rate(15 minutes)'")
    kind.add_argument("--at", metavar="ISO", help="one instant, with offset or local in --tz")
    parser.add_argument("--tz", metavar="ZONE", help="IANA zone (required with --cron)")
    parser.add_argument("--start", metavar="ISO", help="no fire before (inclusive)")
    parser.add_argument("--end", metavar="ISO", help="no fire after (inclusive)")
    parser.add_argument(
        "--dst-gap",
        choices=["SKIP", "SHIFT"],
        help="a wall time the clocks skip: SKIP it (default) or SHIFT it to the gap's end",
    )
    parser.add_argument(
        "--dst-repeat",
        choices=["FIRST", "LAST", "BOTH"],
        help="a wall time that occurs twice: fire at the FIRST (default), LAST or BOTH",
    )


def _definition_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", metavar="NAME")
    parser.add_argument("--payload", metavar="JSON", help="a JSON object")
    parser.add_argument("--flex", type=int, metavar="SECONDS", help="flexible window")
    parser.add_argument("--misfire", choices=["SKIP", "FIRE_ONCE", "CATCHUP"])
    parser.add_argument("--max-lateness", type=int, metavar="S")
    parser.add_argument("--catchup-limit", type=int, metavar="K")
    parser.add_argument("--overlap", choices=["ALLOW", "SKIP_IF_RUNNING", "QUEUE_ONE"])
    parser.add_argument("--name")


# Adds one command to ``punctual``'s subparsers: its name and help line.
_AddCommand = Callable[[str, str], argparse.ArgumentParser]


def add_client_commands(commands: Any, endpoint_flags: argparse.ArgumentParser) -> None:
    """Register the commands on the ``punctual`` subparsers (in the order ``--help`` lists
    them)."""

    def add(name: str, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(
            name, help=help, parents=[endpoint_flags]
        )
        return parser

    _add_tenant_commands(add, endpoint_flags)
    _add_target_commands(add, endpoint_flags)
    _add_schedule_commands(add)
    _add_run_commands(add)
    _add_operator_commands(add, endpoint_flags)
    _add_worker_command(add)


def _add_tenant_commands(add: _AddCommand, endpoint_flags: argparse.ArgumentParser) -> None:
    """The operator's ``tenants create``, ``tenants list`` and ``tenants worker-policy``,
    and the tenant's own ``worker-policy``."""
    tenants = add("tenants", "operator: create and list tenants")
    tenant_commands = tenants.add_subparsers(dest="action", required=True)
    create_tenant = tenant_commands.add_parser("create", parents=[endpoint_flags])
    create_tenant.add_argument("tenant_id", metavar="ID")
    create_tenant.add_argument("--principal", metavar="ARN", required=True)
    create_tenant.add_argument("--max-schedules", type=int)
    create_tenant.add_argument("--max-strict-fires-per-minute", type=int)
    create_tenant.add_argument("--max-concurrency", type=int)
    create_tenant.add_argument("--catchup-per-minute", type=int)
    create_tenant.add_argument("--max-manual-runs-per-minute", type=int)
    create_tenant.add_argument("--max-backfill-occurrences", type=int)
    tenant_commands.add_parser(
        "list", parents=[endpoint_flags], help="every tenant, with its schedules"
    )
    tenant_policy = tenant_commands.add_parser(
        "worker-policy",
        parents=[endpoint_flags],
        help="the IAM policy for the role a tenant's workers run as",
    )
    tenant_policy.add_argument("tenant_id", metavar="ID")
    add("worker-policy", "the IAM policy for the role your workers run as")


def _add_target_commands(add: _AddCommand, endpoint_flags: argparse.ArgumentParser) -> None:
    targets = add("targets", "your targets (one SQS queue each)")
    target_commands = targets.add_subparsers(dest="action", required=True)
    create_target = target_commands.add_parser("create", parents=[endpoint_flags])
    create_target.add_argument("name", metavar="NAME")
    early = (
        "its consumers run the worker SDK: messages may arrive up to 1 s early, held to the instant"
    )
    create_target.add_argument("--early-delivery", action="store_true", help=early)
    update_target = target_commands.add_parser("update", parents=[endpoint_flags])
    update_target.add_argument("name", metavar="NAME")
    update_target.add_argument("--early-delivery", required=True, choices=["on", "off"], help=early)
    target_commands.add_parser("list", parents=[endpoint_flags])


def _add_schedule_commands(add: _AddCommand) -> None:
    """Create and update a schedule, and the commands that name one by its id."""
    create = add("create", "create a schedule")
    spec_flags(create, required=True)
    _definition_flags(create)
    create.add_argument("--idempotency-key", metavar="KEY")

    update = add("update", "update a schedule (a new version)")
    update.add_argument("schedule_id", metavar="ID")
    spec_flags(update, required=False)
    _definition_flags(update)

    get = add("get", "a schedule, its next fires and how its last fires went")
    get.add_argument("schedule_id", metavar="ID")
    get.add_argument(
        "--recent",
        type=int,
        metavar="N",
        help="how many of the last fires the figures cover (default 100, at most 500; 0: none)",
    )
    for name, text in (
        ("pause", "pause a schedule"),
        ("resume", "resume a schedule"),
        ("cancel", "cancel a schedule"),
        ("versions", "a schedule's versions, newest first"),
    ):
        add(name, text).add_argument("schedule_id", metavar="ID")


def _add_run_commands(add: _AddCommand) -> None:
    """A schedule's occurrences, the manual runs (``trigger``, ``backfill``), the listing of
    schedules and one occurrence with its attempts."""
    occurrences = add("occurrences", "a schedule's occurrences, and the fires it MISSED")
    occurrences.add_argument("schedule_id", metavar="ID")
    occurrences.add_argument(
        "--from", dest="since", metavar="ISO", help="due at or after this (with its offset)"
    )
    occurrences.add_argument(
        "--to", dest="until", metavar="ISO", help="due at or before this (with its offset)"
    )
    occurrences.add_argument(
        "--state", choices=[s.value for s in OccurrenceState], help="only the ones in this state"
    )
    trigger = add("trigger", "run a schedule now: one manual occurrence, receivable at once")
    trigger.add_argument("schedule_id", metavar="ID")
    trigger.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="the same key runs once (default: a new key per command, kept on its retries)",
    )
    backfill = add(
        "backfill", "an occurrence for every fire in [--from, --to) that has none (not twice)"
    )
    backfill.add_argument("schedule_id", metavar="ID")
    backfill.add_argument("--from", dest="since", required=True, metavar="INSTANT")
    backfill.add_argument("--to", dest="until", required=True, metavar="INSTANT")
    backfill.add_argument(
        "--dry-run", action="store_true", help="count and show the first ones; make nothing"
    )
    ledger = add(
        "ledger",
        "your occurrences across all schedules: each checked hour's exceptions and counts, "
        "then the upcoming fires",
    )
    ledger.add_argument("--from", dest="since", metavar="ISO", help="default: a day ago")
    ledger.add_argument("--to", dest="until", metavar="ISO", help="default: in an hour")
    ledger.add_argument(
        "--state", metavar="S[,S]", help="DEAD, MISSED, ..., MISSING (never made), UPCOMING"
    )
    ledger.add_argument("--finding", metavar="F[,F]", help="the reconciler's: MISSING, DEAD, ...")
    ledger.add_argument("--target", metavar="NAME")
    ledger.add_argument(
        "--all",
        action="store_true",
        help="every occurrence of the hours read live (the last three not yet checked), "
        "not only the exceptions",
    )
    listing = add("list", "your schedules")
    listing.add_argument("--state", choices=["ACTIVE", "PAUSED", "CANCELED", "COMPLETED"])
    add("occurrence", "one occurrence with its attempts").add_argument(
        "occurrence_id", metavar="OCC_ID"
    )


def _add_operator_commands(add: _AddCommand, endpoint_flags: argparse.ArgumentParser) -> None:
    reconcile = add("reconcile", "operator: the reconciler's reports")
    reconcile_commands = reconcile.add_subparsers(dest="action", required=True)
    report = reconcile_commands.add_parser("report", parents=[endpoint_flags])
    report.add_argument("--from", dest="window_from", metavar="ISO", help="window start")
    report.add_argument("--to", dest="window_to", metavar="ISO", help="window end")


def _add_worker_command(add: _AddCommand) -> None:
    worker = add("worker", "run a worker on one of your targets' queue")
    worker.add_argument("--target", metavar="NAME", default="default")
    worker.add_argument(
        "--handler",
        metavar="MODULE:FUNCTION",
        default="punctual_client.commands:print_occurrence",
        help="called with each Job (default: print it with its lag)",
    )
    worker.add_argument("--threads", type=int, default=4, help="handlers at once (4)")


# --- running them -----------------------------------------------------------------------


def _json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UsageError(f"{flag}: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: must be a JSON object")
    return value


def _spec(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.cron is not None:
        if args.tz is None:
            raise UsageError("--tz is required with --cron (an IANA zone, e.g. Europe/Berlin)")
        spec: dict[str, Any] = {"kind": "cron", "expression": args.cron, "timezone": args.tz}
    elif args.rate is not None:
        spec = {"kind": "rate", "expression": args.rate, "timezone": args.tz or "UTC"}
    elif args.at is not None:
        spec = {"kind": "at", "at": args.at} | ({"timezone": args.tz} if args.tz else {})
    elif args.start or args.end or args.tz:
        raise UsageError("--tz, --start and --end need --cron, --rate or --at")
    else:
        return None
    if args.start:
        spec["start_at"] = args.start
    if args.end:
        spec["end_at"] = args.end
    if dst := dst_flags(vars(args)):
        spec["dst"] = dst
    return spec


def _names_offset(at: str | None) -> bool:
    """Whether an ``--at`` names its UTC offset (unreadable: left to the API to say)."""
    try:
        return (
            at is not None and datetime.fromisoformat(at.replace("Z", "+00:00")).tzinfo is not None
        )
    except ValueError:
        return False


def dst_flags(flags: dict[str, Any]) -> dict[str, str]:
    """The DST choice the flags give (``--dst-gap``, ``--dst-repeat``): only what was given."""
    given = (("gap", flags.get("dst_gap")), ("repeat", flags.get("dst_repeat")))
    return {key: value for key, value in given if value is not None}


_SPEC_FLAGS = {
    "cron": None,
    "rate": None,
    "at": None,
    "tz": None,
    "start": None,
    "end": None,
    "dst_gap": None,
    "dst_repeat": None,
}


def _update_body(args: argparse.Namespace, current: dict[str, Any]) -> dict[str, Any]:
    """``update``'s changes, its spec flags laid over the current spec (the API takes a
    whole spec): `--tz` alone moves the schedule's zone, `--end` alone its end, `--dst-gap`
    alone its gap choice; a new `--cron` keeps the zone, bounds and DST choice unless given
    (a rate has no DST choice)."""
    flags = vars(args)
    body = _definition(argparse.Namespace(**(flags | _SPEC_FLAGS)))
    kept = {k: v for k, v in current.items() if v is not None}
    dst = kept.pop("dst", {}) | dst_flags(flags)
    if any(flags.get(kind) is not None for kind in ("cron", "rate", "at")):
        inherited = {
            flag: kept[field]
            for flag, field in (("tz", "timezone"), ("start", "start_at"), ("end", "end_at"))
            if flags.get(flag) is None and field in kept
        }
        spec = _spec(argparse.Namespace(**(flags | inherited)))
        assert spec is not None
        if flags.get("rate") is not None or _names_offset(flags.get("at")):
            # (the API refuses a DST choice on a rate, or on an instant with its offset)
            dst = dst_flags(flags)
    elif any(flags.get(flag) for flag in ("tz", "start", "end", "dst_gap", "dst_repeat")):
        spec = kept | {
            field: flags[flag]
            for flag, field in (("tz", "timezone"), ("start", "start_at"), ("end", "end_at"))
            if flags.get(flag)
        }
    else:
        return body
    return body | {"spec": spec | ({"dst": dst} if dst else {})}


def _definition(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    spec = _spec(args)
    if spec is not None:
        body["spec"] = spec
    for flag, key in (("target", "target"), ("name", "name"), ("overlap", "overlap")):
        if getattr(args, flag) is not None:
            body[key] = getattr(args, flag)
    payload = _json_object(args.payload, "--payload")
    if payload is not None:
        body["payload"] = payload
    if args.flex is not None:
        body["flexible_window_seconds"] = args.flex
    misfire = {
        key: value
        for key, value in (
            ("action", args.misfire),
            ("max_lateness_seconds", args.max_lateness),
            ("catchup_limit", args.catchup_limit),
        )
        if value is not None
    }
    if misfire:
        body["misfire"] = misfire
    return body


def _flat(saved: dict[str, Any]) -> dict[str, Any]:
    """A change's answer with the schedule's fields at the top (schedule_id, state, ...)."""
    return {**saved["schedule"], **{k: v for k, v in saved.items() if k != "schedule"}}


def _rule(spec: dict[str, Any]) -> str:
    """A spec in one phrase: ``cron '0 9 * * *' Asia/Tokyo``."""
    when = spec.get("expression") or spec.get("at")
    return f"{spec['kind']} {when!r} {spec.get('timezone') or 'UTC'}"


def _print_schedule(found: dict[str, Any]) -> None:
    runs = found.get("run_version", found["version"])
    fires = "" if runs == found["version"] else f" (fires of v{runs})"
    print(
        f"{found['schedule_id']}  {found['state']}  v{found['version']}{fires}  "
        f"{_rule(found['spec'])}  -> {found['target']}"
    )
    for fire in found.get("next_fires", []):
        made = f"  made as {fire['occurrence_id']}" if fire.get("occurrence_id") else ""
        print(f"  next  {fire['utc']}  ({fire['local']}){made}")
    if "next_fires" not in found and found.get("next_fire_at"):
        # A listing carries no next fires, only the next one.
        print(f"  next  {found['next_fire_at']}")
    for note in found.get("notes", []):
        print(f"  note  {note}")
    for episode in found.get("missed", []):
        print(
            f"  missed  {episode['count']} fire(s) of v{episode['version']} "
            f"{episode['first']} .. {episode['last']} (misfire policy)"
        )
    if found.get("recent") and found["recent"]["fires"]:
        _print_recent(found["recent"])
    for occurrence in found.get("materialized", []):
        print(f"  made  {occurrence['occurrence_id']}  {occurrence['scheduled_for']}")
    for occurrence in found.get("affected", []):
        print(f"  {occurrence['state']:<10}{occurrence['occurrence_id']}  {occurrence['note']}")


def _print_occurrences(rows: list[dict[str, Any]]) -> None:
    print(f"{'OCCURRENCE':<32} {'SCHEDULED_FOR':<21} {'STATE':<16} ATTEMPTS")
    for row in rows:
        print(
            f"{row['occurrence_id']:<32} {row['scheduled_for']:<21} {row['state']:<16} "
            f"{row['attempt_count']}{' (manual)' if row.get('manual') else ''}"
        )


def _print_backfill(found: dict[str, Any]) -> None:
    verb = "would make" if found["dry_run"] else "made"
    print(
        f"{found['fires']} fires: {found['existing']} have an occurrence, {found['planned']} "
        f"are still to be made on time; {verb} {found['created']}"
    )
    if found["occurrences"]:
        _print_occurrences(found["occurrences"])


def _spread(name: str, found: dict[str, int] | None) -> str:
    if found is None:
        return f"{name} none measured"
    return (
        f"{name} p50 {found['p50_seconds']} s, p99 {found['p99_seconds']} s, "
        f"max {found['max_seconds']} s"
    )


def _print_recent(recent: dict[str, Any]) -> None:
    """How the last fires went (the GET's ``recent``, with fires), in three lines at most."""
    outcomes = ", ".join(f"{name} {count}" for name, count in recent["outcomes"].items())
    print(f"  recent  {recent['fires']} fires since {recent['since']}: {outcomes}")
    lags = f"{_spread('receivable', recent['receivable_lag'])}; "
    print(f"  lag     {lags}{_spread('handler start', recent['start_lag'])}")
    failure = recent["last_failure"]
    if failure is not None:
        named = f" ({failure['occurrence_id']})" if failure["occurrence_id"] else ""
        error = _flat_text(failure["error"] or "")
        print(f"  failed  {failure['what']} at {failure['at']}{named}: {error}")
    if recent["unreadable"]:
        print(f"  unreadable  {recent['unreadable']} items under its key (a worker wrote them)")


def _emit(args: argparse.Namespace, value: Any, human: Callable[[Any], None]) -> None:
    if args.json:
        print(json.dumps(value, indent=2))
    else:
        human(value)


def _each(printer: Callable[[Any], None]) -> Callable[[list[Any]], None]:
    def print_all(rows: list[Any]) -> None:
        for row in rows:
            printer(row)

    return print_all


def _print_version(version: dict[str, Any]) -> None:
    print(
        f"v{version['version']}  from {version['effective_from']}  {version['state']}  "
        f"{_rule(version['spec'])}  -> {version['target']}"
    )


# A version's bookkeeping, not what it says: left out of what changed from one to the next.
_NOT_CHANGES = frozenset({"version", "run_version", "effective_from"})


def _print_versions(versions: list[dict[str, Any]]) -> None:
    """Each version, and under it what changed from the version before (field: old -> new)."""
    before: dict[str, Any] | None = None
    for version in sorted(versions, key=lambda v: int(v["version"])):
        _print_version(version)
        if before is not None:
            for name in sorted((set(before) | set(version)) - _NOT_CHANGES):
                old, new = before.get(name), version.get(name)
                if old != new:
                    print(f"  {name}: {json.dumps(old)} -> {json.dumps(new)}")
        before = version


def _print_target(target: dict[str, Any]) -> None:
    early = "  early delivery" if target.get("early_delivery") else ""
    print(f"{target['name']}  {target['queue_url']}{early}")


def _segment(value: str, name: str) -> str:
    """An id as one path segment of a request (percent-encoded); a usage error for one that
    cannot be (empty, ``.`` or ``..``)."""
    try:
        return segment(value)
    except BadArgument as error:
        raise UsageError(f"{name}: {error}") from None


def run_client_command(args: argparse.Namespace) -> int:
    client = Client.from_environment(args.endpoint)
    try:
        return _run(client, args)
    except (KeyError, TypeError) as error:
        # JSON, but not in the API's shapes: another service answers at the endpoint.
        raise BadAnswer(
            client.endpoint,
            f"answered without what the API answers ({type(error).__name__}: {error})",
        ) from None


def _run(client: Client, args: argparse.Namespace) -> int:
    if args.command == "worker":
        return _worker(client, args)
    command = _COMMANDS.get(args.command)
    if command is not None:
        command(client, args)
    return 0


def _schedule(args: argparse.Namespace) -> str:
    """The path of the schedule a command names."""
    return f"/v1/schedules/{_segment(args.schedule_id, 'ID')}"


def _tenants(client: Client, args: argparse.Namespace) -> None:
    if args.action == "list":
        rows = client.pages("/v1/admin/tenants", "tenants")
        _emit(args, rows, _each(_print_tenant))
        return
    tenant_id = _segment(args.tenant_id, "ID")
    if args.action == "worker-policy":
        found = client.get(f"/v1/admin/tenants/{tenant_id}/worker-policy")
        print(json.dumps(found["policy"], indent=2))
        return
    quotas = {
        key: getattr(args, key)
        for key in (
            "max_schedules",
            "max_strict_fires_per_minute",
            "max_concurrency",
            "catchup_per_minute",
            "max_manual_runs_per_minute",
            "max_backfill_occurrences",
        )
        if getattr(args, key) is not None
    }
    client.post(
        "/v1/admin/tenants",
        {"tenant_id": args.tenant_id} | ({"quotas": quotas} if quotas else {}),
    )
    tenant = client.post(
        f"/v1/admin/tenants/{tenant_id}/principals", {"principal_arn": args.principal}
    )
    _emit(args, tenant, lambda t: print(f"tenant {t['tenant_id']} bound to {args.principal}"))


def _print_tenant(tenant: dict[str, Any]) -> None:
    quotas = tenant["quotas"]
    print(
        f"{tenant['tenant_id']}  schedules {tenant['schedule_count']} of "
        f"{quotas['max_schedules']}  busiest strict minute "
        f"{tenant['strict_fires_per_minute_peak']} of {quotas['max_strict_fires_per_minute']}"
    )


def _worker_policy(client: Client, args: argparse.Namespace) -> None:
    print(json.dumps(client.get("/v1/tenant/worker-policy")["policy"], indent=2))


def _targets(client: Client, args: argparse.Namespace) -> None:
    if args.action == "create":
        target = client.post(
            "/v1/targets", {"name": args.name, "early_delivery": args.early_delivery}
        )
        _emit(args, target, _print_target)
    elif args.action == "update":
        path = f"/v1/targets/{_segment(args.name, 'NAME')}"
        target = client.call("PATCH", path, {"early_delivery": args.early_delivery == "on"})
        _emit(args, target, _print_target)
    else:
        found = client.get("/v1/targets")["targets"]
        _emit(args, found, _each(_print_target))


def _create(client: Client, args: argparse.Namespace) -> None:
    if args.target is None:
        raise UsageError("--target is required")
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    saved = client.post("/v1/schedules", _definition(args), headers=headers)
    _emit(args, _flat(saved), _print_schedule)


def _update(client: Client, args: argparse.Namespace) -> None:
    schedule = _schedule(args)
    current = client.get(schedule)["schedule"]
    changes = _update_body(args, current["spec"])
    if not changes:
        raise UsageError("nothing to change: give at least one flag")
    headers = {"If-Match": str(current["version"])}
    saved = client.call("PATCH", schedule, changes, headers=headers)
    _emit(args, _flat(saved), _print_schedule)


def _get(client: Client, args: argparse.Namespace) -> None:
    query = {} if args.recent is None else {"recent": args.recent}
    _emit(args, _flat(client.get(_schedule(args), **query)), _print_schedule)


def _pause_or_resume(client: Client, args: argparse.Namespace) -> None:
    saved = client.post(f"{_schedule(args)}/{args.command}")
    _emit(args, _flat(saved), _print_schedule)


def _cancel(client: Client, args: argparse.Namespace) -> None:
    saved = client.call("DELETE", _schedule(args))
    _emit(args, _flat(saved), _print_schedule)


def _versions(client: Client, args: argparse.Namespace) -> None:
    rows = client.pages(f"{_schedule(args)}/versions", "versions")
    _emit(args, rows, _print_versions)


def _trigger(client: Client, args: argparse.Namespace) -> None:
    schedule = _schedule(args)
    # Always a key: the client's retries of one command must not run it twice.
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    found = client.post(f"{schedule}/trigger", headers={"Idempotency-Key": key})
    _emit(args, found, lambda t: _print_occurrences([t["occurrence"]]))


def _backfill(client: Client, args: argparse.Namespace) -> None:
    schedule = _schedule(args)
    body = {"from": args.since, "to": args.until, "dry_run": args.dry_run}
    found = client.post(f"{schedule}/backfill", body)
    _emit(args, found, _print_backfill)


def _list(client: Client, args: argparse.Namespace) -> None:
    rows = client.pages("/v1/schedules", "schedules", state=args.state)
    _emit(args, rows, _each(_print_schedule))


def _occurrence(client: Client, args: argparse.Namespace) -> None:
    found = client.get(f"/v1/occurrences/{_segment(args.occurrence_id, 'OCC_ID')}")
    _emit(args, found, _print_occurrence_detail)


def _reconcile(client: Client, args: argparse.Namespace) -> None:
    found = client.get("/v1/admin/reconcile", **{"from": args.window_from, "to": args.window_to})
    _emit(args, found, _print_reconcile)


def _occurrences(client: Client, args: argparse.Namespace) -> None:
    """The schedule's occurrences due in [--from, --to] (the API's window), those in
    --state only (the API lists every state: the filter is the client's); for people, the
    fires the misfire policy recorded MISSED in that window after them (they have no
    occurrence: every page repeats them)."""
    rows: list[dict[str, Any]] = []
    missed: list[dict[str, Any]] = []
    path = f"{_schedule(args)}/occurrences"
    for page in client.each_page(path, **{"from": args.since, "to": args.until}):
        rows += page["occurrences"]
        missed = page.get("missed") or []
    if args.state is not None:
        rows = [row for row in rows if row["state"] == args.state]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    _print_occurrences(rows)
    if args.state in (None, OccurrenceState.MISSED.value):
        for episode in missed:
            print(
                f"  missed  {episode['count']} fire(s) of v{episode['version']} "
                f"{episode['first']} .. {episode['last']} (misfire policy: no occurrence)"
            )


def _ledger(client: Client, args: argparse.Namespace) -> None:
    """Every page of the tenant's ledger for the range and filters given."""
    query = {"from": args.since, "to": args.until, "state": args.state}
    query |= {"finding": args.finding, "target": args.target}
    query |= {"listing": "all" if args.all else None}
    rows: list[dict[str, Any]] = []
    hours: list[dict[str, Any]] = []
    complete = True
    for page in client.each_page("/v1/occurrences", **query):
        rows += page["occurrences"]
        hours += page["hours"]
        complete = complete and page["upcoming_complete"] is not False
    if args.json:
        print(json.dumps({"occurrences": rows, "hours": hours}, indent=2))
        return
    print(f"{'SCHEDULED_FOR':<21} {'STATE':<16} {'FINDING':<16} {'ATTEMPTS':<9} OCCURRENCE")
    for row in rows:
        late = " (late)" if row.get("late") else ""
        print(
            f"{row['scheduled_for']:<21} {row['state']:<16} {row['finding'] or '-':<16} "
            f"{row['attempts']:<9} {row['occurrence_id']}{late}"
        )
    for hour in hours:
        counts = ", ".join(f"{k} {v}" for k, v in hour["counts"].items()) or "nothing"
        checked = f"{hour['shards_checked']}/{hour['shards']} shards checked"
        checked += ", read live" if hour["live"] else ""
        print(f"  hour {hour['hour']}: {counts} ({checked})")
    if not complete:
        print("  upcoming fires not listed: more active schedules than the ledger computes")


# What each command does, by its name (``worker`` aside: it runs until stopped).
_COMMANDS: dict[str, Callable[[Client, argparse.Namespace], None]] = {
    "tenants": _tenants,
    "worker-policy": _worker_policy,
    "targets": _targets,
    "create": _create,
    "update": _update,
    "get": _get,
    "pause": _pause_or_resume,
    "resume": _pause_or_resume,
    "trigger": _trigger,
    "backfill": _backfill,
    "cancel": _cancel,
    "list": _list,
    "occurrences": _occurrences,
    "ledger": _ledger,
    "versions": _versions,
    "occurrence": _occurrence,
    "reconcile": _reconcile,
}


def _print_occurrence_detail(found: dict[str, Any]) -> None:
    """The occurrence's row, where and when it was sent, then each attempt."""
    _print_occurrences([found])
    sent = found.get("enqueued_at") or "not taken by a worker yet"
    print(
        f"  schedule {found['schedule_id']} v{found['schedule_version']} -> "
        f"{found['target']}; available {found['available_at']}; sent {sent}"
    )
    if found.get("reason"):
        print(f"  reason  {_flat_text(found['reason'])}")
    times = found.get("times")
    if times:
        print(f"  times   {_state_times_text(times)}")
    attempts = found.get("attempts") or []
    if not attempts:
        print("no attempts yet")
        return
    print(f"{'ATTEMPT':<8} {'STARTED':<21} {'FINISHED':<21} {'OUTCOME':<16} ERROR")
    for attempt in attempts:
        print(
            f"{attempt['attempt_no']:<8} {attempt['started_at']:<21} "
            f"{attempt.get('finished_at') or '-':<21} {attempt['outcome']:<16} "
            f"{_flat_text(attempt.get('error') or '')}".rstrip()
        )


def _state_times_text(times: dict[str, Any]) -> str:
    """Where the occurrence's time went: ``due -> receivable 0 s, receivable -> claimed
    2 s, runs 14 s, 9 s, retry waits 30 s`` (the steps not reached yet left out)."""

    def seconds(values: list[int]) -> str:
        return ", ".join(f"{v} s" for v in values)

    parts = [
        f"due -> receivable {times['to_receivable_seconds']} s"
        if times.get("to_receivable_seconds") is not None
        else "due -> receivable not recorded (a worker's first claim records the send)",
    ]
    if times.get("to_claim_seconds") is not None:
        parts.append(f"receivable -> claimed {times['to_claim_seconds']} s")
    if times.get("run_seconds"):
        parts.append(f"runs {seconds(times['run_seconds'])}")
    if times.get("retry_wait_seconds"):
        parts.append(f"retry waits {seconds(times['retry_wait_seconds'])}")
    return "; ".join(parts)


def _flat_text(text: str) -> str:
    """A handler's error or a reason on one line (a traceback's newlines flattened)."""
    return " ".join(str(text).split())


def _print_reconcile(found: dict[str, Any]) -> None:
    """The window's totals, then each shard's counts. A window no shard has reported on
    (not reconciled yet: the last hour before its run, or a future one) says so: its
    totals are not zero, they are unknown."""
    window = f"window {found['window_start']} .. {found['window_end']}"
    reports = found["reports"]
    if not reports:
        print(f"{window}: not reconciled yet (no shard has reported on it)")
        return
    unfinished = sum(1 for report in reports if not report["complete"])
    # (An API from before 2026-12-06 does not name the shards not reported yet.)
    unreported = found.get("unreported_shards", [])
    gaps = [f"{unfinished} of the reports incomplete"] if unfinished else []
    if unreported:
        gaps.append(f"shards {_ranges(unreported)} not reconciled yet")
    so_far = f" so far ({'; '.join(gaps)})" if gaps else ""
    print(
        f"{window}: {len(reports)} shard reports, MISSING {found['missing']}, "
        f"UNEXPECTED {found['unexpected']}{so_far}"
    )
    for report in reports:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(report["counts"].items()) if v)
        state = "" if report["complete"] else " (incomplete)"
        print(f"  shard {report['shard']:>4}{state}: {counts or 'nothing due'}")


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _handler(spec: str) -> Callable[[Any], None]:
    module, _, function = spec.partition(":")
    if not module or not function:
        raise UsageError("--handler must be MODULE:FUNCTION")
    try:
        found = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as error:
        raise UsageError(f"--handler: {error}") from None
    except Exception as error:  # the module fails as it is imported (its own code)
        raise UsageError(
            f"--handler: importing {module} failed: {type(error).__name__}: {error}"
        ) from None
    if not callable(found):
        raise UsageError(f"--handler: {spec} is not a function")
    return found  # type: ignore[no-any-return]


def print_occurrence(job: Job) -> None:
    """A handler that only reports: which occurrence, when it was due, how late it is."""
    now = time.time()
    due = job.message.available_at.timestamp()
    scheduled = job.message.scheduled_for.timestamp()
    local = datetime.now(UTC).strftime("%H:%M:%S")
    flexible = f", available {due - scheduled:+.0f} s (flexible)" if due != scheduled else ""
    print(
        f"[{local}] {job.message.payload.get('demo', job.message.schedule_id)}: "
        f"{job.occurrence_id} scheduled {utc_text(int(scheduled))}{flexible}, "
        f"handled {now - due:.2f} s after due, attempt {job.attempt}",
        flush=True,
    )


def stop_on_signals() -> threading.Event:
    """An event set when the process is asked to stop: Ctrl-C (SIGINT), ``kill``, a service
    manager or ``docker stop`` (SIGTERM) and a closed terminal (SIGHUP) alike. Call it from
    the main thread.

    The Python handler sets nothing: it runs in the main thread between two bytecodes,
    maybe inside this event's own ``wait`` holding its lock (not reentrant), where a
    ``set()`` would wait for itself forever. CPython also writes each signal's number to a
    wakeup socket from its C handler; a thread reading it sets the event, whatever the main
    thread is doing."""
    stop = threading.Event()
    receive, send = socket.socketpair()
    send.setblocking(False)  # a full socket drops a byte rather than block the handler
    signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
    numbers = {int(number) for number in STOP_SIGNALS}
    for number in STOP_SIGNALS:
        signal.signal(number, _noted)

    def watch() -> None:
        with receive, send:
            # Any signal with a Python handler writes its number here: stop on ours only.
            while not numbers.intersection(noted := receive.recv(64)):
                if not noted:
                    return  # (closed: no signal will come this way)
            stop.set()

    threading.Thread(target=watch, name="stop-signals", daemon=True).start()
    return stop


def _noted(number: int, frame: object) -> None:
    """A stop signal's Python handler: nothing to do here (see stop_on_signals)."""


def _until_broken_pipe(
    handler: Callable[[Any], None], stop: threading.Event
) -> Callable[[Any], None]:
    """``handler``, stopping the worker once its output has no reader (``punctual worker |
    head``), as other tools stop; the occurrence it was printing is retried later."""

    def run(job: Any) -> None:
        try:
            handler(job)
        except BrokenPipeError:
            stop.set()
            raise

    return run


def _worker(client: Client, args: argparse.Namespace) -> int:
    from punctual.domain.validation import field_errors
    from punctual_client.logs import plain_logs
    from punctual_client.worker import QueueConsumer, Worker
    from punctual_client.worker.wiring import WorkerClients

    if args.threads < 1:
        raise UsageError(f"--threads must be at least 1, got {args.threads}")
    plain_logs(os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"))
    handler = _handler(args.handler)
    tenant = client.get("/v1/tenant")["tenant_id"]
    targets = {t["name"]: t for t in client.get("/v1/targets")["targets"]}
    if args.target not in targets:
        raise UsageError(f"--target: no target named {args.target}")
    queue = targets[args.target]["queue_url"]
    try:
        services = WorkerClients.from_environment()
    except ValidationError as error:  # a PUNCTUAL_* variable of the environment
        first = field_errors(error)[0]
        raise CommandFailed(f"settings: {first['field']}: {first['reason']}") from None
    stop = stop_on_signals()
    worker = Worker(services, tenant, _until_broken_pipe(handler, stop), heartbeat_seconds=20)
    print(f"worker for {tenant}/{args.target} on {queue} (Ctrl-C stops)", flush=True)
    consumer = QueueConsumer(worker, queue, threads=args.threads, wait_seconds=WORKER_POLL_SECONDS)
    consumer.run(stop)
    print("worker stopped", flush=True)
    return 0


def main_for(args: argparse.Namespace) -> int:
    registered: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if registered is not None:  # a command a plugin registered (cli.COMMANDS_GROUP)
        return registered(args)
    try:
        return run_client_command(args)
    except ApiError as error:
        if 400 <= error.status < 500:
            raise UsageError(str(error)) from None
        raise
    except BadEndpoint as error:
        raise UsageError(str(error)) from None
