"""The reconciler: proves that nothing was silently missed, and repairs what was.

For a closed past window and a set of shards it recomputes, from each schedule's version
history and the time rules (``punctual.timing``; never the materializer's planning code),
which occurrences must exist, compares them with the stored ones by their deterministic ids
and classifies every instant. What has no record at all is MISSING and, unless repair is
off, is materialized now through the same conditional put as every occurrence, under the
schedule's misfire policy. One report per (shard, window) is stored in the leases table.

Which version owns which instant, and what may be left unread: ``punctual.pipeline.ownership``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from punctual.backoff import Backoff
from punctual.dal.common import ConditionFailed, Label
from punctual.dal.occurrences import Window
from punctual.dal.schedules import ScheduleVersion, homed_in
from punctual.domain.errors import InvalidInput, Retryable
from punctual.domain.findings import FOUND_IN, Finding, ReconcileReport
from punctual.domain.ids import is_manual, minute_of
from punctual.domain.ledger import LedgerBook, LedgerEntry
from punctual.domain.occurrence import Lane, Occurrence, OccurrenceState
from punctual.domain.planning import MAX_CATCHUP_SPREAD, new_occurrence, shows_wall, wall_text
from punctual.domain.policies import MisfireAction
from punctual.domain.schedule import Schedule, ScheduleState
from punctual.observability import logger
from punctual.pipeline.ownership import (
    Expected,
    by_version,
    dormant,
    expected_occurrences,
    fired_late,
    idle,
    may_be_overdue,
    may_have_backfilled,
    merged,
    not_handled_yet,
)
from punctual.pipeline.redrive import overdue
from punctual.pipeline.relay import Relay, outbound
from punctual.pipeline.rezone import Replanned, replan, rezoned, stale
from punctual.services import Services

HOUR = 3600
DAY = 24 * HOUR
# History is read back to this long before the window: an older version's occurrences can
# trail its successor's start by at most the planned horizon (lookahead + tick + a minute,
# at most 960 s with the settings' limits), so a version that ended earlier owns nothing here.
HISTORY_MARGIN = HOUR
MAX_WINDOW_SECONDS = 24 * HOUR
# Earlier hours a scheduled run checks again while they have no settled report: two days,
# so an hour is still checked after an outage of up to a day (the materializer's, say)
# followed by one of the reconciler's own.
CATCHUP_WINDOWS = 48
# Tries of one window's check within a run, apart by a back-off (throttling that outlasted
# the client's own retries is given a moment to pass).
WINDOW = Backoff(tries=3, base=1.0, cap=4.0)
EXAMPLES = 20  # ids kept per class in a report
MAX_ACTIONS = 100  # DynamoDB's limit per transaction
REPAIR_ATTEMPTS = 2
WORKERS = 16  # schedules examined concurrently (one history and one occurrence query each)
FOLLOWER_PAGE = 100  # stored occurrences read past the window to find a late-fired follower
# A window is checked this long after it closed before the shard index's ``manual_through``
# is trusted to show a run now made in it (the index is eventually consistent: a read in the
# seconds after a write may miss it). A scheduled run checks an hour after the window.
INDEX_SETTLED = 300

_OPEN = (OccurrenceState.SCHEDULED, OccurrenceState.RETRY_WAIT, OccurrenceState.RUNNING)


METRIC_NAMES = {
    Finding.SUCCEEDED: "ReconcileSucceeded",
    Finding.DEAD: "ReconcileDead",
    Finding.CANCELED: "ReconcileCanceled",
    Finding.MISSED: "ReconcileMissed",
    Finding.SKIPPED_OVERLAP: "ReconcileSkippedOverlap",
    Finding.IN_FLIGHT: "ReconcileInFlight",
    Finding.MISSING: "ReconcileMissing",
    Finding.UNEXPECTED: "ReconcileUnexpected",
    Finding.SUPERSEDED: "ReconcileSuperseded",
}


def default_window(at: int) -> tuple[int, int]:
    """The hour that ended an hour ago: [floor_hour(at) - 2 h, floor_hour(at) - 1 h)."""
    hour = at - at % HOUR
    return hour - 2 * HOUR, hour - HOUR


# --- one schedule -------------------------------------------------------------------------


@dataclass
class _ScheduleOutcome:
    schedule_id: str
    versions: dict[int, Schedule]
    window: tuple[int, int] = (0, 0)
    findings: list[tuple[Finding, str]] = field(default_factory=list)
    missing: list[Expected] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    recorded_missed: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    stalled: list[Occurrence] = field(default_factory=list)  # open, and may be overdue
    redriven: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # ids whose items are a tenant's bad data
    tenant_id: str = ""
    seen: dict[str, Occurrence] = field(default_factory=dict)  # the stored ones read, by id
    gaps: dict[str, Expected] = field(default_factory=dict)  # required fires with no record

    def found_after_all(self, gaps: list[Expected], window: Window) -> set[str]:
        """Those of ``gaps`` that exist after all (a consistent read found them): judged by
        their state, as the first read would have (not at all where the item is a tenant's
        unreadable one), no longer MISSING. Their ids."""
        asked = {g.occurrence_id for g in gaps}
        self.seen |= {o.occurrence_id: o for o in window.occurrences if o.occurrence_id in asked}
        states = {
            o.occurrence_id: FOUND_IN[o.state]
            for o in window.occurrences
            if o.occurrence_id in asked
        }
        taken = asked & set(window.unreadable)
        self.findings = [
            (states.get(oid, f) if f is Finding.MISSING else f, oid)
            for f, oid in self.findings
            if not (f is Finding.MISSING and oid in taken)
        ]
        found = states.keys() | taken
        self.missing = [e for e in self.missing if e.occurrence_id not in found]
        return found

    def settled_by_policy(self, ids: set[str]) -> None:
        """These MISSING ones turned out MISSED by the misfire policy (a consistent read found
        its trace): no longer to repair."""
        self.findings = [
            (Finding.MISSED if f is Finding.MISSING and oid in ids else f, oid)
            for f, oid in self.findings
        ]
        self.missing = [e for e in self.missing if e.occurrence_id not in ids]


@dataclass(frozen=True, slots=True)
class _Decision:
    expected: Expected
    fire: bool  # False: record it MISSED
    reason: str = ""
    available_at: int = 0


# --- reports ------------------------------------------------------------------------------


def read_reports(
    services: Services,
    window_start: int,
    window_end: int | None = None,
    shards: Sequence[int] | None = None,
) -> list[ReconcileReport]:
    """The stored reports of one window (default end: start + 1 h) for ``shards`` (default:
    every shard), ordered by shard; a shard not reconciled for that window is absent."""
    end = window_start + HOUR if window_end is None else window_end
    wanted = range(services.settings.shard_count) if shards is None else shards
    return services.reports.get_many(window_start, end, wanted)


# --- a run ---------------------------------------------------------------------------------


@dataclass
class ShardResult:
    """A shard's report plus the full id lists of what needs attention (for the caller)."""

    report: ReconcileReport
    missing: list[str]
    unexpected: list[str]
    fired: list[str]
    recorded_missed: list[str]
    deferred: list[str]
    moved: list[str] = field(default_factory=list)  # schedules moved ahead of the walk
    replanned: list[str] = field(default_factory=list)  # re-planned under new zone rules
    redriven: list[str] = field(default_factory=list)  # occurrences re-sent


@dataclass
class _Tally:
    schedules: int = 0
    counts: dict[Finding, int] = field(default_factory=lambda: dict.fromkeys(Finding, 0))
    examples: dict[Finding, list[str]] = field(default_factory=dict)
    lists: dict[str, list[str]] = field(default_factory=dict)

    def add(self, outcome: _ScheduleOutcome) -> None:
        self.schedules += 1
        for finding, oid in outcome.findings:
            self.counts[finding] += 1
            kept = self.examples.setdefault(finding, [])
            if len(kept) < EXAMPLES:
                kept.append(oid)
            if finding in (Finding.MISSING, Finding.UNEXPECTED):
                self.lists.setdefault(finding.value, []).append(oid)
        for name in ("fired", "recorded_missed", "deferred", "conflicts", "redriven", "unreadable"):
            self.lists.setdefault(name, []).extend(getattr(outcome, name))

    def of(self, name: str) -> list[str]:
        return self.lists.get(name, [])


class Reconciler:
    def __init__(
        self,
        services: Services,
        *,
        repair: bool | None = None,
        out_of_time: Callable[[], bool] | None = None,
        workers: int = WORKERS,
        relay: Relay | None = None,
    ) -> None:
        self._s = services
        self.settings = services.settings
        self.repair = self.settings.reconcile_repair if repair is None else repair
        self._out_of_time = out_of_time or (lambda: False)
        self.workers = workers
        self.schedules = services.schedules
        self.occurrences = services.occurrences
        self.reports = services.reports
        self.leases = services.leases
        self.relay = relay or Relay(services)
        # The last catch-up's hours that left its horizon with a report still unsettled.
        self.given_up: list[ReconcileReport] = []
        # How far past a version change its predecessor can have been planned: the API plans
        # its horizon ahead (two minutes past a walk that overtook it), the materializer to
        # the end of the minute after lookahead.
        self.horizon = self.settings.planned_horizon_seconds + 180

    def _now(self) -> int:
        return int(self._s.now())

    def run(self, shards: Sequence[int], start: int, end: int) -> list[ShardResult]:
        self._check(shards, start, end)
        return [self.run_shard(shard, start, end) for shard in shards]

    def catch_up(self, shards: Sequence[int], at: int) -> list[ShardResult]:
        """The scheduled run: each shard's default window (the hour that ended an hour before
        ``at``), and before it every one of the CATCHUP_WINDOWS hours before that which has
        no settled report (a run that failed, timed out or never ran, or found something
        still open: in flight, deferred, just repaired), oldest first. So a reconciler outage
        is made up for, not skipped, and what was still open when its hour was checked is
        checked again, and re-sent once overdue, until it is done. An hour that leaves the
        horizon with its report still unsettled is kept in ``given_up``."""
        start, end = default_window(at)
        self._check(shards, start, end)
        windows = [(start - k * HOUR, end - k * HOUR) for k in range(CATCHUP_WINDOWS, -1, -1)]
        leaving = (windows[0][0] - HOUR, windows[0][0])
        results: list[ShardResult] = []
        self.given_up = []
        failed: Exception | None = None
        for shard in shards:
            try:
                found = self.reports.in_windows(shard, [leaving, *windows[:-1]])
            except Exception as error:  # throttled, a timeout: the next run reads them again
                failed = failed or error
                continue
            done = {window for window, report in found.items() if report.settled}
            if leaving in found and leaving not in done:
                # The hour leaves the horizon with something still open: no run checks it
                # again, so it is reported (ReconcileGaveUp) instead of dropped in silence.
                self.given_up.append(found[leaving])
                logger.error(
                    "an hour left the reconciler's horizon unsettled; re-run it by hand",
                    extra={"shard": shard, "window": list(leaving)},
                )
            for window in windows[:-1]:
                if window not in done and not self._out_of_time():
                    failed = self._isolated(shard, window, results) or failed
            # Always run (out of time, it stores an incomplete report: alarmed, and caught
            # up by a later run).
            failed = self._isolated(shard, (start, end), results) or failed
        if failed is not None:
            # Every other window was checked; failing the run makes the caller's retry (Step
            # Functions, the next scheduled run) check the unsettled ones again.
            raise failed
        return results

    def _isolated(
        self, shard: int, window: tuple[int, int], results: list[ShardResult]
    ) -> Exception | None:
        """One window of one shard, tried up to WINDOW.tries times (a check is safe to
        repeat: repairs are conditional puts); its failure (throttling that outlasted the
        client's retries, a timeout) leaves it unsettled without costing the others their
        check."""
        failure: Exception | None = None
        for attempt in range(WINDOW.tries):
            if attempt and self._out_of_time():
                break  # (the first try always runs: out of time, it saves an incomplete report)
            if attempt:
                self._s.sleep(WINDOW.pause(attempt - 1))
            try:
                results.append(self.run_shard(shard, *window))
            except Exception as error:
                failure = error
                continue
            return None
        logger.warning(
            "a reconcile window failed; the next run checks it again",
            extra={"shard": shard, "window": list(window), "error": repr(failure)},
        )
        return failure

    def _check(self, shards: Sequence[int], start: int, end: int) -> None:
        problems = []
        if not start < end:
            problems.append({"field": "window_end", "reason": "must be later than window_start"})
        elif end - start > MAX_WINDOW_SECONDS:
            problems.append(
                {"field": "window_end", "reason": f"a window spans at most {MAX_WINDOW_SECONDS} s"}
            )
        if end > self._now():
            problems.append(
                {"field": "window_end", "reason": "only a closed, past window is reconciled"}
            )
        count = self.settings.shard_count
        if any(not 0 <= shard < count for shard in shards):
            problems.append({"field": "shards", "reason": f"shards are 0..{count - 1}"})
        if problems:
            raise InvalidInput(
                "the reconcile request is not valid: "
                + "; ".join(f"{p['field']}: {p['reason']}" for p in problems),
                problems,
            )

    def run_shard(self, shard: int, start: int, end: int) -> ShardResult:
        run_at = self._now()
        skip_idle = run_at >= end + INDEX_SETTLED
        tally = _Tally()
        complete = True
        replanned: list[Replanned] = []
        moved = self._unstick(shard, start, end) if self.repair else []
        # The tenants' ledger pages of an hour checked as a whole (not of an operator's
        # window of another length): what each tenant's occurrences came to.
        book = LedgerBook(start, shard) if start % HOUR == 0 and end - start == HOUR else None
        with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
            for page in self.schedules.list_for_shard(shard, created_before=_iso(end)):
                if self._out_of_time():
                    complete = False
                    break
                if self.repair:
                    # Planned under older zone rules (a new tzdata deployed): re-planned
                    # before it is checked, so it is judged by the rules in use.
                    complete = self._replan_stale(page, replanned) and complete
                # What needs no read is left out here (most schedules of an hour, without a
                # thread's hand-off each); reads run concurrently (a history and an
                # occurrence query per schedule); repairs, rare and racing the API and the
                # materializer, one at a time.
                wanted = [c for c in page if not self._unread(c, start, end, skip_idle)]
                checked = pool.map(lambda c: self._schedule(c, start, end, skip_idle), wanted)
                for outcome in checked:
                    if outcome.missing and self.repair:
                        self._repair(outcome)
                    if outcome.stalled and self.repair:
                        self._redrive(outcome)
                    tally.add(outcome)
                    if book is not None:
                        _enter(book, outcome)
        if book is not None and complete:
            # (An incomplete check writes none: its hour is checked again, and a page of part
            # of a shard would show counts that are not the tenant's whole hour there.)
            complete = self._write_ledger(book, end, run_at)
        report = ReconcileReport(
            shard=shard,
            window_start=start,
            window_end=end,
            run_at=run_at,
            complete=complete,
            repair=self.repair,
            schedules=tally.schedules,
            counts=tally.counts,
            examples=tally.examples,
            repaired_fired=len(tally.of("fired")),
            repaired_missed=len(tally.of("recorded_missed")),
            deferred=len(tally.of("deferred")),
            repair_conflicts=len(tally.of("conflicts")),
            cursors_moved=len(moved),
            redriven=len(tally.of("redriven")),
            replanned=len(replanned),
            malformed=len(tally.of("unreadable")),
        )
        self.reports.put(report, purge_at=end + self.settings.retention_days * 86400)
        return ShardResult(
            report=report,
            missing=tally.of(Finding.MISSING.value),
            unexpected=tally.of(Finding.UNEXPECTED.value),
            fired=tally.of("fired"),
            recorded_missed=tally.of("recorded_missed"),
            deferred=tally.of("deferred"),
            moved=moved,
            redriven=tally.of("redriven"),
            replanned=[r.schedule_id for r in replanned],
        )

    def _write_ledger(self, book: LedgerBook, end: int, checked_at: int) -> bool:
        """Each tenant's page of the hour; False if one could not be written (throttled past
        the client's retries): the check is then reported incomplete, so the hour is checked,
        and its pages written, again."""
        purge_at = end + self.settings.retention_days * DAY
        try:
            pages = book.pages(checked_at)
            # (A re-check of an hour left in flight rewrites only the pages that changed.)
            same = self._s.ledger.unchanged(pages)
            for page in pages:
                if (page.tenant_id, page.shard) in same:
                    continue
                try:
                    self._s.ledger.put(page, purge_at=purge_at)
                except ClientError as refused:
                    # DynamoDB refused the page itself (what its tenant's items made of it):
                    # that tenant's bad data, counted; never the other tenants' pages or
                    # the shard's check.
                    self._s.bad_items.skip(
                        self._s.settings.ledger_table, {"pk": page.tenant_id}, refused
                    )
            # (Last: a mark says every page of the check is written.)
            self._s.ledger.put_checked(
                book.hour, book.shard, checked_at=checked_at, purge_at=purge_at
            )
        except Retryable:
            logger.warning(
                "the hour's ledger was not written; the hour is checked again",
                extra={"shard": book.shard, "hour": book.hour},
            )
            return False
        return True

    def _replan_stale(self, page: Sequence[ScheduleVersion], replanned: list[Replanned]) -> bool:
        """Re-plan the page's schedules planned under older zone rules (punctual.pipeline.rezone);
        False if one kept losing races (the report is then incomplete: checked again)."""
        ok = True
        for current in page:
            schedule = current.schedule
            if not stale(schedule) or not homed_in(schedule, self.settings.region):
                continue
            try:
                done = replan(self._s, schedule.schedule_id)
            except Retryable:
                ok = False
                continue
            if done is not None:
                replanned.append(done)
                logger.warning(
                    "re-planned a schedule under new time zone rules",
                    extra={
                        "schedule_id": done.schedule_id,
                        "tzdata": [done.before, done.after],
                        "canceled": done.canceled,
                        "made": done.made,
                    },
                )
        return ok

    # --- cursors left behind ------------------------------------------------------------

    def _unstick(self, shard: int, start: int, end: int) -> list[str]:
        """Schedules still in a due bucket of the window that the shard's walk has passed:
        their cursor was placed behind the watermark (a due index that lagged behind a
        change, past every margin), so no walk would read it again. Each is moved to a bucket
        ahead of the walk, where the materializer takes it up under its misfire policy."""
        walked = self.leases.watermark(shard)
        if walked is None or not self.schedules.any_in_shard(shard, created_before=_iso(end)):
            return []
        moved = []
        for minute in range(start - start % 60, min(end, walked), 60):
            for seen in self.schedules.due_in(minute, shard):
                schedule_id = seen.schedule.schedule_id
                stored = self.schedules.current(schedule_id)  # the index may be stale
                if stored is None or stored.due_bucket != seen.due_bucket:
                    continue
                if not homed_in(stored.schedule, self.settings.region):
                    continue  # another region's walk plans it
                ahead = max(walked, minute_of(self._now())) + 2 * 60
                try:
                    self._s.transactions.commit(
                        [
                            (Label.SCHEDULE, self.schedules.move_due_action(stored, ahead)),
                            (Label.SHARD, self.leases.not_walked_action(shard, ahead)),
                        ]
                    )
                except (ConditionFailed, Retryable):
                    continue  # stepped or changed meanwhile, or the walk passed: next run
                moved.append(schedule_id)
                logger.warning(
                    "moved a schedule left behind the walk",
                    extra={"schedule_id": schedule_id, "shard": shard},
                )
        return moved

    # --- one schedule -------------------------------------------------------------------

    def _unread(self, current: ScheduleVersion, start: int, end: int, skip_idle: bool) -> bool:
        """True for a schedule with nothing to check in [start, end): another region's; or
        one unchanged since the history margin began that owns no fire in the window and is
        dormant, or idle (only with ``skip_idle``: the window closed long enough ago for the
        index to show a run now made in it)."""
        if not homed_in(current.schedule, self.settings.region):
            # Another region plans it (a take-over): that region's reconciler checks it; a
            # repair from here would materialize beside it.
            return True
        since = start - HISTORY_MARGIN
        if current.effective_from > since or expected_occurrences(
            [current], start, end, horizon=self.horizon
        ):
            return False
        # (A run now made before the schedule completed is read, dormant or not.)
        marked = current.manual_through is not None and current.manual_through >= start
        if dormant(current, since) and not marked:
            return True
        return skip_idle and idle(current, start, end, since)

    def _schedule(
        self, current: ScheduleVersion, start: int, end: int, index_settled: bool
    ) -> _ScheduleOutcome:
        schedule_id = current.schedule.schedule_id
        since = start - HISTORY_MARGIN
        window = self.occurrences.window(schedule_id, since=start, until=end - 1)
        stored = window.occurrences
        versions = [current]
        # Race: the shard index lags a change made a moment ago (it still shows the version
        # before): an occurrence of a later version says so, and without the history that
        # version's fires would be judged strays of the old one.
        newer = any(o.schedule_version > current.schedule.version for o in stored)
        if current.effective_from > since or newer:
            # A version changed near or after the window: the history says who owned what.
            versions = self.schedules.versions_since(schedule_id, since) or versions
        expected = expected_occurrences(versions, start, end, horizon=self.horizon)
        outcome = _ScheduleOutcome(
            schedule_id, by_version(versions), (start, end), tenant_id=current.schedule.tenant_id
        )
        outcome.seen = {o.occurrence_id: o for o in stored}
        # A tenant's unreadable item at an instant is not judged (it is not an occurrence
        # Punctual wrote), but its key is taken: nothing is missing there to repair.
        outcome.unreadable = list(window.unreadable)
        taken = set(window.unreadable)
        classified = self._classify(outcome, expected, stored)
        outcome.gaps = {g.occurrence_id: g for g in classified}
        gaps = [e for e in classified if e.occurrence_id not in taken]
        since_home = current.schedule.homed_since
        if since_home is not None:
            # Taken over from another region: what was due before is in that region's
            # table, unknown here, and not this region's to find missing or to repair.
            gaps = [g for g in gaps if g.available_at > since_home]
        policy_missed = self._missed_by_policy(
            gaps, stored, outcome.versions, current.schedule, end
        )
        for gap in gaps:
            if gap.occurrence_id in policy_missed:
                outcome.findings.append((Finding.MISSED, gap.occurrence_id))
            else:
                outcome.findings.append((Finding.MISSING, gap.occurrence_id))
                outcome.missing.append(gap)
        if may_have_backfilled(current, start, index_settled):
            self._backfilled(outcome, stored, start, end)
        return outcome

    def _backfilled(
        self, outcome: _ScheduleOutcome, seen: list[Occurrence], start: int, end: int
    ) -> None:
        """The open occurrences that the schedule's backfills made in [start, end) (their
        records, ``OccurrenceStore.backfilled``), in whatever hours their instants are: in
        flight in this window, which stays unsettled and is checked again, and re-sent once
        overdue (``_redrive``). Their instants' hours cannot do it: one may have been checked
        and settled before the backfill (its fires recorded MISSED), or never be checked (a
        fire before the schedule existed)."""
        schedule_id = outcome.schedule_id
        ranges = self.occurrences.backfilled(
            schedule_id, since=start, until=end, unreadable=outcome.unreadable
        )
        # (Within what a backfill can make: no older than the retention, nothing beyond the
        # materializer's reach. A record a tenant's worker forged costs reads of its own
        # schedule's occurrences, at most once per range.)
        low, high = start - self.settings.retention_days * DAY - DAY, end + DAY
        known = {o.occurrence_id for o in seen}
        for since, until in merged(ranges, low, high):
            # Consistent: the window settles on what this read shows, and a lagging replica
            # may not show what a backfill made in its last seconds (a check run right after
            # the window closed).
            window = self.occurrences.window(
                schedule_id, since=since, until=until - 1, consistent=True
            )
            for occurrence in window.occurrences:
                if occurrence.state in _OPEN and occurrence.occurrence_id not in known:
                    known.add(occurrence.occurrence_id)
                    outcome.findings.append((Finding.IN_FLIGHT, occurrence.occurrence_id))
                    outcome.stalled.append(occurrence)

    @staticmethod
    def _classify(
        outcome: _ScheduleOutcome, expected: list[Expected], stored: list[Occurrence]
    ) -> list[Expected]:
        """Stored occurrences by their state; returns the required instants with no record."""
        by_id = {e.occurrence_id: e for e in expected}
        # A zone-based fire is its local wall time: one planned under older zone rules (an
        # instant the rules in use no longer give it) is still that fire (punctual.pipeline.rezone).
        by_wall = {
            (e.version, wall): e
            for e in expected
            if (wall := wall_text(outcome.versions[e.version], e.scheduled_for)) is not None
        }
        present: set[str] = set()
        for occurrence in stored:
            owner = by_id.get(occurrence.occurrence_id)
            planned = outcome.versions.get(occurrence.schedule_version)
            if (
                occurrence.local is not None
                and planned is not None
                # (only when the rules in use no longer show its instant at its wall time:
                # a stray fired at the second of a repeated hour still shows it, and stays
                # UNEXPECTED)
                and not shows_wall(planned, occurrence.scheduled_for, occurrence.local)
            ):
                # Even when its id is another fire's now (08:00 moved onto the instant that
                # fired as 09:00): crediting that one would leave 09:00 a gap, and the repair
                # would fire it twice. A wall time outside the window keeps the id's owner.
                owner = by_wall.get((occurrence.schedule_version, occurrence.local), owner)
            # (An owner has the occurrence's version: found by id, which carries it, or by
            # the version and the wall time.)
            if owner is not None:
                present.add(owner.occurrence_id)
            if is_manual(occurrence.occurrence_id) or rezoned(occurrence):
                # Run now: no fire owes it, and none is owed it; nor one a change of the
                # zone's rules canceled (its replacement is the fire's). By state only.
                finding = FOUND_IN[occurrence.state]
            elif owner is None:
                finding = Finding.UNEXPECTED
            elif owner.required:
                finding = FOUND_IN[occurrence.state]
            else:
                finding = Finding.SUPERSEDED
            outcome.findings.append((finding, occurrence.occurrence_id))
            if occurrence.state in _OPEN:
                outcome.stalled.append(occurrence)
        present |= {o.occurrence_id for o in stored}
        return [e for e in expected if e.required and e.occurrence_id not in present]

    def _missed_by_policy(
        self,
        gaps: list[Expected],
        stored: list[Occurrence],
        schedules: dict[int, Schedule],
        current: Schedule,
        end: int,
        *,
        consistent: bool = False,
    ) -> set[str]:
        """Gaps the materializer left on purpose: MISSED by the misfire policy.

        Two traces: the MISSED episodes recorded on the current schedule (the latest
        MISSED_RANGES, every version), and the next stored fire of the same version (not a
        run now or a backfill's) having been fired late (FIRE_ONCE and CATCHUP fire the
        latest late instants and leave the ones before them). A gap
        that was materialized, then lost, right before an outage is taken for MISSED too:
        nothing stored tells those two apart.
        """
        missed = {
            g.occurrence_id
            for g in gaps
            if any(r.covers(g.version, g.scheduled_for) for r in current.missed)
        }
        later: dict[int, Occurrence | None] = {}  # per version: its first occurrence after end
        in_order = sorted(stored, key=lambda o: o.scheduled_for)
        for gap in gaps:
            if gap.occurrence_id in missed or gap.version not in schedules:
                continue
            follower = next(
                (
                    o
                    for o in in_order
                    if o.schedule_version == gap.version
                    and o.scheduled_for > gap.scheduled_for
                    and not is_manual(o.occurrence_id)
                ),
                None,
            )
            if follower is None:
                if gap.version not in later:
                    later[gap.version] = self._first_after(
                        gap.schedule_id, gap.version, end - 1, consistent=consistent
                    )
                follower = later[gap.version]
            window = schedules[gap.version].flexible_window_seconds
            if follower is not None and fired_late(follower, window):
                missed.add(gap.occurrence_id)
        return missed

    def _first_after(
        self, schedule_id: str, version: int, after: int, *, consistent: bool
    ) -> Occurrence | None:
        """The version's first stored fire after ``after`` (read one page ahead): not a run
        now or a backfill's, which are receivable when asked, never the policy's late fire."""
        found = self.occurrences.first_after(
            schedule_id, after=after, limit=FOLLOWER_PAGE, consistent=consistent
        )
        return next(
            (o for o in found if o.schedule_version == version and not is_manual(o.occurrence_id)),
            None,
        )

    # --- re-drive -----------------------------------------------------------------------

    def _redrive(self, outcome: _ScheduleOutcome) -> None:
        """Re-send the schedule's open occurrences that no worker took long after they were
        due (punctual.pipeline.redrive). Read again, consistently: the decision needs the
        state as it is now (a worker may have just taken one), and the message needs the
        payload."""
        now = self._now()
        ids = [o.occurrence_id for o in outcome.stalled if may_be_overdue(o, now)]
        found = self.occurrences.stored(ids)
        late = [outbound(s.occurrence.occurrence_id, s) for s in found if overdue(s, now)]
        if not late:
            return
        report = self.relay.send(late)
        # (Not one refused: an item whose tenant field its key does not name, forged.)
        sent = [o.occurrence.occurrence_id for o in late if o.record_id in report.sent_records]
        outcome.redriven += sent
        logger.warning(
            "re-sent occurrences no worker took",
            extra={"schedule_id": outcome.schedule_id, "occurrences": sent[:EXAMPLES]},
        )

    # --- repair -------------------------------------------------------------------------

    def _repair(self, outcome: _ScheduleOutcome) -> None:
        """MISSING instants get their occurrence now, through the conditional put, under the
        misfire policy; a lost race is re-read and tried once more.

        The gaps were found in eventually consistent reads (the shard index's MISSED
        episodes, the window's occurrences), which may not show a materializer's catch-up
        of a moment ago: its late fire and the MISSED episode of the instants before it. So
        each round judges them again from consistent reads before anything is put: a repair
        never adds a second late fire, with another id, to an outage the policy settled.
        (What it then fires the materializer has passed, by the same consistent read of the
        cursor, and a step records its episodes with the cursor it moves: none can come
        later for these instants.)"""
        pending = list(outcome.missing)
        start, end = outcome.window
        for _ in range(REPAIR_ATTEMPTS):
            stored = self.schedules.current(outcome.schedule_id)
            if stored is None or not homed_in(stored.schedule, self.settings.region):
                return  # gone, or taken over by another region since the index said otherwise
            current = stored.schedule
            window = self.occurrences.window(
                outcome.schedule_id, since=start, until=end - 1, consistent=True
            )
            # Race: a materializer's catch-up a moment before the first read made some of
            # the gaps (CATCHUP's late fires inside the window): found, they are judged by
            # their state; judged by the policy, they would be MISSED, and the hour settled
            # with them in flight.
            made = outcome.found_after_all(pending, window)
            pending = [e for e in pending if e.occurrence_id not in made]
            settled = self._missed_by_policy(
                pending, window.occurrences, outcome.versions, current, end, consistent=True
            )
            outcome.settled_by_policy(settled)
            pending = [e for e in pending if e.occurrence_id not in settled]
            if not pending:
                return
            now = self._now()
            decisions, deferred = self._decide(pending, current, now)
            outcome.deferred += [e.occurrence_id for e in deferred]
            if any(d.fire for d in decisions):
                # A repair fires the current version's payload, kept in its version item
                # alone (the CURRENT item has only a mark of it): read it, never {} for it.
                current = self.schedules.with_payload(stored).schedule
            failed = self._write(current, outcome.versions, decisions)
            for decision in decisions:
                if decision.expected not in failed:
                    target = outcome.fired if decision.fire else outcome.recorded_missed
                    target.append(decision.expected.occurrence_id)
            # Whatever someone else materialized meanwhile is no longer ours to repair (read
            # consistently: it may have been written a moment ago).
            made = {
                s.occurrence.occurrence_id
                for s in self.occurrences.stored([e.occurrence_id for e in failed])
            }
            pending = [e for e in failed if e.occurrence_id not in made]
            if not pending:
                return
        outcome.conflicts += [e.occurrence_id for e in pending]

    def _decide(
        self, gaps: list[Expected], current: Schedule, now: int
    ) -> tuple[list[_Decision], list[Expected]]:
        decisions: list[_Decision] = []
        deferred: list[Expected] = []
        candidates: list[Expected] = []
        for gap in sorted(gaps, key=lambda e: e.scheduled_for):
            if gap.version != current.run_version:
                # The worker refuses a superseded version's occurrence: it can only be missed.
                reason = f"missing; version {gap.version} was superseded by {current.run_version}"
                decisions.append(_Decision(gap, fire=False, reason=reason))
            elif current.state is ScheduleState.ACTIVE and not_handled_yet(current, gap):
                # The materializer has not got here yet: it will apply the misfire policy
                # itself, and an occurrence put here first would block its step.
                deferred.append(gap)
            else:
                candidates.append(gap)
        policy = current.misfire
        # Late as the materializer judges it: by when the fire was due to become receivable.
        late = [g for g in candidates if g.available_at < now - policy.max_lateness_seconds]
        keep = min(len(late), policy.effective_catchup_limit)
        fired_late_ones = late[len(late) - keep :]
        pace = self._catchup_pace(current, keep)
        for gap in candidates:
            if gap in late and gap not in fired_late_ones:
                reason = (
                    f"missing; later than max_lateness ({policy.max_lateness_seconds} s) "
                    f"under {policy.action.value}"
                )
                decisions.append(_Decision(gap, fire=False, reason=reason))
            elif gap in fired_late_ones:
                offset = fired_late_ones.index(gap) * pace
                decisions.append(_Decision(gap, fire=True, available_at=now + offset))
            else:
                decisions.append(_Decision(gap, fire=True, available_at=now))
        return decisions, deferred

    def _catchup_pace(self, schedule: Schedule, keep: int) -> int:
        if schedule.misfire.action is not MisfireAction.CATCHUP or keep < 2:
            return 0
        quotas = self._s.tenants.get(schedule.tenant_id).quotas
        pace = quotas.catchup_pace
        # SQS delays at most 900 s: a slower pace is compressed, as the materializer does.
        return min(pace, MAX_CATCHUP_SPREAD // (keep - 1))

    def _write(
        self, current: Schedule, versions: dict[int, Schedule], decisions: list[_Decision]
    ) -> list[Expected]:
        """Commit the decisions, 99 puts and one schedule check per transaction; returns the
        expected instants whose transaction was refused."""
        retention = self.settings.retention_days * 86400
        failed: list[Expected] = []
        for first in range(0, len(decisions), MAX_ACTIONS - 1):
            chunk = decisions[first : first + MAX_ACTIONS - 1]
            own = [
                d.expected.available_at for d in chunk if d.expected.version == current.run_version
            ]
            check = self.schedules.unchanged_action(current, stepped_past=max(own, default=None))
            actions = [(Label.SCHEDULE, check)] + [
                (
                    Label.OCCURRENCE,
                    self._put(
                        current
                        if d.expected.version == current.run_version
                        else versions.get(d.expected.version, current),
                        d,
                        retention,
                    ),
                )
                for d in chunk
            ]
            try:
                self._s.transactions.commit(actions)
            except (ConditionFailed, Retryable):
                failed += [d.expected for d in chunk]
        return failed

    def _put(self, schedule: Schedule, decision: _Decision, retention: int) -> dict[str, Any]:
        occurrence = new_occurrence(schedule, decision.expected.scheduled_for, retention)
        if decision.fire:
            # A repair is always after the fire's time: the catch-up lane relays it. (Only
            # the current version's gaps fire: ``_repair`` read its payload.)
            occurrence = occurrence.model_copy(
                update={"available_at": decision.available_at, "lane": Lane.CATCHUP}
            )
            return self.occurrences.put_new_action(occurrence, schedule.known_payload)
        missed = occurrence.model_copy(
            update={"state": OccurrenceState.MISSED, "reason": f"reconciler: {decision.reason}"}
        )
        # A MISSED record is never sent (the relay sends only SCHEDULED), so no payload.
        return self.occurrences.put_new_action(missed, {})


def metric_values(results: Iterable[ShardResult], given_up: int = 0) -> dict[str, int]:
    """Totals over shards, named as in docs/operations.md (no per-tenant dimension);
    ``given_up``: the shard-hours that left the catch-up horizon unsettled."""
    totals = dict.fromkeys(METRIC_NAMES.values(), 0) | {
        "ReconcileRepaired": 0,
        "ReconcileRepairFired": 0,
        "ReconcileRepairMissed": 0,
        "ReconcileRepairDeferred": 0,
        "ReconcileRepairConflicts": 0,
        "ReconcileSchedules": 0,
        "ReconcileIncomplete": 0,
        "ReconcileCursorsMoved": 0,
        "ReconcileRedriven": 0,
        "ReconcileReplanned": 0,
        "ReconcileGaveUp": given_up,
        "MalformedItems": 0,
    }
    for result in results:
        report = result.report
        for finding, count in report.counts.items():
            totals[METRIC_NAMES[finding]] += count
        totals["ReconcileRepaired"] += report.repaired_fired + report.repaired_missed
        totals["ReconcileRepairFired"] += report.repaired_fired
        totals["ReconcileRepairMissed"] += report.repaired_missed
        totals["ReconcileRepairDeferred"] += report.deferred
        totals["ReconcileRepairConflicts"] += report.repair_conflicts
        totals["ReconcileSchedules"] += report.schedules
        totals["ReconcileIncomplete"] += int(not report.complete)
        totals["ReconcileCursorsMoved"] += report.cursors_moved
        totals["ReconcileRedriven"] += report.redriven
        totals["ReconcileReplanned"] += report.replanned
        totals["MalformedItems"] += report.malformed
    return totals


def _enter(book: LedgerBook, outcome: _ScheduleOutcome) -> None:
    """The schedule's findings in the hour, into its tenant's ledger page: each with its
    occurrence as read (its state after this check's repair), or the fire it stands for."""
    tenant = outcome.tenant_id
    book.unreadable(tenant, len(outcome.unreadable))
    for finding, oid in outcome.findings:
        occurrence = outcome.seen.get(oid)
        if occurrence is not None:
            entry = LedgerEntry.of(occurrence, finding)
        elif (gap := outcome.gaps.get(oid)) is not None:
            owner = outcome.versions.get(gap.version)
            # What the gap came to: fired now (late), recorded MISSED now, MISSED by the
            # misfire policy's summary (no item), or none yet (deferred, a lost race).
            if oid in outcome.fired:
                state: OccurrenceState | None = OccurrenceState.SCHEDULED
            elif oid in outcome.recorded_missed or finding is Finding.MISSED:
                state = OccurrenceState.MISSED
            else:
                state = None
            entry = LedgerEntry(
                occurrence_id=oid,
                schedule_id=outcome.schedule_id,
                scheduled_for=gap.scheduled_for,
                finding=finding,
                state=state,
                target=owner.target if owner else None,
                late=oid in outcome.fired,
            )
        else:
            continue  # (a backfill's open occurrence of another hour: that hour's page)
        book.add(tenant, entry)


def _iso(instant: int) -> str:
    """The form ``created_key`` begins with ('2026-11-18T10:00:00+00:00')."""
    return datetime.fromtimestamp(instant, UTC).isoformat()
