"""The simulation's invariants, checked against what is stored once the system has drained.

What each schedule should have fired comes from its version history and the time engine
(``expected_occurrences``: the reconciler's recomputation, which never uses the planning
code under test). Then:

- **accounted**: every fire a version owns (due before its successor took over) is stored
  exactly once in an explained state, or was recorded MISSED by its misfire policy;
- **settled**: after the drain nothing is left open (SCHEDULED, RUNNING, RETRY_WAIT): an
  undelivered occurrence would have been re-sent by the re-drive and taken;
- **owned**: no stored occurrence lacks an owning version (a paused hour, a wrong instant);
- **no stale run**: no handler ran an occurrence of a version not in effect, a canceled
  schedule's, or one ahead of its available_at (never early);
- **once**: one successful run per (schedule, instant) at most;
- **quota**: each tenant's usage equals a recount of its live schedules.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from punctual.dal.common import from_dynamo
from punctual.dal.occurrences import occurrence_from_item
from punctual.dal.schedules import ScheduleVersion, minute_load_of, missed_ranges_of
from punctual.dal.tables import OCCURRENCE_PREFIX, SCHEDULE_CURRENT
from punctual.models import Occurrence, OccurrenceState, OverlapPolicy, ScheduleState
from punctual.reconciler import Expected, expected_occurrences
from tests.sim.world import DAY, DRAIN_SECONDS, Run

S = OccurrenceState
_OPEN = (S.SCHEDULED, S.RUNNING, S.RETRY_WAIT)
_LIVE = (ScheduleState.ACTIVE.value, ScheduleState.PAUSED.value)
EXAMPLES = 5
_REQUIRED = Expected("", 0, 0, "", 0, required=True)


@dataclass
class Verdict:
    schedules: int = 0
    schedule_days: float = 0.0
    occurrences: int = 0
    runs: int = 0
    fires_checked: int = 0
    missed_by_policy: int = 0
    # The required fires the oracle checked and found stored (what a deletion must break).
    found: set[str] = field(default_factory=set)
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def flag(self, kind: str, what: str) -> None:
        self.violations[kind] += 1
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(what)


def _scan(run: Run, table: str) -> list[dict[str, Any]]:
    pages = run.services.dynamodb.get_paginator("scan").paginate(
        TableName=table, ConsistentRead=True
    )
    return [from_dynamo(i) for page in pages for i in page["Items"]]


def check(run: Run) -> Verdict:
    verdict = Verdict(runs=len(run.handler_runs))
    settings = run.settings
    services = run.services
    until = run.end + DRAIN_SECONDS - 600  # every fire due by then has had time to settle
    horizon = settings.planned_horizon_seconds + 180
    current = {
        i["schedule_id"]: i
        for i in _scan(run, settings.schedules_table)
        if i["sk"] == SCHEDULE_CURRENT
    }
    stored: dict[str, list[Occurrence]] = defaultdict(list)
    for item in _scan(run, settings.occurrences_table):
        if str(item["sk"]).startswith(OCCURRENCE_PREFIX):
            stored[item["schedule_id"]].append(occurrence_from_item(item))
    histories = {sid: services.schedules.versions_since(sid, 0) for sid in current}
    verdict.schedules = len(current)
    verdict.occurrences = sum(len(v) for v in stored.values())
    for sid, item in current.items():
        versions = histories[sid]
        born = versions[0].effective_from
        verdict.schedule_days += max(0, run.end - max(born, run.start)) / DAY
        _check_schedule(verdict, item, versions, stored[sid], run.start, until, horizon, run.skew)
    _check_runs(verdict, run)
    _check_quota(verdict, run, current)
    return verdict


def _check_schedule(
    verdict: Verdict,
    item: dict[str, Any],
    versions: list[ScheduleVersion],
    occurrences: list[Occurrence],
    start: int,
    until: int,
    horizon: int,
    skew: int = 0,
) -> None:
    sid = item["schedule_id"]
    expected = expected_occurrences(versions, start, until, horizon=horizon)
    by_id = {o.occurrence_id: o for o in occurrences}
    owned = {e.occurrence_id: e for e in expected}
    latest = versions[-1].schedule.version
    ranges = missed_ranges_of(item)
    for e in expected:
        if not e.required or e.available_at > until:
            continue
        verdict.fires_checked += 1
        found = by_id.get(e.occurrence_id)
        if found is None:
            if any(r.covers(e.version, e.scheduled_for) for r in ranges):
                verdict.missed_by_policy += 1
            else:
                verdict.flag("missing", f"{e.occurrence_id} (due {e.available_at})")
            continue
        verdict.found.add(e.occurrence_id)
        schedule = next(v.schedule for v in versions if v.schedule.version == e.version)
        if found.state in _OPEN:
            verdict.flag("unsettled", f"{found.occurrence_id} {found.state.value}")
        elif (
            found.state is S.CANCELED
            and e.version == latest
            and schedule.state.value
            not in (
                ScheduleState.CANCELED.value,
                ScheduleState.PAUSED.value,
            )
        ):
            verdict.flag("canceled_without_change", found.occurrence_id)
        elif (
            found.state is S.SKIPPED_OVERLAP
            and schedule.overlap is not OverlapPolicy.SKIP_IF_RUNNING
        ):
            verdict.flag("skipped_without_policy", found.occurrence_id)
        elif found.state is S.MISSED:
            verdict.missed_by_policy += 1
    for o in occurrences:
        if o.occurrence_id not in owned and start <= o.scheduled_for <= until - horizon:
            verdict.flag("unowned", f"{o.occurrence_id} {o.state.value}")
        elif o.state is S.SUCCEEDED and not owned.get(o.occurrence_id, _REQUIRED).required:
            # A run up to ``skew`` early (the relay's clock ahead, as the run injects it) can
            # come before a change made in those seconds: legitimate, as the run-time check
            # (stale_run) judges it. Superseded earlier than that, its run is a bug.
            successor = next(
                (v.effective_from for v in versions if v.schedule.version > o.schedule_version),
                None,
            )
            if successor is None or successor <= o.available_at - skew:
                verdict.flag("superseded_ran", o.occurrence_id)
    done = Counter(o.scheduled_for for o in occurrences if o.state is S.SUCCEEDED)
    for instant, count in done.items():
        if count > 1:
            verdict.flag("ran_twice", f"{sid} at {instant}")


def _check_runs(verdict: Verdict, run: Run) -> None:
    # The relay computes each delay on its own clock: one that runs ahead makes a message
    # receivable early by as much. The run injects up to ``skew`` seconds of it; beyond that,
    # early is a bug.
    for occurrence_id, version, at, available, current, state in run.handler_runs:
        if at + run.skew < available:
            verdict.flag("early", f"{occurrence_id} ran at {at}, available {available}")
        if current != version or state not in (
            ScheduleState.ACTIVE.value,
            ScheduleState.COMPLETED.value,
        ):
            verdict.flag(
                "stale_run", f"{occurrence_id} (v{version}) ran while v{current} was {state}"
            )


def _check_quota(verdict: Verdict, run: Run, current: dict[str, dict[str, Any]]) -> None:
    live: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in current.values():
        if item["state"] in _LIVE:
            live[item["tenant_id"]].append(item)
    for tenant in _scan(run, run.settings.tenants_table):
        if tenant.get("sk") != "TENANT":
            continue
        tenant_id = tenant["tenant_id"]
        count = len(live[tenant_id])
        if int(tenant.get("schedule_count", 0)) != count:
            verdict.flag(
                "quota_count", f"{tenant_id}: usage {tenant.get('schedule_count')}, live {count}"
            )
        load: Counter[int] = Counter()
        for item in live[tenant_id]:
            load.update(minute_load_of(item))
        for minute in range(60):
            if int(tenant.get(f"f{minute:02d}", 0)) != load[minute]:
                verdict.flag("quota_load", f"{tenant_id} minute {minute}")
                break
