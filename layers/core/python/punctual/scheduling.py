"""The control plane: what the API does with schedules, targets and tenants.

Every change of a schedule writes, in one transaction, the new CURRENT item
(conditional on the version the caller saw), an immutable history item for the
new version, the tenant's usage (conditional on its quotas) and any occurrence
due so soon that the materializer may already have planned past it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from punctual.backoff import Backoff
from punctual.dal.common import ConditionFailed
from punctual.dal.leases import watermark_of
from punctual.dal.occurrences import StoredOccurrence, Window
from punctual.dal.schedules import (
    ScheduleVersion,
    StoredSchedule,
    schedule_to_item,
    stored_schedule,
    version_to_item,
)
from punctual.dal.tenants import manual_run_update, tenant_from_item, usage_update
from punctual.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    RateExceeded,
    Retryable,
)
from punctual.ids import (
    available_at,
    backfill_tag,
    is_manual,
    manual_tag,
    minute_of,
    new_schedule_id,
    occurrence_id,
    occurrence_name,
    shard_of,
    tenant_of_schedule,
)
from punctual.integrations.queues import QueueAdmin, TargetQueues
from punctual.models import (
    AtSpec,
    Attempt,
    Lane,
    MissedEpisode,
    Occurrence,
    OccurrenceState,
    Schedule,
    ScheduleDefinition,
    ScheduleState,
    field_errors,
)
from punctual.observability import logger
from punctual.planning import MAX_CATCHUP_SPREAD, plan, wall_text
from punctual.principals import PrincipalError, normalize_principal
from punctual.relay import Relay, outbound
from punctual.rezone import SPAN as REZONE_SPAN
from punctual.services import Services
from punctual.tenancy import Quotas, Target, Tenant, strict_minute_load
from punctual.timing import Fire, get_zone, preview, tzdata_version, utc_text

PREVIEW_COUNT = 5
# Plans re-made when the materializer's walk overtakes a change before it commits (or the
# change is the first in its shard, which it opens first).
WALK_RETRIES = 4
_LIVE = (ScheduleState.ACTIVE, ScheduleState.PAUSED)
# A run now read again after its transaction was refused (the key's first request won, the
# schedule or the minute's count moved); more refusals in a row answer "retry".
TRIGGER_RETRIES = 4
# Rounds of granting a tenant's principals on its queues until a read finds no new one.
GRANT = Backoff(tries=5, base=0.1, cap=1.0)
# Beyond the relay's batching window: the mapping's poll (4 a second), the relay's start and
# send, and clocks apart. An occurrence receivable later than now + window + this reaches
# its queue before its time through the outbox alone.
PROMPT_MARGIN_SECONDS = 3
# A backfill's puts per transaction, next to the schedule's version check and the backfill's
# record (100 actions).
BACKFILL_CHUNK = 98
BACKFILL_SHOWN = 10  # occurrences a backfill's answer lists
# States of an occurrence that was never delivered and never will be: a backfill may make
# its instant anew. (SKIPPED_OVERLAP was delivered, and the overlap policy decided: kept.)
_NOT_RUN = frozenset({OccurrenceState.MISSED, OccurrenceState.CANCELED})

# One canceled after its time: due, its message sent or waiting, no worker had taken it.
_LATE_CANCEL_NOTE = (
    "canceled after its time (due, not taken by a worker yet): it will not run, as the change asked"
)
_AFFECTED_NOTES = {
    OccurrenceState.CANCELED: "canceled: it will not run (a message already sent is dropped)",
    OccurrenceState.RETRY_WAIT: "in the queue for a retry: the worker will refuse it",
    OccurrenceState.RUNNING: "running: it can only stop cooperatively",
}


@dataclass(frozen=True, slots=True)
class Affected:
    """An occurrence of an older version and what became of it."""

    occurrence: Occurrence
    note: str


@dataclass(frozen=True, slots=True)
class NextFire:
    """A fire still ahead: when it is due, when it becomes receivable (later within a
    flexible window), and its occurrence's id once made (None while only planned)."""

    fire: Fire
    available_at: int
    occurrence_id: str | None


@dataclass(frozen=True, slots=True)
class NextFires:
    fires: list[NextFire] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # DST-affected dates among them


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


@dataclass(frozen=True, slots=True)
class Saved:
    schedule: Schedule
    next_fires: NextFires
    materialized: list[Occurrence] = field(default_factory=list)
    affected: list[Affected] = field(default_factory=list)
    # A repeated pause, resume or cancel, or an update to what it says already: what it found
    unchanged: str | None = None

    @property
    def notes(self) -> list[str]:
        """What the caller should know: a request that found its change made already, an
        ambiguous one-shot's resolution, DST dates."""
        spec = self.schedule.spec
        resolution = spec.resolved().note if isinstance(spec, AtSpec) else None
        return (
            ([self.unchanged] if self.unchanged else [])
            + ([resolution] if resolution else [])
            + self.next_fires.notes
        )


def _handled_until(schedule: Schedule) -> int:
    """Every fire due (available) by this instant has been made (punctual.planning)."""
    if schedule.planned_until is not None:
        return schedule.planned_until
    # A cursor written before planned_until existed: every fire before next_run_at.
    return (schedule.next_run_at or 0) - 1


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


class _StateMoved(Exception):
    """The schedule's state changed under a change at the same version (the materializer
    completed it): the change is decided again from a fresh read."""


_DEFINITION_FIELDS = set(ScheduleDefinition.model_fields)
# What a change may touch without changing when or what runs (``Schedule.run_version``).
_COSMETIC_FIELDS = {"name"}


def _changes_runs(current: Schedule, definition: ScheduleDefinition) -> bool:
    """Whether ``definition`` differs from ``current`` in anything but its name."""
    runs = _DEFINITION_FIELDS - _COSMETIC_FIELDS
    return current.model_dump(include=runs) != definition.model_dump(include=runs)


def _after_completion_race(change: Callable[[], Saved]) -> Saved:
    try:
        return change()
    except _StateMoved:
        return change()  # a schedule completes once: the second read sees it final


class ControlPlane:
    def __init__(self, services: Services) -> None:
        self._s = services
        self.settings = services.settings
        self.schedules = services.schedules
        self.occurrences = services.occurrences
        self.tenants = services.tenants
        self.leases = services.leases
        self.queues = QueueAdmin(services.sqs, services.settings.queue_prefix, services.sleep)
        # The relay's own sending code, for what the API sends at once (_send_promptly).
        self._relay = Relay(services, workers=1)

    def _now(self) -> int:
        return int(self._s.now())

    # --- callers ----------------------------------------------------------------------

    def is_operator(self, principal_arn: str) -> bool:
        try:
            caller = normalize_principal(principal_arn)
        except PrincipalError:
            return False
        return caller in self.settings.operator_principals

    def tenant_of(self, principal_arn: str) -> str:
        try:
            caller = normalize_principal(principal_arn)
        except PrincipalError:
            raise Forbidden("this kind of principal cannot be bound to a tenant") from None
        tenant_id = self.tenants.tenant_of(caller)
        if tenant_id is None:
            raise Forbidden("this principal is not bound to a tenant")
        return tenant_id

    # --- schedules --------------------------------------------------------------------

    def create(self, tenant_id: str, definition: ScheduleDefinition) -> Saved:
        now = self._now()
        self._require_target(tenant_id, definition.target)
        moment = datetime.fromtimestamp(now, UTC)
        schedule = Schedule.model_validate(
            {
                **definition.model_dump(),
                "tenant_id": tenant_id,
                "schedule_id": new_schedule_id(tenant_id),
                "version": 1,
                "created_at": moment,
                "updated_at": moment,
                "home_region": self.settings.region,
            }
        )
        # A fire exactly at the creation instant still fires (a rate anchored at creation).
        return self._save(None, schedule, now=now, require_fire=True)

    def get(self, tenant_id: str, schedule_id: str) -> Schedule:
        return self._owned(tenant_id, schedule_id, payload=True).schedule

    def versions(
        self, tenant_id: str, schedule_id: str, *, limit: int, token: str | None
    ) -> tuple[list[ScheduleVersion], str | None]:
        """A page of the schedule's versions, newest first, each with when it took effect."""
        self._owned(tenant_id, schedule_id, payload=False)
        return self.schedules.versions(schedule_id, limit=limit, token=token)

    def list_schedules(
        self, tenant_id: str, *, state: ScheduleState | None, limit: int, token: str | None
    ) -> tuple[list[Schedule], str | None]:
        return self.schedules.list_for_tenant(tenant_id, state=state, limit=limit, token=token)

    def next_fires(self, schedule: Schedule, count: int = PREVIEW_COUNT) -> NextFires:
        """What will happen next: the version's fires not yet receivable, in order, those
        already made as occurrences (every fire before the cursor) included and named."""
        if schedule.state is not ScheduleState.ACTIVE:
            return NextFires()
        now = self._now()
        # A flexible fire due up to its window ago may not be receivable yet.
        after = max(schedule.fires_after, now - 1 - schedule.flexible_window_seconds)
        rule = schedule.rule()
        passed = len(rule.fires(after, now - 1))
        zone = get_zone(getattr(schedule.spec, "timezone", None) or "UTC")
        ahead = preview(rule, after, passed + count, zone)
        fires = []
        for fire in ahead.fires:
            occ_id = occurrence_id(schedule.schedule_id, schedule.run_version, fire.instant)
            due = available_at(occ_id, fire.instant, schedule.flexible_window_seconds)
            if due < now:
                continue
            made = schedule.next_run_at is None or due <= _handled_until(schedule)
            fires.append(NextFire(fire, due, occ_id if made else None))
        return NextFires(fires[:count], ahead.notes)

    def update(
        self, tenant_id: str, schedule_id: str, *, if_match: int, changes: dict[str, Any]
    ) -> Saved:
        return _after_completion_race(
            lambda: self._update(tenant_id, schedule_id, if_match=if_match, changes=changes)
        )

    def _update(
        self, tenant_id: str, schedule_id: str, *, if_match: int, changes: dict[str, Any]
    ) -> Saved:
        # (With its payload: the new version keeps it, and a change that gives the same one
        # again changes nothing.)
        stored = self._owned(tenant_id, schedule_id, payload=True)
        current = stored.schedule
        if current.version != if_match:
            raise Conflict(
                f"If-Match names version {if_match} but the schedule is at version "
                f"{current.version}; read it again",
                current_version=current.version,
            )
        if current.state is ScheduleState.CANCELED:
            raise Conflict("a canceled schedule cannot be updated")
        merged = {**current.model_dump(include=_DEFINITION_FIELDS), **changes}
        try:
            definition = ScheduleDefinition.model_validate(merged)
        except ValidationError as error:
            raise InvalidInput("the update is not valid", field_errors(error)) from None
        if "target" in changes:
            self._require_target(tenant_id, definition.target)
        if definition.model_dump() == current.model_dump(include=_DEFINITION_FIELDS):
            # It says what the schedule says already (a retry after a lost answer, a form
            # saved unchanged): done as asked, no new version.
            return Saved(
                current, self.next_fires(current), unchanged="the schedule says this already"
            )
        now = self._now()
        if not _changes_runs(current, definition):
            return self._rename(stored, definition, now)
        state = (
            ScheduleState.PAUSED if current.state is ScheduleState.PAUSED else ScheduleState.ACTIVE
        )
        updated = self._next_version(current, now, state, definition)
        return self._save(stored, updated, now=now, require_fire=True)

    def _rename(self, stored: StoredSchedule, definition: ScheduleDefinition, now: int) -> Saved:
        """A change of nothing that runs (the name): a new version that keeps the run version,
        its state and its cursor, so no occurrence is superseded and nothing is re-planned.
        The CURRENT item is updated, not written whole: the materializer's cursor is not
        carried back, and a step it commits first only makes this change re-read."""
        current = stored.schedule
        renamed = current.model_copy(
            update={
                "name": definition.name,
                "version": current.version + 1,
                "runs_as": current.run_version,
                "runs_from": current.run_from,
                "updated_at": datetime.fromtimestamp(now, UTC),
            }
        )
        try:
            self._s.transactions.commit(
                [
                    ("schedule", self.schedules.rename(stored, renamed)),
                    (
                        "version",
                        self.schedules.put_version(version_to_item(renamed, effective_from=now)),
                    ),
                ]
            )
        except ConditionFailed as refused:
            raise self._refusal(refused, stored, None, {}) from None
        return Saved(renamed, self.next_fires(renamed))

    def pause(self, tenant_id: str, schedule_id: str) -> Saved:
        return self._transition(
            tenant_id, schedule_id, ScheduleState.PAUSED, {ScheduleState.ACTIVE}
        )

    def resume(self, tenant_id: str, schedule_id: str) -> Saved:
        # The next fire is strictly after the resume instant: the paused period is not caught up.
        return self._transition(
            tenant_id, schedule_id, ScheduleState.ACTIVE, {ScheduleState.PAUSED}
        )

    def cancel(self, tenant_id: str, schedule_id: str) -> Saved:
        return self._transition(
            tenant_id,
            schedule_id,
            ScheduleState.CANCELED,
            {ScheduleState.ACTIVE, ScheduleState.PAUSED, ScheduleState.COMPLETED},
        )

    def trigger(self, tenant_id: str, schedule_id: str, idempotency_key: str | None) -> Triggered:
        """Run now: one manual occurrence of the current version, receivable at once, with
        an id of its own (punctual.ids.manual_tag): the same Idempotency-Key answers with the
        same occurrence instead of a second run. Counts against the tenant's
        max_manual_runs_per_minute; refused unless the schedule is ACTIVE."""
        tag = manual_tag(schedule_id, idempotency_key)
        for _ in range(TRIGGER_RETRIES):
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
                # those after they stopped (reconciler._dormant), so a run there would go
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
            record = self.occurrences.put_trigger(
                schedule_id, tag, occurrence.occurrence_id, expires_at
            )
            try:
                self._s.transactions.commit(
                    [
                        ("trigger", record),
                        ("schedule", self.schedules.manual_run(stored, through=now)),
                        ("tenant", manual_run_update(tenant, self.tenants.table, minute)),
                        (
                            "occurrence",
                            self.occurrences.put_new(occurrence, schedule.known_payload),
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
        for _ in range(TRIGGER_RETRIES):
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
            # another instant (punctual.rezone), and must not run again at the one the rules
            # in use give its wall time.
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
            handled = _handled_until(schedule)
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
                    # rules keeps (punctual.rezone; a later backfill matches it too).
                    local=wall_text(schedule, fire),
                )
            )
        return made

    def _commit_backfill(self, stored: StoredSchedule, made: list[Occurrence]) -> None:
        """Chunks of puts, each with the version check: a change of the schedule refuses the
        rest (the caller reads again); what committed stays, and is found on the next read.

        The first also records the backfill (``put_backfill``: the range of its fires, keyed
        by now) and raises the schedule's mark to now (``backfill_made``): the reconciler
        re-sends an occurrence no worker took only in an hour it checks, and its fires' hours
        may have been checked and settled long ago, or never (before the schedule existed);
        the check of this hour reads the record, and checks this hour again until every one
        of them is done. The same write records where this backfill's pace ends: of two
        backfills paced from the same start, the second is refused and paced again after
        the first."""
        schedule = stored.schedule
        now = self._now()
        paced = [o.available_at for o in made if o.lane is Lane.CATCHUP]
        record = self.occurrences.put_backfill(
            schedule.schedule_id,
            made_at=now,
            since=min(o.scheduled_for for o in made),
            until=max(o.scheduled_for for o in made) + 1,
            expires_at=now + self.settings.retention_days * 86400,
        )
        first_actions = [
            (
                "schedule",
                self.schedules.backfill_made(stored, at=now, paced_until=max(paced, default=None)),
            ),
            ("occurrence", record),
        ]
        for first in range(0, len(made), BACKFILL_CHUNK):
            checks = (
                first_actions
                if first == 0
                else [("schedule", self.schedules.unchanged(schedule, stepped_past=None))]
            )
            self._s.transactions.commit(
                checks
                + [
                    ("occurrence", self.occurrences.put_new(o, schedule.known_payload))
                    for o in made[first : first + BACKFILL_CHUNK]
                ]
            )

    def _transition(
        self,
        tenant_id: str,
        schedule_id: str,
        state: ScheduleState,
        allowed_from: set[ScheduleState],
    ) -> Saved:
        return _after_completion_race(
            lambda: self._transition_once(tenant_id, schedule_id, state, allowed_from)
        )

    def _transition_once(
        self,
        tenant_id: str,
        schedule_id: str,
        state: ScheduleState,
        allowed_from: set[ScheduleState],
    ) -> Saved:
        # (With its payload: the new version's item keeps it.)
        stored = self._owned(tenant_id, schedule_id, payload=True)
        current = stored.schedule
        if current.state is state:
            # A repeat (a client retrying after a lost answer): done already, as asked;
            # answered as a success that changed nothing, no new version.
            return Saved(
                current,
                self.next_fires(current),
                unchanged=f"already {state.value}: nothing changed",
            )
        if current.state not in allowed_from:
            raise Conflict(
                f"the schedule is {current.state.value}; cannot make it {state.value}",
                state=current.state.value,
            )
        now = self._now()
        return self._save(stored, self._next_version(current, now, state), now=now)

    @staticmethod
    def _next_version(
        current: Schedule,
        now: int,
        state: ScheduleState,
        definition: ScheduleDefinition | None = None,
    ) -> Schedule:
        changes = definition.model_dump() if definition else {}
        return Schedule.model_validate(
            {
                **current.model_dump(),
                **changes,
                "version": current.version + 1,
                # It changes what runs: its fires are its own, from now on.
                "runs_as": None,
                "runs_from": None,
                "state": state,
                "updated_at": datetime.fromtimestamp(now, UTC),
                "next_run_at": None,
                "next_available_at": None,
            }
        )

    # --- the one write path for every schedule change ----------------------------------

    def _save(
        self,
        old: StoredSchedule | None,
        schedule: Schedule,
        *,
        now: int,
        require_fire: bool = False,
    ) -> Saved:
        shard = shard_of(schedule.schedule_id, self.settings.shard_count)
        until = now + self.settings.planned_horizon_seconds
        # Planned now, under the rules in use: the release is recorded (punctual.rezone).
        release = tzdata_version() if schedule.zone_name is not None else None
        schedule = schedule.model_copy(update={"tzdata_version": release})
        for _ in range(WALK_RETRIES):
            try:
                return self._write(
                    old, schedule, shard=shard, until=until, now=now, require_fire=require_fire
                )
            except ConditionFailed as refused:
                if refused.label != "shard":
                    raise
                walked = watermark_of(refused.old_item)
                if walked is None:
                    # The shard's first schedule: give it a watermark, which the first
                    # claim then walks from, and place the cursor again.
                    self.leases.open(shard, now=now)
                    continue
                # The walk got to the cursor's bucket first (this commit was slow, or our
                # clock is behind the ticker's): plan directly past where it stands now.
                until = max(until, walked + 2 * 60 - 1)
        raise Retryable("the materializer kept overtaking this change; retry")

    def _write(
        self,
        old: StoredSchedule | None,
        schedule: Schedule,
        *,
        shard: int,
        until: int,
        now: int,
        require_fire: bool,
    ) -> Saved:
        """Plan, then commit the change in one transaction; ConditionFailed("shard") when the
        materializer's walk has already passed the bucket the cursor would go to."""
        materialized: list[Occurrence] = []
        if schedule.state is ScheduleState.ACTIVE:
            # Every fire receivable by ``until`` is made here: the materializer may already
            # have planned past it. The rest waits for it in the due index.
            planned = plan(
                schedule,
                planned_until=None,
                until=until,
                now=now,
                retention_seconds=self.settings.retention_days * 86400,
            )
            materialized = planned.occurrences
            cursor = planned.cursor
            if cursor.next_run_at is None and not materialized:
                if require_fire:
                    raise InvalidInput(
                        "the schedule would never fire",
                        [{"field": "spec", "reason": "no fire after now within start_at/end_at"}],
                    )
                schedule = schedule.model_copy(update={"state": ScheduleState.COMPLETED})
            else:
                # With every fire already materialized, the schedule still waits in the due
                # index: the materializer completes it there and gives its quota back, so
                # even a one-shot due in seconds is admission-controlled. It waits past the
                # planned horizon, in a minute no tick has walked yet.
                waiting = max(materialized[-1].available_at if materialized else now, until)
                schedule = schedule.model_copy(
                    update={
                        "planned_until": cursor.planned_until,
                        "next_run_at": cursor.next_run_at,
                        "next_available_at": cursor.next_available_at or waiting,
                    }
                )
        load = strict_minute_load(schedule, schedule.created_at) if schedule.state in _LIVE else {}
        # (The schedule carries the materializer's MISSED summary from the version it
        # replaces: the summary belongs to the schedule, not to one version.)
        current_item = schedule_to_item(schedule, shard=shard, minute_load=load)
        actions: list[tuple[str, dict[str, Any]]] = [
            (
                "schedule",
                self.schedules.put_new(current_item)
                if old is None
                else self.schedules.replace_current(current_item, expected=old),
            ),
            ("version", self.schedules.put_version(version_to_item(schedule, effective_from=now))),
        ]
        if schedule.state is ScheduleState.ACTIVE and schedule.next_available_at is not None:
            # It waits in the due index: in a bucket the walk has not passed.
            due = minute_of(schedule.next_available_at)
            actions.append(("shard", self.leases.not_walked(shard, due)))
        tenant = self.tenants.get(schedule.tenant_id)
        usage = self._usage_action(tenant, old, schedule, load)
        if usage:
            actions.append(("tenant", usage))
        actions += [
            ("occurrence", self.occurrences.put_new(o, schedule.known_payload))
            for o in materialized
        ]
        try:
            self._s.transactions.commit(actions)
        except ConditionFailed as refused:
            if refused.label == "shard":
                raise
            raise self._refusal(refused, old, tenant, load) from None
        self._send_promptly(materialized, schedule.known_payload)
        affected = self._invalidate(old.schedule, schedule, now) if old else []
        return Saved(schedule, self.next_fires(schedule), materialized, affected)

    def _send_promptly(self, made: list[Occurrence], payload: dict[str, Any]) -> None:
        """Send at once, after their commit, the on-time occurrences just made that the
        relay's batching window could hold past their time: receivable before now + the
        window + PROMPT_MARGIN_SECONDS (a run now, a one-shot due in a moment).

        The outbox is still what guarantees them: their stream records reach the relay
        within the window and are sent again, a duplicate the worker drops (the same
        occurrence id). So a send that fails here (throttled, no answer) is logged and left
        to the relay, at most a window late; it never fails the request, which committed.
        A catch-up is paced and relayed by its own lane: not sent here."""
        window = self.settings.relay_window_seconds
        if not window:
            return  # the mapping sends each record as it comes
        soon = self._s.now() + window + PROMPT_MARGIN_SECONDS
        due = [o for o in made if o.lane is None and o.available_at < soon]
        if not due:
            return
        try:
            report = self._relay.send(
                [outbound(o.occurrence_id, StoredOccurrence(o, payload)) for o in due]
            )
        except Exception as error:  # a throttled target read, say: the relay sends them
            logger.warning("prompt send failed; the relay sends them", extra={"error": str(error)})
            return
        if report.failures:
            logger.warning(
                "prompt send refused; the relay sends them",
                extra={"occurrences": sorted(report.failures)},
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

    def _usage_action(
        self, tenant: Tenant, old: StoredSchedule | None, schedule: Schedule, load: dict[int, int]
    ) -> dict[str, Any] | None:
        old_live = old is not None and old.schedule.state in _LIVE
        old_load = old.minute_load if old is not None and old_live else {}
        delta = {m: load.get(m, 0) - old_load.get(m, 0) for m in set(load) | set(old_load)}
        return usage_update(
            tenant.tenant_id,
            self.tenants.table,
            tenant.quotas,
            schedules_delta=int(schedule.state in _LIVE) - int(old_live),
            load_delta=delta,
        )

    def _refusal(
        self,
        refused: ConditionFailed,
        old: StoredSchedule | None,
        tenant: Tenant | None,
        load: dict[int, int],
    ) -> Exception:
        if refused.label == "tenant" and tenant is not None:
            # The tenant's item as the refusal found it (ALL_OLD): its usage, not ours.
            found = tenant_from_item(refused.old_item) if refused.old_item else tenant
            return self._quota_error(tenant.quotas, found, load)
        if refused.label == "schedule" and refused.old_item:
            current = stored_schedule(refused.old_item).schedule
            if old is not None and current.version == old.schedule.version:
                # Same version, changed meanwhile: the materializer completed it.
                return _StateMoved()
            return Conflict(
                f"the schedule changed meanwhile (now version {current.version}); read it again",
                current_version=current.version,
            )
        return Conflict("a concurrent change won; read the schedule again")

    @staticmethod
    def _quota_error(quotas: Quotas, tenant: Tenant, load: dict[int, int]) -> QuotaExceeded:
        count = tenant.schedule_count
        if count >= quotas.max_schedules:
            return QuotaExceeded(
                f"the tenant has {count} schedules, the limit is {quotas.max_schedules}",
                quota="max_schedules",
                limit=quotas.max_schedules,
                usage=count,
            )
        busiest = max(load, key=lambda m: tenant.minute_load[m], default=0)
        usage = tenant.minute_load[busiest]
        return QuotaExceeded(
            f"minute :{busiest:02d} of every hour already has {usage} strict fires; "
            f"the limit is {quotas.max_strict_fires_per_minute}",
            quota="max_strict_fires_per_minute",
            limit=quotas.max_strict_fires_per_minute,
            usage=usage,
        )

    def _invalidate(self, old: Schedule, schedule: Schedule, now: int) -> list[Affected]:
        """Older versions' open occurrences: cancel every one no worker has taken, due or not,
        sent or not (the worker drops a CANCELED occurrence's message; one it took runs on
        as the older version it is); one whose time had passed is recorded as such, in its
        reason and in the answer; report the rest."""
        since = now - old.retry.deadline_seconds
        affected = []
        for occurrence in self.occurrences.open_for_schedule(schedule.schedule_id, since=since):
            if occurrence.schedule_version >= schedule.version:
                continue
            late = occurrence.state is OccurrenceState.SCHEDULED and occurrence.available_at <= now
            if occurrence.state is OccurrenceState.SCHEDULED:
                reason = f"superseded by version {schedule.version} ({schedule.state.value})"
                if late:
                    reason += (
                        f" after its time: due {utc_text(occurrence.available_at)}, no worker "
                        "had taken it"
                    )
                state = self.occurrences.cancel_if_scheduled(occurrence.occurrence_id, reason)
                if state is OccurrenceState.CANCELED:
                    occurrence = occurrence.model_copy(update={"state": state, "reason": reason})
                else:  # it moved on meanwhile: answer what is stored now
                    occurrence = self.occurrence(schedule.tenant_id, occurrence.occurrence_id)[0]
                    late = False
            note = _AFFECTED_NOTES.get(occurrence.state, "already done")
            if late:
                note = _LATE_CANCEL_NOTE
            affected.append(Affected(occurrence, note))
        return affected

    # --- occurrences ------------------------------------------------------------------

    def list_occurrences(
        self,
        tenant_id: str,
        schedule_id: str,
        *,
        since: int,
        until: int,
        limit: int,
        token: str | None,
        claims: dict[str, int] | None = None,
    ) -> tuple[list[Occurrence], list[MissedEpisode], str | None]:
        """A page of the schedule's occurrences due in [since, until], and the misfire
        episodes overlapping that window (fires recorded MISSED have no occurrence);
        ``claims`` gets when each claimed one was first claimed."""
        schedule = self._owned(tenant_id, schedule_id, payload=False).schedule
        found, next_token = self.occurrences.list_for_schedule(
            schedule_id, since=since, until=until, limit=limit, token=token, claims=claims
        )
        missed = [e for e in schedule.missed if e.first <= until and e.last >= since]
        return found, missed, next_token

    def occurrence(self, tenant_id: str, occurrence_id: str) -> tuple[Occurrence, list[Attempt]]:
        found = self.occurrences.get_with_attempts(occurrence_id)
        if found is None or found[0].tenant_id != tenant_id:
            # Another tenant's occurrence answers exactly like a missing one.
            raise NotFound(f"occurrence {occurrence_id} not found")
        return found

    # --- targets and tenants ----------------------------------------------------------

    def create_target(self, tenant_id: str, name: str) -> Target:
        if self.tenants.get_target(tenant_id, name, consistent=True):
            raise Conflict(f"target {name} already exists")
        principals = self.tenants.get(tenant_id).principals
        queues = self.queues.create(tenant_id, name, principals)
        target = Target(
            tenant_id=tenant_id,
            name=name,
            queue_url=queues.queue_url,
            queue_arn=queues.queue_arn,
            dlq_url=queues.dlq_url,
            dlq_arn=queues.dlq_arn,
            created_at=datetime.fromtimestamp(self._now(), UTC),
        )
        self.tenants.put_target(target)
        # Race: a principal bound since the read above, whose bind listed the tenant's targets
        # before this one was stored, is granted here.
        self._grant_until_settled(tenant_id, [queues], granted=principals)
        return target

    def bind_principal(self, principal_arn: str, tenant_id: str) -> Tenant:
        """Bind what callers will present: a session ARN stands for its role, a role or user
        is bound whatever its path."""
        try:
            principal = normalize_principal(principal_arn)
        except PrincipalError as error:
            raise InvalidInput(
                "not a principal that can be bound",
                [{"field": "principal_arn", "reason": str(error)}],
            ) from None
        self.tenants.bind_principal(principal, tenant_id)
        # Consistent: a target made a moment ago must be granted the new principal too.
        targets = self.tenants.list_targets(tenant_id, consistent=True)
        return self._grant_until_settled(
            tenant_id,
            [TargetQueues(t.queue_url, t.queue_arn, t.dlq_url, t.dlq_arn) for t in targets],
            granted=None,
        )

    def _grant_until_settled(
        self, tenant_id: str, targets: list[TargetQueues], *, granted: list[str] | None
    ) -> Tenant:
        """Grant the tenant's principals on ``targets`` (``granted``: what they already
        grant) until a read after the grant finds no other: a queue policy is replaced whole,
        so of two binds at once the one granting last may know only its own principal; it
        reads again and grants both. The tenant, as last read (consistently: a principal
        bound a moment ago must be seen). Retryable if binds kept changing the principals
        through GRANT's tries: the caller's retry grants again."""
        for _ in GRANT.attempts(self._s.sleep):
            tenant = self.tenants.get(tenant_id)
            if tenant.principals == granted:
                return tenant
            for queues in targets:
                self.queues.grant(queues, tenant.principals, tenant_id=tenant_id)
            granted = tenant.principals
        raise Retryable("the tenant's principals kept changing while its queues were granted")

    def create_tenant(self, tenant_id: str, quotas: Quotas) -> Tenant:
        tenant = Tenant(
            tenant_id=tenant_id, quotas=quotas, created_at=datetime.fromtimestamp(self._now(), UTC)
        )
        self.tenants.create(tenant)
        return tenant

    # --- helpers ----------------------------------------------------------------------

    def _owned(self, tenant_id: str, schedule_id: str, *, payload: bool) -> StoredSchedule:
        """The tenant's schedule as its CURRENT item has it (consistent); with ``payload``,
        its payload read from its version item too (else None when it has one: what shows
        it, writes it again or fires it reads it first)."""
        # Another tenant's id is not even read: the id names its tenant.
        if tenant_of_schedule(schedule_id) != tenant_id:
            raise NotFound(f"schedule {schedule_id} not found")
        stored = self.schedules.current(schedule_id)
        if stored is None or stored.schedule.tenant_id != tenant_id:
            # Another tenant's schedule answers exactly like a missing one: no existence leak.
            raise NotFound(f"schedule {schedule_id} not found")
        return self.schedules.with_payload(stored) if payload else stored

    def _require_target(self, tenant_id: str, name: str) -> None:
        # Consistent: a target created a moment ago must be usable at once.
        if self.tenants.get_target(tenant_id, name, consistent=True) is None:
            raise InvalidInput(
                f"unknown target {name}",
                [{"field": "target", "reason": f"no target named {name!r}; create it first"}],
            )
