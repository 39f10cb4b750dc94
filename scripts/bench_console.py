"""The console's pages for a tenant with 10,000 occurrences in the last hour (issue 46: any
page in under 1 s).

Engines as `make run` uses them (DynamoDB Local, in memory; the SQS engine), the API's code
in this process behind the local gateway, and the console on it as `local up` serves it:
every figure a page shows is read through the API over HTTP, as in the browser. A tenant
`bench` gets schedules (strict ones, flexible ones) and a last hour of occurrences written
straight into the occurrences table, since the materializer would take the hour to make
them: most succeeded, a few dead, a few that waited long for a worker, the last minutes'
still open, and some runs now among them. No driver runs (no ticker, relay or worker):
nothing changes while the pages are timed.

Prints, per page: the page, the tenant's occurrences in the last hour, the fastest of
``--repeat`` fetches in seconds and the ratio to the 1 s budget, then what the fetch cost
the API: its calls, and the seconds spent in them (the local gateway runs one call at a
time: a page's floor), and the page's size. Run: ``make bench-console``
(``BENCH_ARGS='--occurrences 10000 --repeat 3'``).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from punctual.domain.ids import manual_tag, occurrence_id
from punctual.domain.occurrence import Occurrence, OccurrenceState
from punctual.domain.schedule import ScheduleDefinition
from punctual_local.engines import ensure_engines
from punctual_local.stack import (
    REPO,
    StackOptions,
    bind_gateway,
    bootstrap,
    configure_environment,
    load_handlers,
    local_principal,
)

BUDGET_SECONDS = 1.0
TENANT = "bench"
TARGET = "default"
HOUR = 3600
FLEXIBLE_SHARE = 10  # one schedule in ten is flexible
FLEXIBLE_WINDOW = 30
MANUAL_EVERY = 100  # one occurrence in a hundred is a run now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--occurrences", type=int, default=10_000, help="in the last hour")
    parser.add_argument("--repeat", type=int, default=3, help="fetches per page (fastest kept)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="punctual-bench-console-"))
    engines = ensure_engines(data, in_memory=True)
    gateway = None
    try:
        options = StackOptions(data=data, port=0)
        configure_environment(engines, options)
        from punctual.services import Services
        from punctual.settings import get_settings

        get_settings.cache_clear()
        load_handlers(options.functions)
        services = Services.from_environment()
        bootstrap(services)
        started = time.monotonic()
        busiest, one = seed(services, args.occurrences, random.Random(args.seed))
        print(f"seeded {args.occurrences} occurrences in {time.monotonic() - started:.1f} s")
        gateway = bind_gateway(0, REPO / "functions")
        meter = Meter(gateway.handler)
        gateway.handler = meter
        gateway.start()
        pages = [
            ("schedules", "/console"),
            ("schedules, searched", "/console?q=FLEX&state=ACTIVE"),
            ("schedule", f"/console/schedules/{busiest}"),
            ("occurrence", f"/console/occurrences/{one}"),
            ("timeline", "/console/timeline"),
            ("lag", "/console/lag"),
            ("tenants", f"/console/tenants?tenant={TENANT}"),
            ("reconciler", "/console/reconciler"),
        ]
        print(
            f"{'page':<20} {'occurrences':>11} {'seconds':>8} {'of 1 s':>7} "
            f"{'API calls':>9} {'in API s':>8} {'KB':>6}"
        )
        for name, path in pages:
            separator = "&" if "?" in path else "?"
            url = f"{gateway.url}{path}{separator}as={TENANT}"
            fastest(url, 1)  # (the console learns the key's tenant on its first page)
            meter.reset()
            seconds, size, status = fastest(url, args.repeat)
            calls, inside = meter.calls / args.repeat, meter.seconds / args.repeat
            note = "" if status == 200 else f"  (answered {status})"
            print(
                f"{name:<20} {args.occurrences:>11} {seconds:>8.3f} "
                f"{seconds / BUDGET_SECONDS:>6.2f}x {calls:>9.0f} {inside:>8.3f} "
                f"{size / 1024:>6.0f}{note}"
            )
    finally:
        if gateway is not None:
            gateway.stop()
        engines.stop()
        shutil.rmtree(data, ignore_errors=True)


@dataclass
class Meter:
    """The API function as the gateway runs it (one call at a time), counted and timed."""

    handler: Callable[[dict[str, Any], Any], dict[str, Any]]
    calls: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return self.handler(event, context)
        finally:
            with self._lock:
                self.calls += 1
                self.seconds += time.perf_counter() - started

    def reset(self) -> None:
        with self._lock:
            self.calls, self.seconds = 0, 0.0


def fastest(url: str, repeat: int) -> tuple[float, int, int]:
    """The fastest of ``repeat`` fetches of ``url`` (seconds), its size and status."""
    best, size, status = float("inf"), 0, 0
    for _ in range(repeat):
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=120) as answer:
                body, status = answer.read(), answer.status
        except urllib.error.HTTPError as error:
            body, status = error.read(), error.code
        best = min(best, time.perf_counter() - started)
        size = len(body)
    return best, size, status


def seed(services: Any, total: int, rng: random.Random) -> tuple[str, str]:
    """The tenant, its schedules (every minute: 60 fires in the hour each) and ``total``
    occurrences in the last hour (and the first schedule's 23 hours before); the id of
    that schedule and of one of its occurrences."""
    from punctual.control.plane import ControlPlane
    from punctual.dal.common import to_dynamo
    from punctual.domain.tenancy import Quotas

    plane = ControlPlane(services)
    plane.create_tenant(TENANT, Quotas())
    plane.bind_principal(local_principal(TENANT), TENANT)
    plane.create_target(TENANT, TARGET)
    now = int(time.time())
    minute = now - now % 60
    fires = list(range(minute - HOUR + 60, minute + 1, 60))  # 60 fires in (now - 1 h, now]
    count = -(-total // len(fires))
    schedules = []
    for n in range(count):
        flexible = n % FLEXIBLE_SHARE == FLEXIBLE_SHARE - 1
        definition = ScheduleDefinition.model_validate(
            {
                "name": f"{'flexible' if flexible else 'strict'} {n:04d}",
                "spec": {"kind": "cron", "expression": "* * * * *", "timezone": "UTC"},
                "target": TARGET,
                "payload": {"n": n},
                "flexible_window_seconds": FLEXIBLE_WINDOW if flexible else 0,
            }
        )
        saved = plane.create(TENANT, definition).schedule
        schedules.append((saved.schedule_id, flexible))
    items = []
    # The schedule whose page is timed has its whole day behind it (the page shows 24 h).
    first, _ = schedules[0]
    for instant in range(fires[0] - 23 * HOUR, fires[0], 60):
        made = occurrence_id(first, 1, instant, None)
        items.append(to_dynamo(_occurrence_item(made, first, instant, instant, now, rng)))
    for index in range(total):
        schedule_id, flexible = schedules[index % count]
        instant = fires[index // count]
        tag = manual_tag(schedule_id, str(index)) if index % MANUAL_EVERY == 0 else None
        made = occurrence_id(schedule_id, 1, instant, tag)
        due = instant + (rng.randrange(FLEXIBLE_WINDOW) if flexible and tag is None else 0)
        items.append(to_dynamo(_occurrence_item(made, schedule_id, instant, due, now, rng)))
    table = services.settings.occurrences_table
    for start in range(0, len(items), 25):
        batch = [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
        unprocessed: dict[str, Any] = {table: batch}
        while unprocessed:
            answer = services.dynamodb.batch_write_item(RequestItems=unprocessed)
            unprocessed = answer.get("UnprocessedItems") or {}
    return first, occurrence_id(first, 1, fires[0] - HOUR, None)  # (of its day before)


def _occurrence_item(
    made: str, schedule_id: str, instant: int, due: int, now: int, rng: random.Random
) -> dict[str, Any]:
    """One occurrence as the DAL stores it: done (a few dead, a few late for a worker)
    when its due time is more than two minutes past, else open, some claimed."""
    from punctual.dal.occurrences import occurrence_to_item

    state, claimed, attempts, reason = OccurrenceState.SCHEDULED, None, 0, None
    roll = rng.random()
    if due < now - 120:
        waited = rng.randrange(70, 240) if roll < 0.03 else rng.randrange(0, 3)
        claimed, attempts = due + waited, 1
        state = OccurrenceState.SUCCEEDED
        if roll > 0.98:
            state, attempts, reason = OccurrenceState.DEAD, 3, "failed 3 times: bench"
    elif roll < 0.5 and due <= now:
        state, claimed, attempts = OccurrenceState.RUNNING, due + 1, 1
    occurrence = Occurrence(
        occurrence_id=made,
        tenant_id=TENANT,
        schedule_id=schedule_id,
        schedule_version=1,
        scheduled_for=instant,
        available_at=due,
        target=TARGET,
        state=state,
        attempt_count=attempts,
        enqueued_at=None if claimed is None else due - 60,
        reason=reason,
        expires_at=now + 30 * 86400,
    )
    item = occurrence_to_item(occurrence, {})
    if claimed is not None:
        item["attempts"] = [
            {
                "attempt_no": n + 1,
                "started_at": claimed + 10 * n,
                "lease_expires_at": claimed + 10 * n + 300,
                "finished_at": None if state == OccurrenceState.RUNNING else claimed + 10 * n + 2,
                "outcome": _outcome(state, last=n == attempts - 1),
                "error": reason,
            }
            for n in range(attempts)
        ]
    return item


def _outcome(state: OccurrenceState, *, last: bool) -> str:
    if not last:
        return "RETRY"
    return "RUNNING" if state == OccurrenceState.RUNNING else str(state)


if __name__ == "__main__":
    main()
