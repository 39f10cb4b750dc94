"""GET /v1/occurrences: a tenant's occurrences across all its schedules in a time range.

Three sources, one time order (docs/data-model.md, *The ledger*):

- the hours the reconciler has checked: its ledger pages (punctual.domain.ledger), counts by
  finding for every hour and, listed one by one, the exceptions (what did not succeed at its
  first attempt), merged across shards by instant;
- the hours it has not checked yet (the last two or so, or more when it is behind): shown as
  such, nothing listed (a schedule's own occurrences are listed at once by
  ``GET /v1/schedules/{id}/occurrences``);
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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby

from punctual.domain.errors import InvalidInput
from punctual.domain.findings import Finding
from punctual.domain.ids import available_at, occurrence_id
from punctual.domain.ledger import HOUR, LedgerEntry, LedgerPage
from punctual.domain.schedule import Schedule, ScheduleState
from punctual.services import Services

DAY = 24 * HOUR
MAX_RANGE = 7 * DAY
# The upcoming fires are computed from every active schedule of the tenant, read per call:
# past this many the answer says so (``upcoming_complete``) and lists none, rather than a
# part that would look like the whole.
MAX_UPCOMING_SCHEDULES = 2000
UPCOMING = "UPCOMING"  # the state shown for a computed fire
MISSING = Finding.MISSING.value  # the state shown for a fire with no occurrence
_PAGE = 100  # schedules read per index page for the upcoming fires


@dataclass(frozen=True, slots=True)
class LedgerFilter:
    states: frozenset[str] = frozenset()  # occurrence states, UPCOMING, MISSING; empty: any
    findings: frozenset[Finding] = frozenset()  # empty: any
    target: str | None = None

    def digest(self) -> str:
        text = json.dumps([sorted(self.states), sorted(self.findings), self.target])
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
    unlisted: int = 0
    unreadable: int = 0

    def add(self, page: LedgerPage) -> None:
        self.counts.update(page.counts)
        self.retried += page.retried
        self.unlisted += page.unlisted
        self.unreadable += page.unreadable


@dataclass
class LedgerAnswer:
    items: list[LedgerEntry | Upcoming]
    hours: list[HourSummary]
    upcoming_complete: bool | None  # None: the page ended before the upcoming fires
    next_token: str | None


def shown_state(entry: LedgerEntry) -> str:
    """What the ledger shows as an entry's state: its occurrence's, or MISSING without one."""
    return entry.state.value if entry.state is not None else MISSING


@dataclass(frozen=True, slots=True)
class _Position:
    """Where a page ends: phase 0 the checked hours, 1 the upcoming fires."""

    phase: int = 0
    hour: int | None = None  # the hour being listed (phase 0): its summary was given
    after: tuple[int, str] | None = None  # the last item given


class Ledger:
    def __init__(self, services: Services) -> None:
        self._s = services

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
            for entry, hour in self._recorded(tenant_id, since, until, now, position, hours):
                if wanted.admits(shown_state(entry), entry.finding, entry.target):
                    items.append(entry)
                    if len(items) == limit:
                        end = _Position(0, hour, entry.order)
                        return LedgerAnswer(items, hours, None, _encode(query, end))
            position = _Position(1)
        upcoming, complete = self._upcoming(tenant_id, since, until, now, position, wanted)
        for fire in upcoming:
            if len(items) == limit:
                end = _Position(1, None, items[-1].order)
                return LedgerAnswer(items, hours, complete, _encode(query, end))
            items.append(fire)
        return LedgerAnswer(items, hours, complete, None)

    def _recorded(
        self,
        tenant_id: str,
        since: int,
        until: int,
        now: int,
        position: _Position,
        hours: list[HourSummary],
    ) -> Iterator[tuple[LedgerEntry, int]]:
        """The listed entries of the hours that have ended, in order, after ``position``;
        each hour's summary goes into ``hours`` as its listing begins (once: not again for
        the hour a page resumes in)."""
        first = max(_floor(since), position.hour or 0)
        last = min(_floor(until - 1), _floor(now) - HOUR)  # (the last hour that has ended)
        if last < first:
            return
        shards = self._s.settings.shard_count
        for hour, pages, marks in self._hours(tenant_id, first, last):
            if hour != position.hour:
                checked_at = max(marks.values(), default=None)
                summary = HourSummary(hour, shards, len(marks), checked_at)
                for page in pages:
                    summary.add(page)
                hours.append(summary)
            merged = heapq.merge(*(page.entries for page in pages), key=lambda e: e.order)
            for entry in merged:
                if not since <= entry.scheduled_for < until:
                    continue
                after = position.after if hour == position.hour else None
                if after is not None and entry.order <= after:
                    continue  # (given on an earlier page)
                yield entry, hour

    def _hours(
        self, tenant_id: str, first: int, last: int
    ) -> Iterator[tuple[int, list[LedgerPage], dict[int, int]]]:
        """Each hour of [first, last] with the tenant's pages and the shards' marks, read a
        day at a time as the listing gets there (a page of the answer that fills in its
        first hour reads no further)."""
        store = self._s.ledger
        for day in range(first - first % DAY, last + 1, DAY):
            low, high = max(first, day), min(last, day + DAY - HOUR)
            checked = store.checked(low, high)
            by_hour = {
                hour: list(pages)
                for hour, pages in groupby(store.pages(tenant_id, low, high), key=lambda p: p.hour)
            }
            for hour in range(low, high + 1, HOUR):
                yield hour, by_hour.get(hour, []), checked.get(hour, {})

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
        schedules: list[Schedule] = []
        token: str | None = None
        while True:
            page, token = self._s.schedules.list_for_tenant(
                tenant_id, state=ScheduleState.ACTIVE, limit=_PAGE, token=token, payloads=False
            )
            schedules += page
            if len(schedules) > MAX_UPCOMING_SCHEDULES:
                return iter(()), False
            if token is None:
                break
        if wanted.target is not None:
            schedules = [s for s in schedules if s.target == wanted.target]
        return _fires(schedules, low, until, position.after), True


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
    except (ValueError, TypeError, IndexError, KeyError, binascii.Error):
        raise _bad_token() from None
    if position.phase not in (0, 1) or (position.phase == 0) != (position.hour is not None):
        raise _bad_token()
    return position, query
