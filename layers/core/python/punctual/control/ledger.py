"""GET /v1/occurrences: a tenant's occurrences across all its schedules in a time range.

Three sources, one time order (docs/data-model.md, *ledger*):

- the hours every shard's reconciler check has marked: its ledger pages
  (punctual.domain.ledger), counts by finding for every hour and, listed one by one, the
  exceptions, merged across shards by instant;
- the hours of the last three (the current one included) not yet marked on every shard:
  read live, every schedule's stored occurrences as they are now, counted by state and
  listed (the exceptions, or every one);
- the future: the next fires of the tenant's active schedules, computed from their
  definitions, nothing stored.

A page is ``limit`` items; ``next_token`` goes on from the last one (an opaque position:
phase, hour, instant and id, bound to the query it was made for).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from punctual.domain.errors import InvalidInput
from punctual.domain.findings import FOUND_IN, Finding
from punctual.domain.ids import available_at, occurrence_id, occurrence_name
from punctual.domain.ledger import HOUR, LedgerEntry, LedgerPage, listed
from punctual.domain.schedule import Schedule, ScheduleState
from punctual.services import Services

DAY = 24 * HOUR
MAX_RANGE = 7 * DAY
# The upcoming fires are computed from every active schedule of the tenant, read per call:
# past this many the answer says so (``upcoming_complete``) and lists none, rather than a
# part that would look like the whole.
MAX_SCHEDULES = 2000
# The recent hours are read live from every schedule of the tenant (a query each, every
# page of the answer): past this many, ``live_complete`` is false and they come from the
# pages alone, as older ones.
MAX_LIVE_SCHEDULES = 500
# An hour not yet checked on every shard that ended less than this long ago (or has not
# ended) is read live: every schedule's stored occurrences of it, as they are now. (The
# reconciler checks an hour about two hours after it ends.)
LIVE_SECONDS = 3 * HOUR
LIVE_READERS = 16  # schedules read at once for the live hours
MARKS_SECONDS = 60  # how long a process keeps a day's marks (``Marks``)
MARKS_DAYS = 16  # days of marks it keeps at most
UPCOMING = "UPCOMING"  # the state shown for a computed fire
MISSING = Finding.MISSING.value  # the state shown for a fire with no occurrence
_PAGE = 100  # schedules read per index page for the upcoming fires


@dataclass(frozen=True, slots=True)
class LedgerFilter:
    states: frozenset[str] = frozenset()  # occurrence states, UPCOMING, MISSING; empty: any
    findings: frozenset[Finding] = frozenset()  # empty: any
    target: str | None = None
    # Every occurrence of the hours read live, not only the exceptions (a checked hour's
    # page keeps only those: its successes are counted, not listed).
    every: bool = False

    def digest(self) -> str:
        text = json.dumps([sorted(self.states), sorted(self.findings), self.target, self.every])
        return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()

    def admits(self, state: str, finding: Finding | None, target: str | None) -> bool:
        return (
            (not self.states or state in self.states)
            and (not self.findings or finding in self.findings)
            and (self.target is None or target == self.target)
        )


@dataclass(frozen=True, slots=True)
class Upcoming:
    occurrence_id: str
    schedule_id: str
    scheduled_for: int
    available_at: int
    target: str

    @property
    def order(self) -> tuple[int, str]:
        return self.scheduled_for, self.occurrence_id


@dataclass
class HourSummary:
    hour: int
    shards: int  # the deployment's shard count
    shards_checked: int  # shards whose check of the hour wrote its pages
    checked_at: int | None = None  # the latest of those checks
    counts: Counter[Finding] = field(default_factory=Counter)
    retried: int = 0
    late: int = 0
    unlisted: int = 0
    unreadable: int = 0
    live: bool = False  # read from the occurrences as they are now, not from the pages

    def add(self, page: LedgerPage) -> None:
        self.counts.update(page.counts)
        self.retried += page.retried
        self.late += page.late
        self.unlisted += page.unlisted
        self.unreadable += page.unreadable


@dataclass
class LedgerAnswer:
    items: list[LedgerEntry | Upcoming]
    hours: list[HourSummary]
    upcoming_complete: bool | None  # None: the page ended before the upcoming fires
    next_token: str | None
    live_complete: bool = True  # False: too many schedules to read the recent hours live


def shown_state(entry: LedgerEntry) -> str:
    """What the ledger shows as an entry's state: its occurrence's, or MISSING without one."""
    return entry.state.value if entry.state is not None else MISSING


@dataclass(frozen=True, slots=True)
class _Position:
    """Where a page ends: phase 0 the checked hours, 1 the upcoming fires."""

    phase: int = 0
    hour: int | None = None  # the hour being listed (phase 0): its summary was given
    after: tuple[int, str] | None = None  # the last item given


class Marks:
    """The shards' marks of each day, kept MARKS_SECONDS by the process that read them (the
    API's: one per Lambda environment). Every tenant's read needs them and they sit in one
    partition per day that all tenants share: read each time, one tenant reading in a loop
    would throttle the others' reads. A mark changes once per check of a shard's hour; kept
    a minute, an hour shows a shard fewer checked for that long (and is read live meanwhile,
    when recent)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._days: dict[tuple[str, int], tuple[int, dict[int, dict[int, int]]]] = {}

    def of_day(self, services: Services, day: int, now: int) -> dict[int, dict[int, int]]:
        key = (services.settings.ledger_table, day)
        with self._lock:
            kept = self._days.get(key)
        if kept is not None and 0 <= now - kept[0] < MARKS_SECONDS:
            return kept[1]
        found = services.ledger.checked(day, day + DAY - HOUR)
        with self._lock:
            if len(self._days) >= MARKS_DAYS:
                self._days.pop(min(self._days, key=lambda k: self._days[k][0]))
            self._days[key] = (now, found)
        return found


class Ledger:
    def __init__(self, services: Services, marks: Marks | None = None) -> None:
        self._s = services
        self._marks = marks or Marks()
        # The tenant's schedules (ACTIVE ones, or all), read once a call.
        self._read: dict[ScheduleState | None, tuple[list[Schedule], bool]] = {}

    def read(
        self,
        tenant_id: str,
        *,
        since: int | None,
        until: int | None,
        wanted: LedgerFilter,
        limit: int,
        token: str | None,
    ) -> LedgerAnswer:
        """A page of the ledger of [since, until) (default: the last day and the next hour;
        a page after the first takes them from its token when not given)."""
        now = int(self._s.now())
        position, made_for = _decode(token)
        if made_for is not None:
            since = made_for[0] if since is None else since
            until = made_for[1] if until is None else until
        since = now - DAY if since is None else since
        until = now + HOUR if until is None else until
        _check_range(since, until, now, self._s.settings.retention_days)
        query = (since, until, wanted.digest())
        if made_for is not None and made_for != query:
            raise _bad_token()
        items: list[LedgerEntry | Upcoming] = []
        hours: list[HourSummary] = []
        if position.phase == 0:
            past = self._recorded(tenant_id, since, until, now, position, hours, wanted.every)
            for entry, hour in past:
                if wanted.admits(shown_state(entry), entry.finding, entry.target):
                    items.append(entry)
                    if len(items) == limit:
                        end = _Position(0, hour, entry.order)
                        return self._answer(items, hours, None, _encode(query, end))
            position = _Position(1)
        upcoming, complete = self._upcoming(tenant_id, since, until, now, position, wanted)
        for fire in upcoming:
            if len(items) == limit:
                end = _Position(1, None, items[-1].order)
                return self._answer(items, hours, complete, _encode(query, end))
            items.append(fire)
        return self._answer(items, hours, complete, None)

    def _answer(
        self,
        items: list[LedgerEntry | Upcoming],
        hours: list[HourSummary],
        complete: bool | None,
        token: str | None,
    ) -> LedgerAnswer:
        live = self._read.get(None, ([], True))[1]
        return LedgerAnswer(items, hours, complete, token, live)

    def _schedules(
        self, tenant_id: str, state: ScheduleState | None = None
    ) -> tuple[list[Schedule], bool]:
        """The tenant's schedules in ``state`` (None: any, a paused or canceled one has its
        past), read once a call; False (and none) past MAX_SCHEDULES, or MAX_LIVE_SCHEDULES
        for any state (what the live hours read)."""
        bound = MAX_SCHEDULES if state is not None else MAX_LIVE_SCHEDULES
        if state not in self._read:
            found: list[Schedule] = []
            token: str | None = None
            while True:
                page, token = self._s.schedules.list_for_tenant(
                    tenant_id, state=state, limit=_PAGE, token=token, payloads=False
                )
                found += page
                if len(found) > bound:
                    self._read[state] = [], False
                    break
                if token is None:
                    self._read[state] = found, True
                    break
        return self._read[state]

    def _recorded(
        self,
        tenant_id: str,
        since: int,
        until: int,
        now: int,
        position: _Position,
        hours: list[HourSummary],
        every: bool,
    ) -> Iterator[tuple[LedgerEntry, int]]:
        """The listed entries of the hours up to now, in order, after ``position``; each
        hour's summary goes into ``hours`` as its listing begins (once: not again for the
        hour a page resumes in). An hour every shard's check wrote comes from its pages; a
        recent one not yet checked on every shard is read live (``_live``); an older one
        that is still not, from the pages it has."""
        first = max(_floor(since), position.hour or 0)
        last = _floor(min(until, now) - 1)  # (the hour holding the last second gone by)
        if last < first:
            return
        shards = self._s.settings.shard_count
        recent = _floor(now - LIVE_SECONDS)
        live: dict[int, tuple[HourSummary, list[LedgerEntry]]] | None = None
        for hour, pages, marks in self._hours(tenant_id, first, last):
            checked_at = max(marks.values(), default=None)
            summary = HourSummary(hour, shards, len(marks), checked_at)
            entries: Iterable[LedgerEntry]
            if len(marks) < shards and hour >= recent and self._schedules(tenant_id)[1]:
                if live is None:
                    live = self._live(tenant_id, max(since, hour), min(until, now), every)
                summary.live = True
                summary, entries = live.get(hour, (summary, []))
                summary.shards_checked, summary.checked_at = len(marks), checked_at
            else:
                # A page counts under its shard's mark: without one (a check that stopped
                # before writing it, its first one) it is not the hour as checked. (A page is
                # not rewritten by a re-check that finds it the same: it may be older than
                # the mark.)
                pages = [p for p in pages if p.shard < shards and p.shard in marks]
                for page in pages:
                    summary.add(page)
                entries = heapq.merge(*(page.entries for page in pages), key=lambda e: e.order)
            if hour != position.hour:
                hours.append(summary)
            for entry in entries:
                if not since <= entry.scheduled_for < until:
                    continue
                after = position.after if hour == position.hour else None
                if after is not None and entry.order <= after:
                    continue  # (given on an earlier page)
                yield entry, hour

    def _live(
        self, tenant_id: str, low: int, high: int, every: bool
    ) -> dict[int, tuple[HourSummary, list[LedgerEntry]]]:
        """Each hour of [low, high) as its occurrences are stored now: every schedule of the
        tenant read (LIVE_READERS at once; eventually consistent, as a page: what was
        written a second ago may show next time), counted by their states and listed (the
        exceptions, or ``every`` one), in order."""
        schedules, _ = self._schedules(tenant_id)
        shards = self._s.settings.shard_count
        found: dict[int, tuple[HourSummary, list[LedgerEntry]]] = {}

        def read(schedule: Schedule) -> tuple[list[LedgerEntry], list[str]]:
            claims: dict[str, int] = {}
            window = self._s.occurrences.window(
                schedule.schedule_id, since=low, until=high - 1, claims=claims
            )
            entries = [
                LedgerEntry.of(
                    o, FOUND_IN[o.state], claimed_at=claims.get(o.occurrence_id), detail=True
                )
                for o in window.occurrences
            ]
            return entries, window.unreadable

        with ThreadPoolExecutor(max_workers=LIVE_READERS) as pool:
            answers = list(pool.map(read, schedules))
        for _, unreadable in answers:
            for oid in unreadable:
                _summary(found, _floor(occurrence_name(oid)[2]), shards).unreadable += 1
        read_all = [entry for entries, _ in answers for entry in entries]
        for entry in sorted(read_all, key=lambda e: e.order):
            summary = _summary(found, _floor(entry.scheduled_for), shards)
            summary.counts[entry.finding] += 1
            summary.retried += entry.attempts > 1
            summary.late += entry.late
            if every or listed(entry.finding, entry.attempts, entry.late):
                found[summary.hour][1].append(entry)
        return found

    def _hours(
        self, tenant_id: str, first: int, last: int
    ) -> Iterator[tuple[int, list[LedgerPage], dict[int, int]]]:
        """Each hour of [first, last] with the tenant's pages and the shards' marks, read as
        the listing gets there (marks a day at a time, pages an hour at a time: a page of
        the answer that fills in its first hour reads no further)."""
        store, now = self._s.ledger, int(self._s.now())
        for day in range(first - first % DAY, last + 1, DAY):
            low, high = max(first, day), min(last, day + DAY - HOUR)
            checked = self._marks.of_day(self._s, day, now)
            for hour in range(low, high + 1, HOUR):
                yield hour, list(store.pages(tenant_id, hour, hour)), checked.get(hour, {})

    def _upcoming(
        self,
        tenant_id: str,
        since: int,
        until: int,
        now: int,
        position: _Position,
        wanted: LedgerFilter,
    ) -> tuple[Iterator[Upcoming], bool]:
        """The tenant's active schedules' fires in [max(since, now), until), in order, after
        ``position``; False when the tenant has too many schedules to compute them."""
        low = max(since, now)
        # (A computed fire has no finding: a finding filter admits none.)
        if low >= until or not wanted.admits(UPCOMING, None, wanted.target):
            return iter(()), True
        found, complete = self._schedules(tenant_id, ScheduleState.ACTIVE)
        if not complete:
            return iter(()), False
        # (The index the state filter reads is eventually consistent: one paused a moment ago
        # may be listed. Its item, read after, says so.)
        schedules = [s for s in found if s.state is ScheduleState.ACTIVE]
        if wanted.target is not None:
            schedules = [s for s in schedules if s.target == wanted.target]
        return _fires(schedules, low, until, position.after), True


def _summary(
    found: dict[int, tuple[HourSummary, list[LedgerEntry]]], hour: int, shards: int
) -> HourSummary:
    if hour not in found:
        found[hour] = (HourSummary(hour, shards, 0, live=True), [])
    return found[hour][0]


def _fires(
    schedules: list[Schedule], low: int, until: int, after: tuple[int, str] | None
) -> Iterator[Upcoming]:
    """Every fire of ``schedules`` in [low, until), after ``after``, in order: a heap of each
    schedule's next one (a schedule's fires are computed only as far as they are taken)."""
    start = low - 1 if after is None else max(low - 1, after[0] - 1)
    heap: list[tuple[int, str, int]] = []
    for index, schedule in enumerate(schedules):
        fire = schedule.rule().next_after(max(start, schedule.fires_after))
        if fire is not None and fire < until:
            heap.append(
                (fire, occurrence_id(schedule.schedule_id, schedule.run_version, fire), index)
            )
    heapq.heapify(heap)
    while heap:
        fire, oid, index = heapq.heappop(heap)
        schedule = schedules[index]
        following = schedule.rule().next_after(fire)
        if following is not None and following < until:
            key = occurrence_id(schedule.schedule_id, schedule.run_version, following)
            heapq.heappush(heap, (following, key, index))
        if after is not None and (fire, oid) <= after:
            continue
        yield Upcoming(
            occurrence_id=oid,
            schedule_id=schedule.schedule_id,
            scheduled_for=fire,
            available_at=available_at(oid, fire, schedule.flexible_window_seconds),
            target=schedule.target,
        )


def _floor(instant: int) -> int:
    return instant - instant % HOUR


def _check_range(since: int, until: int, now: int, retention_days: int) -> None:
    problems = []
    if until <= since:
        problems.append({"field": "to", "reason": "must be later than from"})
    elif until - since > MAX_RANGE:
        problems.append({"field": "to", "reason": f"a range spans at most {MAX_RANGE // DAY} days"})
    if since < now - retention_days * DAY:
        problems.append(
            {"field": "from", "reason": f"occurrences are kept {retention_days} days: not earlier"}
        )
    if problems:
        raise InvalidInput(
            "the range is not valid: "
            + "; ".join(f"{p['field']}: {p['reason']}" for p in problems),
            problems,
        )


def _bad_token() -> InvalidInput:
    return InvalidInput(
        "next_token is not valid",
        [
            {
                "field": "next_token",
                "reason": "not a token issued for this query (from, to, filters)",
            }
        ],
    )


Query = tuple[int, int, str]  # (since, until, the filter's digest) a token was made for


def _encode(query: Query, position: _Position) -> str:
    raw = json.dumps([*query, position.phase, position.hour, position.after])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(token: str | None) -> tuple[_Position, Query | None]:
    """The position a token names and the query it was made for; 400 if it is not a token
    this module made."""
    if not token:
        return _Position(), None
    try:
        raw = json.loads(base64.urlsafe_b64decode((token + "=" * (-len(token) % 4)).encode()))
        since, until, digest, phase, hour, after = raw
        query = (int(since), int(until), str(digest))
        position = _Position(
            int(phase),
            None if hour is None else int(hour),
            (int(after[0]), str(after[1])),
        )
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, binascii.Error):
        raise _bad_token() from None
    hour, after = position.hour, position.after
    if position.phase not in (0, 1) or (position.phase == 0) != (hour is not None):
        raise _bad_token()
    if hour is not None and after is not None and (hour % HOUR or not 0 <= after[0] - hour < HOUR):
        raise _bad_token()  # (a position no page ends at: its hour holds its last item)
    return position, query
