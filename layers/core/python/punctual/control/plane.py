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

from punctual.control.ledger import Ledger, LedgerAnswer, LedgerFilter, Marks
from punctual.control.manual import Backfilled, ManualRuns, Triggered
from punctual.control.tenant_admin import TenantAdmin
from punctual.dal.common import ConditionFailed, Label
from punctual.dal.leases import watermark_of
from punctual.dal.occurrences import StoredOccurrence
from punctual.dal.schedules import (
    ScheduleVersion,
    StoredSchedule,
    schedule_to_item,
    stored_schedule,
    version_to_item,
)
from punctual.dal.tenants import tenant_from_item, usage_update
from punctual.domain.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    Retryable,
)
from punctual.domain.figures import RecentFigures, recent_figures
from punctual.domain.ids import (
    available_at,
    minute_of,
    new_schedule_id,
    occurrence_id,
    shard_of,
    tenant_of_schedule,
)
from punctual.domain.occurrence import Attempt, Occurrence, OccurrenceState
from punctual.domain.planning import handled_until, plan
from punctual.domain.schedule import (
    HOLDS_QUOTA,
    SCHEDULE_MOVES,
    MissedEpisode,
    Schedule,
    ScheduleDefinition,
    ScheduleMove,
    ScheduleState,
)
from punctual.domain.specs import AtSpec
from punctual.domain.tenancy import Quotas, Target, Tenant, strict_minute_load
from punctual.domain.validation import field_errors
from punctual.integrations.queues import QueueAdmin
from punctual.observability import logger
from punctual.pipeline.relay import Relay, outbound
from punctual.services import Services
from punctual.timing import Fire, get_zone, preview, tzdata_version, utc_text

PREVIEW_COUNT = 5
# Plans re-made when the materializer's walk overtakes a change before it commits (or the
# change is the first in its shard, which it opens first).
WALK_ATTEMPTS = 4
# Beyond the relay's batching window: the mapping's poll (4 a second), the relay's start and
# send, and clocks apart. An occurrence receivable later than now + window + this reaches
# its queue before its time through the outbox alone.
PROMPT_MARGIN_SECONDS = 3
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
        self.services = services
        self.settings = services.settings
        self.schedules = services.schedules
        self.occurrences = services.occurrences
        self.tenants = services.tenants
        self.leases = services.leases
        self.queues = QueueAdmin(services.sqs, services.settings.queue_prefix, services.sleep)
        self.admin = TenantAdmin(services, self.tenants, self.queues)
        self.manual = ManualRuns(self)
        self.ledger_marks = Marks()  # (kept across requests: punctual.control.ledger.Marks)
        # The relay's own sending code, for what the API sends at once (_send_promptly).
        self._relay = Relay(services, workers=1)

    def _now(self) -> int:
        return int(self._s.now())

    # --- callers, targets and tenants: punctual.control.tenant_admin ---------------------------

    def is_operator(self, principal_arn: str) -> bool:
        return self.admin.is_operator(principal_arn)

    def tenant_of(self, principal_arn: str) -> str:
        return self.admin.tenant_of(principal_arn)

    def create_target(self, tenant_id: str, name: str, *, early_delivery: bool = False) -> Target:
        return self.admin.create_target(tenant_id, name, early_delivery=early_delivery)

    def set_early_delivery(self, tenant_id: str, name: str, early: bool) -> Target:
        return self.tenants.set_early_delivery(tenant_id, name, early)

    def bind_principal(self, principal_arn: str, tenant_id: str) -> Tenant:
        return self.admin.bind_principal(principal_arn, tenant_id)

    def create_tenant(self, tenant_id: str, quotas: Quotas) -> Tenant:
        return self.admin.create_tenant(tenant_id, quotas)

    # --- schedules --------------------------------------------------------------------

    def create(self, tenant_id: str, definition: ScheduleDefinition) -> Saved:
        now = self._now()
        self.admin.require_target(tenant_id, definition.target)
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
        return self.owned(tenant_id, schedule_id, payload=True).schedule

    def versions(
        self, tenant_id: str, schedule_id: str, *, limit: int, token: str | None
    ) -> tuple[list[ScheduleVersion], str | None]:
        """A page of the schedule's versions, newest first, each with when it took effect."""
        self.owned(tenant_id, schedule_id, payload=False)
        return self.schedules.versions(schedule_id, limit=limit, token=token)

    def list_schedules(
        self, tenant_id: str, *, state: ScheduleState | None, limit: int, token: str | None
    ) -> tuple[list[Schedule], str | None]:
        return self.schedules.list_for_tenant(tenant_id, state=state, limit=limit, token=token)

    def ledger(
        self,
        tenant_id: str,
        *,
        since: int | None,
        until: int | None,
        wanted: LedgerFilter,
        limit: int,
        token: str | None,
    ) -> LedgerAnswer:
        """A page of the tenant's occurrences across its schedules (punctual.control.ledger)."""
        return Ledger(self._s, self.ledger_marks).read(
            tenant_id, since=since, until=until, wanted=wanted, limit=limit, token=token
        )

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
            made = schedule.next_run_at is None or due <= handled_until(schedule)
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
        stored = self.owned(tenant_id, schedule_id, payload=True)
        current = stored.schedule
        if current.version != if_match:
            raise Conflict(
                f"If-Match names version {if_match} but the schedule is at version "
                f"{current.version}; read it again",
                current_version=current.version,
            )
        move = SCHEDULE_MOVES["update"]
        if current.state not in move.allowed_from:
            raise Conflict(f"a {current.state.value.lower()} schedule cannot be updated")
        merged = {**current.model_dump(include=_DEFINITION_FIELDS), **changes}
        try:
            definition = ScheduleDefinition.model_validate(merged)
        except ValidationError as error:
            raise InvalidInput("the update is not valid", field_errors(error)) from None
        if "target" in changes:
            self.admin.require_target(tenant_id, definition.target)
        if definition.model_dump() == current.model_dump(include=_DEFINITION_FIELDS):
            # It says what the schedule says already (a retry after a lost answer, a form
            # saved unchanged): done as asked, no new version.
            return Saved(
                current, self.next_fires(current), unchanged="the schedule says this already"
            )
        now = self._now()
        if not _changes_runs(current, definition):
            return self._rename(stored, definition, now)
        # (A paused schedule stays paused; any other becomes ACTIVE: SCHEDULE_MOVES.)
        state = ScheduleState.PAUSED if current.state is ScheduleState.PAUSED else move.to
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
                    (Label.SCHEDULE, self.schedules.rename_action(stored, renamed)),
                    (
                        Label.VERSION,
                        self.schedules.put_version_action(
                            version_to_item(renamed, effective_from=now)
                        ),
                    ),
                ]
            )
        except ConditionFailed as refused:
            raise self._refusal(refused, stored, None, {}) from None
        return Saved(renamed, self.next_fires(renamed))

    def pause(self, tenant_id: str, schedule_id: str) -> Saved:
        return self._transition(tenant_id, schedule_id, SCHEDULE_MOVES["pause"])

    def resume(self, tenant_id: str, schedule_id: str) -> Saved:
        return self._transition(tenant_id, schedule_id, SCHEDULE_MOVES["resume"])

    def cancel(self, tenant_id: str, schedule_id: str) -> Saved:
        return self._transition(tenant_id, schedule_id, SCHEDULE_MOVES["cancel"])

    # --- manual runs: punctual.control.manual -------------------------------------------------

    def trigger(self, tenant_id: str, schedule_id: str, idempotency_key: str | None) -> Triggered:
        return self.manual.trigger(tenant_id, schedule_id, idempotency_key)

    def backfill(
        self, tenant_id: str, schedule_id: str, since: int, until: int, *, dry_run: bool
    ) -> Backfilled:
        return self.manual.backfill(tenant_id, schedule_id, since, until, dry_run=dry_run)

    def _transition(self, tenant_id: str, schedule_id: str, move: ScheduleMove) -> Saved:
        return _after_completion_race(lambda: self._transition_once(tenant_id, schedule_id, move))

    def _transition_once(self, tenant_id: str, schedule_id: str, move: ScheduleMove) -> Saved:
        state = move.to
        # (With its payload: the new version's item keeps it.)
        stored = self.owned(tenant_id, schedule_id, payload=True)
        current = stored.schedule
        if current.state is state:
            # A repeat (a client retrying after a lost answer): done already, as asked;
            # answered as a success that changed nothing, no new version.
            return Saved(
                current,
                self.next_fires(current),
                unchanged=f"already {state.value}: nothing changed",
            )
        if current.state not in move.allowed_from:
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
        # Planned now, under the rules in use: the release is recorded (punctual.pipeline.rezone).
        release = tzdata_version() if schedule.zone_name is not None else None
        schedule = schedule.model_copy(update={"tzdata_version": release})
        for _ in range(WALK_ATTEMPTS):
            try:
                return self._write(
                    old, schedule, shard=shard, until=until, now=now, require_fire=require_fire
                )
            except ConditionFailed as refused:
                if refused.label != Label.SHARD:
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
        """Plan, then commit the change in one transaction; ConditionFailed(Label.SHARD) when the
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
        holds = schedule.state in HOLDS_QUOTA
        load = strict_minute_load(schedule, schedule.created_at) if holds else {}
        # (The schedule carries the materializer's MISSED summary from the version it
        # replaces: the summary belongs to the schedule, not to one version.)
        current_item = schedule_to_item(schedule, shard=shard, minute_load=load)
        actions: list[tuple[Label, dict[str, Any]]] = [
            (
                Label.SCHEDULE,
                self.schedules.put_new_action(current_item)
                if old is None
                else self.schedules.replace_current_action(current_item, expected=old),
            ),
            (
                Label.VERSION,
                self.schedules.put_version_action(version_to_item(schedule, effective_from=now)),
            ),
        ]
        if schedule.state is ScheduleState.ACTIVE and schedule.next_available_at is not None:
            # It waits in the due index: in a bucket the walk has not passed.
            due = minute_of(schedule.next_available_at)
            actions.append((Label.SHARD, self.leases.not_walked_action(shard, due)))
        tenant = self.tenants.get(schedule.tenant_id)
        usage = self._usage_action(tenant, old, schedule, load)
        if usage:
            actions.append((Label.TENANT, usage))
        actions += [
            (Label.OCCURRENCE, self.occurrences.put_new_action(o, schedule.known_payload))
            for o in materialized
        ]
        try:
            self._s.transactions.commit(actions)
        except ConditionFailed as refused:
            if refused.label == Label.SHARD:
                raise
            raise self._refusal(refused, old, tenant, load) from None
        self.send_promptly(materialized, schedule.known_payload)
        affected = self._invalidate(old.schedule, schedule, now) if old else []
        return Saved(schedule, self.next_fires(schedule), materialized, affected)

    def send_promptly(self, made: list[Occurrence], payload: dict[str, Any]) -> None:
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

    def _usage_action(
        self, tenant: Tenant, old: StoredSchedule | None, schedule: Schedule, load: dict[int, int]
    ) -> dict[str, Any] | None:
        old_live = old is not None and old.schedule.state in HOLDS_QUOTA
        old_load = old.minute_load if old is not None and old_live else {}
        delta = {m: load.get(m, 0) - old_load.get(m, 0) for m in set(load) | set(old_load)}
        return usage_update(
            tenant.tenant_id,
            self.tenants.table,
            tenant.quotas,
            schedules_delta=int(schedule.state in HOLDS_QUOTA) - int(old_live),
            load_delta=delta,
        )

    def _refusal(
        self,
        refused: ConditionFailed,
        old: StoredSchedule | None,
        tenant: Tenant | None,
        load: dict[int, int],
    ) -> Exception:
        if refused.label == Label.TENANT and tenant is not None:
            # The tenant's item as the refusal found it (ALL_OLD): its usage, not ours.
            found = tenant_from_item(refused.old_item) if refused.old_item else tenant
            return self._quota_error(tenant.quotas, found, load)
        if refused.label == Label.SCHEDULE and refused.old_item:
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
        schedule = self.owned(tenant_id, schedule_id, payload=False).schedule
        found, next_token = self.occurrences.list_for_schedule(
            schedule_id, since=since, until=until, limit=limit, token=token, claims=claims
        )
        missed = [e for e in schedule.missed if e.first <= until and e.last >= since]
        return found, missed, next_token

    def recent(self, schedule: Schedule, count: int) -> RecentFigures:
        """How the schedule's last ``count`` fires scheduled by now went (punctual.domain.figures):
        from their stored items and its misfire episodes, nothing written."""
        latest = self.occurrences.latest_fires(schedule.schedule_id, until=self._now(), count=count)
        return recent_figures(
            latest.fires, schedule.missed, latest.unreadable, reached=latest.reached
        )

    def occurrence(self, tenant_id: str, occurrence_id: str) -> tuple[Occurrence, list[Attempt]]:
        found = self.occurrences.get_with_attempts(occurrence_id)
        if found is None or found[0].tenant_id != tenant_id:
            # Another tenant's occurrence answers exactly like a missing one.
            raise NotFound(f"occurrence {occurrence_id} not found")
        return found

    # --- helpers ----------------------------------------------------------------------

    def owned(self, tenant_id: str, schedule_id: str, *, payload: bool) -> StoredSchedule:
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
