"""Manual runs: run now (one occurrence, receivable at once, idempotent under its key) and
backfill (an occurrence for every fire of a range that has none, paced at the tenant's
catch-up pace). The control plane (punctual.control.plane) delegates both here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from punctual.dal.common import ConditionFailed, Label
from punctual.dal.occurrences import Window
from punctual.dal.schedules import StoredSchedule
from punctual.dal.tenants import manual_run_update
from punctual.domain.errors import Conflict, InvalidInput, RateExceeded, Retryable
from punctual.domain.ids import (
    available_at,
    backfill_tag,
    is_manual,
    manual_tag,
    minute_of,
    occurrence_id,
    occurrence_name,
)
from punctual.domain.occurrence import Lane, Occurrence, OccurrenceState
from punctual.domain.planning import MAX_CATCHUP_SPREAD, handled_until, wall_text
from punctual.domain.schedule import Schedule, ScheduleState
from punctual.domain.tenancy import Tenant
from punctual.pipeline.rezone import SPAN as REZONE_SPAN
from punctual.timing import utc_text

if TYPE_CHECKING:
    from punctual.control.plane import ControlPlane

# A run now read again after its transaction was refused (the key's first request won, the
# schedule or the minute's count moved); more refusals in a row answer "retry".
TRIGGER_ATTEMPTS = 4
# A backfill's puts per transaction, next to the schedule's version check and the backfill's
# record (100 actions).
BACKFILL_CHUNK = 98
BACKFILL_SHOWN = 10  # occurrences a backfill's answer lists
# States of an occurrence that was never delivered and never will be: a backfill may make
# its instant anew. (SKIPPED_OVERLAP was delivered, and the overlap policy decided: kept.)
_NOT_RUN = frozenset({OccurrenceState.MISSED, OccurrenceState.CANCELED})


@dataclass(frozen=True, slots=True)
class Triggered:
    """A run-now request's occurrence; ``replayed`` when an earlier request with the same
    Idempotency-Key made it."""

    occurrence: Occurrence
    replayed: bool


@dataclass(frozen=True, slots=True)
class Backfilled:
    """What a backfill of [since, until) found and made (or, dry, would make): its fires,
    those that already have an occurrence, those the materializer will still make, and the
    occurrences made, paced from now (the first BACKFILL_SHOWN in ``shown``)."""

    fires: int
    existing: int
    planned: int
    made: list[Occurrence]
    dry_run: bool

    @property
    def shown(self) -> list[Occurrence]:
        return self.made[:BACKFILL_SHOWN]


def _fires_in(schedule: Schedule, since: int, until: int, limit: int) -> list[int]:
    """The schedule's fires in [since, until), refused when there are more than ``limit``
    (read one at a time: a wide range of a frequent schedule is never listed whole)."""
    rule = schedule.rule()
    found: list[int] = []
    fire = rule.next_after(since - 1)
    while fire is not None and fire < until:
        if len(found) == limit:
            raise InvalidInput(
                f"the range holds more than {limit} fires (max_backfill_occurrences); narrow it",
                [{"field": "to", "reason": f"more than {limit} fires from from"}],
            )
        found.append(fire)
        fire = rule.next_after(fire)
    return found


def _has_run(occurrence: Occurrence, backfill: str) -> bool:
    """Ran or will, as a backfill judges it: a fire's occurrence (any version) unless it
    never ran, and any of the schedule's backfilled ones (``backfill``: their tag; their ids
    are taken). A run now is not a fire."""
    _, _, _, manual = occurrence_name(occurrence.occurrence_id)
    return (manual is None and occurrence.state not in _NOT_RUN) or manual == backfill


class ManualRuns:
    """Run now and backfill, on the control plane's stores (the same objects: what a test
    or a fault layer does to the plane's, it does to these)."""

    def __init__(self, plane: ControlPlane) -> None:
        self._s = plane.services
        self.settings = plane.settings
        self.schedules = plane.schedules
        self.occurrences = plane.occurrences
        self.tenants = plane.tenants
        # The control plane's: the tenant's schedule as stored, and the prompt send of what
        # is receivable within the relay's batching window.
        self._owned = plane.owned
        self._send_promptly = plane.send_promptly

    def _now(self) -> int:
        return int(self._s.now())

    def trigger(self, tenant_id: str, schedule_id: str, idempotency_key: str | None) -> Triggered:
        """Run now: one manual occurrence of the current version, receivable at once, with
        an id of its own (punctual.domain.ids.manual_tag): the same Idempotency-Key answers with the
        same occurrence instead of a second run. Counts against the tenant's
        max_manual_runs_per_minute; refused unless the schedule is ACTIVE."""
        tag = manual_tag(schedule_id, idempotency_key)
        for _ in range(TRIGGER_ATTEMPTS):
            stored = self._owned(tenant_id, schedule_id, payload=False)
            schedule = stored.schedule
            made = (
                self.occurrences.triggered(schedule_id, tag)
                if idempotency_key is not None
                else None
            )
            if made is not None:
                made_id, occurrence = made
                if occurrence is None:
                    # Its record outlived it (TTL deletes the two independently): the key
                    # stays used until the record goes too.
                    raise Conflict(
                        f"this Idempotency-Key ran {made_id}, which has expired; use a new key"
                    )
                return Triggered(occurrence, replayed=True)
            if schedule.state is not ScheduleState.ACTIVE:
                # Not a PAUSED, CANCELED or COMPLETED one: the reconciler reads nothing of
                # those after they stopped (ownership.dormant), so a run there would go
                # unwatched; resume it, or create a one-shot.
                raise Conflict(
                    f"the schedule is {schedule.state.value}; only an ACTIVE schedule runs now",
                    state=schedule.state.value,
                )
            # The run carries the version's payload, from its version item (the CURRENT
            # item has only a mark of it); the transaction's version check holds it to the
            # version read.
            stored = self.schedules.with_payload(stored)
            schedule = stored.schedule
            tenant = self.tenants.get(tenant_id)
            now = self._now()
            minute = self._manual_run_minute(tenant, now)
            expires_at = now + self.settings.retention_days * 86400
            occurrence = Occurrence(
                occurrence_id=occurrence_id(schedule_id, schedule.run_version, now, tag),
                tenant_id=tenant_id,
                schedule_id=schedule_id,
                schedule_version=schedule.run_version,
                scheduled_for=now,
                available_at=now,  # no jitter: run now means now
                target=schedule.target,
                expires_at=expires_at,
            )
            record = self.occurrences.put_trigger_action(
                schedule_id, tag, occurrence.occurrence_id, expires_at
            )
            try:
                self._s.transactions.commit(
                    [
                        (Label.TRIGGER, record),
                        (Label.SCHEDULE, self.schedules.manual_run_action(stored, through=now)),
                        (Label.TENANT, manual_run_update(tenant, self.tenants.table, minute)),
                        (
                            Label.OCCURRENCE,
                            self.occurrences.put_new_action(occurrence, schedule.known_payload),
                        ),
                    ]
                )
            except ConditionFailed:
                # The same key's first request won (its run is then found above), the
                # schedule changed (paused, updated: read again), or the minute's count moved
                # (over the quota now, or opened by another request): each is read again.
                continue
            self._send_promptly([occurrence], schedule.known_payload)
            return Triggered(occurrence, replayed=False)
        raise Retryable("concurrent changes kept refusing this run; retry")

    def backfill(
        self, tenant_id: str, schedule_id: str, since: int, until: int, *, dry_run: bool
    ) -> Backfilled:
        """An occurrence for every fire of the current version in [since, until) that has
        none: not one that already ran or will (any version's, a backfill's), not one the
        materializer has still to make (it will). Paced from now at the tenant's catch-up
        rate (within SQS's 15 minutes of delay), at most the tenant's
        max_backfill_occurrences fires per request. Its ids are deterministic, so a repeated
        or overlapping backfill makes nothing twice, and one cut short by a failure is
        finished by asking again. Not older than the retention: whether an older fire ran
        is no longer known (its record expired)."""
        oldest = self._now() - self.settings.retention_days * 86400
        if since < oldest:
            raise InvalidInput(
                f"from is older than the retention ({self.settings.retention_days} days): "
                "whether those fires ran is no longer recorded",
                [{"field": "from", "reason": f"before {utc_text(oldest)}"}],
            )
        for _ in range(TRIGGER_ATTEMPTS):
            stored = self._owned(tenant_id, schedule_id, payload=False)
            schedule = stored.schedule
            if schedule.state is not ScheduleState.ACTIVE:
                # As for run now: the reconciler does not watch a stopped schedule's runs.
                raise Conflict(
                    f"the schedule is {schedule.state.value}; only an ACTIVE schedule is "
                    "backfilled",
                    state=schedule.state.value,
                )
            quotas = self.tenants.get(tenant_id).quotas
            fires = _fires_in(schedule, since, until, quotas.max_backfill_occurrences)
            # Consistent: an occurrence made a moment ago (a repair, an earlier backfill) is
            # one this backfill must not make again.
            near = self._near(schedule, since, until)
            stored_ones = [o for o in near.occurrences if since <= o.scheduled_for < until]
            tag = backfill_tag(schedule_id)
            ran = {o.scheduled_for for o in stored_ones if _has_run(o, tag)} | {
                instant  # (a tenant's unreadable item holds that key: taken)
                for _, _, instant, _ in map(occurrence_name, near.unreadable)
            }
            # A zone-based fire is its wall time: one that ran under older zone rules ran at
            # another instant (punctual.pipeline.rezone), and must not run again at the one
            # the rules in use give its wall time.
            zones = self._zones(schedule, since) if schedule.zone_name else {}
            ran_walls = {
                o.local
                for o in near.occurrences
                if o.local is not None
                and zones.get(o.schedule_version) == schedule.zone_name
                and _has_run(o, tag)
            }
            regular = {
                o.scheduled_for
                for o in stored_ones
                if o.schedule_version == schedule.run_version and not is_manual(o.occurrence_id)
            }
            handled = handled_until(schedule)
            # Fires due before a take-over are the other region's: recorded there, not here.
            elsewhere = schedule.homed_since or 0
            todo, planned = [], 0
            for fire in fires:
                if fire in ran or fire <= elsewhere or wall_text(schedule, fire) in ran_walls:
                    continue
                own = occurrence_id(schedule_id, schedule.run_version, fire)
                owned = fire > schedule.fires_after
                if owned and available_at(own, fire, schedule.flexible_window_seconds) > handled:
                    planned += 1  # the materializer has not got here: it makes this one
                    continue
                # A fire the version owns and the materializer passed without a record (lost,
                # or skipped by its misfire policy) gets its own id: the reconciler's repair
                # of the same gap then meets this occurrence instead of making a second.
                mark = None if owned and fire not in regular else tag
                todo.append(occurrence_id(schedule_id, schedule.run_version, fire, mark))
            made = self._backfilled(stored, todo, quotas.catchup_pace)
            result = Backfilled(
                len(fires), len(fires) - planned - len(todo), planned, made, dry_run
            )
            if dry_run or not made:
                return result
            # What it makes carries the version's payload, from its version item (the
            # CURRENT item has only a mark of it); every chunk checks that version.
            stored = self.schedules.with_payload(stored)
            try:
                self._commit_backfill(stored, made)
            except ConditionFailed:
                # The schedule changed (read again: paused, updated), or one of them was
                # made meanwhile (a repair, a concurrent backfill): it exists when read again.
                continue
            self._send_promptly(made, stored.schedule.known_payload)
            return result
        raise Retryable("concurrent changes kept refusing this backfill; retry")

    def _near(self, schedule: Schedule, since: int, until: int) -> Window:
        """The schedule's occurrences in [since, until), consistent; for a zone-based one, a
        day and more either side too: a wall time in the range may have run at another
        instant under older zone rules (zone offsets differ by at most 26 hours)."""
        margin = REZONE_SPAN if schedule.zone_name else 0
        return self.occurrences.window(
            schedule.schedule_id, since=since - margin, until=until - 1 + margin, consistent=True
        )

    def _zones(self, schedule: Schedule, since: int) -> dict[int, str | None]:
        """The zone of every version whose occurrences may lie near ``since`` or later, by
        version and by run version (a rename's occurrences carry its run version's)."""
        history = self.schedules.versions_since(schedule.schedule_id, since - REZONE_SPAN)
        zones: dict[int, str | None] = {}
        for known in [v.schedule for v in history] + [schedule]:
            zones[known.version] = zones[known.run_version] = known.zone_name
        return zones

    def _backfilled(self, stored: StoredSchedule, ids: list[str], pace: int) -> list[Occurrence]:
        """The occurrences of ``ids`` (in time order), paced: from now, or from where the
        schedule's last backfill's pace ended if that is later (two backfills at once are
        paced one after the other, not both from now), at the tenant's catch-up pace,
        compressed to fit SQS's delay as the materializer's catch-up is. Conflict when an
        earlier backfill's pace leaves no room within SQS's delay (retry after it)."""
        schedule = stored.schedule
        now = self._now()
        # Race: two backfills of the schedule, the later paced from where the earlier's pace
        # ended. One pace past its last occurrence, not at it: the two would otherwise share
        # that second, faster than the tenant's catch-up rate (and never leave "no room").
        start = now if stored.paced_until is None else max(now, stored.paced_until + pace)
        room = now + MAX_CATCHUP_SPREAD - start  # (the last paced one within SQS's delay)
        late = sum(
            1
            for oid in ids
            if available_at(oid, occurrence_name(oid)[2], schedule.flexible_window_seconds) < now
        )
        if late and room < 0:
            wait = -room
            raise Conflict(
                f"an earlier backfill of this schedule is paced until {utc_text(start)}; "
                f"retry in {wait} s",
                retry_after=wait,
            )
        gaps = max(1, late - 1)
        retention = self.settings.retention_days * 86400
        made = []
        index = 0
        for oid in ids:
            _, version, fire, _ = occurrence_name(oid)
            # At the pace, or spread over the room SQS's delay leaves when that is too long;
            # a fire still ahead (of the lookahead the materializer passed) at its own time,
            # neither early nor held back by the pace.
            own = available_at(oid, fire, schedule.flexible_window_seconds)
            if own >= now:
                receivable = own
            else:
                receivable = start + min(index * pace, index * room // gaps)
                index += 1
            made.append(
                Occurrence(
                    occurrence_id=oid,
                    tenant_id=schedule.tenant_id,
                    schedule_id=schedule.schedule_id,
                    schedule_version=version,
                    scheduled_for=fire,
                    available_at=receivable,
                    target=schedule.target,
                    expires_at=receivable + retention,
                    # A fire past its time is relayed apart from the fires due now.
                    lane=Lane.CATCHUP if own < now else None,
                    # Its wall time, as every fire records it: what a change of the zone's
                    # rules keeps (punctual.pipeline.rezone; a later backfill matches it too).
                    local=wall_text(schedule, fire),
                )
            )
        return made

    def _commit_backfill(self, stored: StoredSchedule, made: list[Occurrence]) -> None:
        """Chunks of puts, each with the version check: a change of the schedule refuses the
        rest (the caller reads again); what committed stays, and is found on the next read.

        The first also records the backfill (``put_backfill_action``: the range of its fires, keyed
        by now) and raises the schedule's mark to now (``backfill_made_action``): the reconciler
        re-sends an occurrence no worker took only in an hour it checks, and its fires' hours
        may have been checked and settled long ago, or never (before the schedule existed);
        the check of this hour reads the record, and checks this hour again until every one
        of them is done. The same write records where this backfill's pace ends: of two
        backfills paced from the same start, the second is refused and paced again after
        the first."""
        schedule = stored.schedule
        now = self._now()
        paced = [o.available_at for o in made if o.lane is Lane.CATCHUP]
        record = self.occurrences.put_backfill_action(
            schedule.schedule_id,
            made_at=now,
            since=min(o.scheduled_for for o in made),
            until=max(o.scheduled_for for o in made) + 1,
            expires_at=now + self.settings.retention_days * 86400,
        )
        first_actions = [
            (
                Label.SCHEDULE,
                self.schedules.backfill_made_action(
                    stored, at=now, paced_until=max(paced, default=None)
                ),
            ),
            (Label.OCCURRENCE, record),
        ]
        for first in range(0, len(made), BACKFILL_CHUNK):
            checks = (
                first_actions
                if first == 0
                else [
                    (Label.SCHEDULE, self.schedules.unchanged_action(schedule, stepped_past=None))
                ]
            )
            self._s.transactions.commit(
                checks
                + [
                    (Label.OCCURRENCE, self.occurrences.put_new_action(o, schedule.known_payload))
                    for o in made[first : first + BACKFILL_CHUNK]
                ]
            )

    @staticmethod
    def _manual_run_minute(tenant: Tenant, now: int) -> int:
        """The minute a run now counts in; QuotaExceeded when the tenant's manual runs of it
        are used up (as read: the write's condition settles races)."""
        # A host whose clock is ahead may have opened a later minute's count already: this
        # run counts in that minute (never re-opening an earlier one, which its condition
        # would refuse on every retry).
        minute = max(minute_of(now), tenant.manual_minute)
        limit = tenant.quotas.max_manual_runs_per_minute
        used = tenant.manual_runs if tenant.manual_minute == minute else 0
        if used >= limit:
            raise RateExceeded(
                f"the tenant ran {used} schedules now this minute, the limit is {limit}",
                quota="max_manual_runs_per_minute",
                limit=limit,
                usage=used,
                # The count starts again with the next UTC minute.
                retry_after=max(1, minute + 60 - now),
            )
        return minute
