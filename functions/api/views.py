"""The API's response shapes (they become the OpenAPI schemas) and their builders."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from punctual.control.ledger import UPCOMING, LedgerAnswer, Upcoming, shown_state
from punctual.control.plane import Affected, NextFires, Saved
from punctual.dal.schedules import ScheduleVersion
from punctual.domain.figures import RecentFigures, Spread, StateTimes, state_times
from punctual.domain.ids import is_manual
from punctual.domain.occurrence import Attempt, Occurrence
from punctual.domain.policies import MisfirePolicy, OverlapPolicy, RetryPolicy
from punctual.domain.schedule import (
    TARGET_NAME_PATTERN,
    MissedEpisode,
    Schedule,
    ScheduleDefinition,
)
from punctual.domain.specs import ScheduleSpec
from punctual.domain.tenancy import Quotas, Target, Tenant
from punctual.timing import Preview, utc_text


def _iso(instant: int | None) -> str | None:
    return utc_text(instant) if instant is not None else None


class ErrorBody(BaseModel):
    code: str = Field(examples=["invalid_input"])
    message: str
    fields: list[dict[str, str]] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorOut(BaseModel):
    error: ErrorBody


class FireOut(BaseModel):
    utc: str
    local: str


class NextFireOut(FireOut):
    available_at: str = Field(
        description="When its message becomes receivable (UTC): the fire itself for strict "
        "schedules, later within a flexible window."
    )
    occurrence_id: str | None = Field(
        description="Set when the occurrence is already made (GET /v1/occurrences/{id} reads "
        "it); null while the fire is only planned."
    )


class MissedOut(BaseModel):
    version: int = Field(description="The schedule version whose fires these were.")
    first: str = Field(description="The earliest fire recorded MISSED (UTC).")
    last: str = Field(description="The latest fire recorded MISSED (UTC).")
    count: int = Field(description="How many fires, from first to last, were recorded MISSED.")


_MISSED = (
    "Misfire episodes: fires the misfire policy recorded MISSED (they were due more than "
    "max_lateness_seconds before Punctual could make them, e.g. after an outage) and that "
    "never became occurrences, oldest first. The latest 16 episodes are kept."
)


class _DefinitionOut(BaseModel):
    """What a schedule's version defines (ScheduleDefinition's fields, as stored)."""

    name: str | None
    spec: ScheduleSpec
    target: str
    payload: dict[str, Any]
    flexible_window_seconds: int
    misfire: MisfirePolicy
    overlap: OverlapPolicy
    retry: RetryPolicy


_RUN_VERSION = (
    "The version its occurrences carry (schedule_version): the latest change to when or what "
    "runs. A change of the name alone makes a version and keeps this one, so it cancels "
    "nothing."
)


class ScheduleOut(_DefinitionOut):
    schedule_id: str
    version: int
    run_version: int = Field(description=_RUN_VERSION)
    state: str
    created_at: str
    updated_at: str
    next_fire_at: str | None = Field(
        description="What happens next: the instant of the next fire not yet receivable "
        "(UTC; a flexible fire's message comes later in its window, next_fires says when). "
        "null when the schedule is not ACTIVE or has no fire left."
    )
    next_run_at: str | None = Field(
        description="The materializer's cursor, not the next fire: the instant of the first "
        "fire it has not planned yet (UTC). Behind the clock while planning catches up "
        "(after an outage); next_fire_at is what happens next."
    )
    missed_total: int = Field(
        description="Every fire of this schedule recorded MISSED, all versions and episodes."
    )
    missed: list[MissedOut] = Field(description=_MISSED)
    home_region: str | None = Field(
        description="The region that plans it (docs/multi-region.md); null for a schedule "
        "made before regions were recorded."
    )
    generation: int = Field(description="Incremented by each fail-over to another region.")
    tzdata_version: str | None = Field(
        description="The IANA tzdata release its fires were planned with (a zone-based "
        "schedule's); a newer release deployed re-plans it (docs/time.md)."
    )


class OccurrenceOut(BaseModel):
    occurrence_id: str
    schedule_id: str
    schedule_version: int
    scheduled_for: str
    available_at: str
    state: str = Field(
        description="SCHEDULED (planned; once sent, waiting in the queue), RUNNING, "
        "RETRY_WAIT, SUCCEEDED, DEAD, MISSED, CANCELED or SKIPPED_OVERLAP."
    )
    target: str
    attempt_count: int
    enqueued_at: str | None = Field(
        description="When the relay sent its message (SQS SentTimestamp, UTC), recorded by "
        "the worker's first claim; null until a worker took it."
    )
    claimed_at: str | None = Field(
        default=None,
        description="When a worker first claimed it (UTC); null until one did.",
    )
    waited_seconds: int | None = Field(
        default=None,
        description="claimed_at - available_at: how long it waited for a worker once it was "
        "due (schedule-to-start; the lag of the relay is enqueued_at's). null until claimed.",
    )
    reason: str | None
    manual: bool = Field(
        description="Made by a request (run now: POST /v1/schedules/{id}/trigger, or a "
        "backfill), not by the schedule's timing; a backfill of an instant the schedule "
        "passed with no record at all makes that fire's own occurrence (manual: false)."
    )


class TriggerOut(BaseModel):
    occurrence: OccurrenceOut
    replayed: bool = Field(
        description="True when an earlier request with the same Idempotency-Key made this "
        "occurrence: nothing new was made."
    )


class BackfillOut(BaseModel):
    dry_run: bool
    fires: int = Field(description="The current version's fires in [from, to).")
    existing: int = Field(
        description="Fires with an occurrence already (one that ran or will run, of any "
        "version, or an earlier backfill's): not made again."
    )
    planned: int = Field(
        description="Fires the materializer has not reached yet: it makes them on time."
    )
    created: int = Field(description="Occurrences made (dry run: that would be made).")
    occurrences: list[OccurrenceOut] = Field(
        description="The first of them (10 at most), in time order, receivable from now on "
        "at the tenant's catch-up pace."
    )


class AffectedOut(OccurrenceOut):
    note: str


_NEXT_FIRES = "What happens next: the next fires not yet receivable, made or not."


class SavedOut(BaseModel):
    schedule: ScheduleOut
    next_fires: list[NextFireOut] = Field(description=_NEXT_FIRES)
    notes: list[str]
    materialized: list[OccurrenceOut] = Field(
        description="Occurrences due so soon that they were created with this change."
    )
    affected: list[AffectedOut] = Field(
        description="Occurrences of older versions and what became of them."
    )
    replayed: bool = Field(
        default=False,
        description="A create with an Idempotency-Key: true when this is the answer "
        "remembered for the key, nothing done again (so is the Idempotent-Replayed header).",
    )


class SpreadOut(BaseModel):
    count: int = Field(description="How many fires were measured.")
    p50_seconds: int
    p99_seconds: int = Field(description="The 99th percentile, nearest rank.")
    max_seconds: int


class OutcomesOut(BaseModel):
    succeeded: int
    retried: int = Field(description="Took more than one attempt (whatever its state).")
    dead: int
    missed: int = Field(
        description="MISSED occurrences, and the fires of the misfire episodes counted."
    )
    skipped: int = Field(description="SKIPPED_OVERLAP.")
    canceled: int
    open: int = Field(description="Not ended yet: SCHEDULED, RUNNING or RETRY_WAIT.")


class FailureOut(BaseModel):
    occurrence_id: str | None = Field(
        description="null for fires the misfire policy recorded MISSED (none was made)."
    )
    scheduled_for: str
    at: str = Field(description="When: the attempt's end (or start), else the fire's due time.")
    what: str = Field(description="An attempt's outcome (RETRY, DEAD, LOST) or DEAD, MISSED.")
    error: str | None = Field(description="The worker's error, or the reason recorded.")


class RecentOut(BaseModel):
    fires: int = Field(
        description="How many fires these figures cover: the last `recent` fires scheduled by "
        "now (manual runs left out), and the fires of the misfire episodes among them."
    )
    since: str | None = Field(description="The earliest of them (UTC); null if none.")
    receivable_lag: SpreadOut | None = Field(
        description="How late each message became receivable after its due time "
        "(max(enqueued_at, available_at) - available_at), over the fires a worker claimed. "
        "null if none was."
    )
    start_lag: SpreadOut | None = Field(
        description="From each fire's due time to its first attempt's start, by the worker's "
        "clock (negative if that clock is behind). null if no fire was claimed."
    )
    outcomes: OutcomesOut
    last_failure: FailureOut | None = Field(
        description="The latest failed attempt, DEAD or MISSED among these fires; null if none."
    )
    unreadable: int = Field(
        description="Items under the schedule's key that are not occurrences Punctual wrote "
        "(a worker wrote them), left out."
    )


class ScheduleDetailOut(BaseModel):
    schedule: ScheduleOut
    next_fires: list[NextFireOut] = Field(description=_NEXT_FIRES)
    notes: list[str]
    recent: RecentOut | None = Field(
        description="How the last fires went (docs/operations.md, *A schedule's recent "
        "fires*); null when the request asked for none (recent=0)."
    )


class ScheduleListOut(BaseModel):
    schedules: list[ScheduleOut]
    next_token: str | None


class VersionOut(_DefinitionOut):
    version: int
    run_version: int = Field(description=_RUN_VERSION)
    effective_from: str = Field(description="When this version took effect (UTC).")
    state: str


class VersionListOut(BaseModel):
    versions: list[VersionOut] = Field(description="Newest first.")
    next_token: str | None


class AttemptOut(BaseModel):
    attempt_no: int
    started_at: str
    finished_at: str | None
    outcome: str
    error: str | None


class StateTimesOut(BaseModel):
    """Where the occurrence's time went, in seconds (docs/operations.md, *Time in each
    state*)."""

    to_receivable_seconds: int | None = Field(
        description="available_at to receivable: its message's send (enqueued_at), or 0 when "
        "it was sent ahead with a delay; null until a worker's claim recorded the send."
    )
    to_claim_seconds: int | None = Field(
        description="Receivable to the first attempt's start (by the worker's clock: "
        "negative when it is behind); null until claimed."
    )
    run_seconds: list[int] = Field(
        description="Each finished attempt's run, started_at to finished_at, in order."
    )
    retry_wait_seconds: list[int] = Field(
        description="Each wait between an attempt's end and the next one's start (a "
        "retry's back-off), in order."
    )


class OccurrenceDetailOut(OccurrenceOut):
    attempts: list[AttemptOut]
    times: StateTimesOut


class OccurrenceListOut(BaseModel):
    occurrences: list[OccurrenceOut]
    missed: list[MissedOut] = Field(
        description="The misfire episodes that overlap from..to: fires in the window that "
        "have no occurrence because the misfire policy recorded them MISSED. "
        "Every page repeats them."
    )
    next_token: str | None


class LedgerItemOut(BaseModel):
    occurrence_id: str
    schedule_id: str
    scheduled_for: str
    state: str = Field(
        description="The occurrence's state when its hour was checked (DEAD, MISSED, "
        "CANCELED, SKIPPED_OVERLAP, SUCCEEDED after a retry, or SCHEDULED, RUNNING, "
        "RETRY_WAIT: still open); MISSING: no occurrence was ever made for the fire; "
        "UPCOMING: a fire to come, computed from the schedule's definition."
    )
    finding: str | None = Field(
        description="The reconciler's finding (docs/operations.md, *Reconciler*); null for "
        "an upcoming fire."
    )
    attempts: int
    target: str | None
    available_at: str | None = Field(
        default=None,
        description="When it is (or was) receivable, its jitter included: an upcoming fire's, "
        "and one read live's (an hour not yet checked); null from a checked hour's page.",
    )
    enqueued_at: str | None = Field(
        default=None,
        description="Read live only: when the relay sent its message (recorded by the "
        "worker's first claim).",
    )
    claimed_at: str | None = Field(
        default=None, description="Read live only: when a worker first claimed it."
    )
    reason: str | None = Field(default=None, description="Read live only: why it is DEAD, ...")
    manual: bool = Field(default=False, description="Made by a run now or a backfill.")
    late: bool = Field(
        default=False,
        description="Made after its time: by the reconciler's repair, a misfire's catch-up or "
        "a backfill.",
    )


class LedgerHourOut(BaseModel):
    hour: str
    shards: int
    shards_checked: int = Field(
        description="Shards whose reconciler check of the hour is recorded: the hour's "
        "figures are complete when it equals shards (0: not checked yet)."
    )
    checked_at: str | None
    counts: dict[str, int] = Field(
        description="The tenant's fires and occurrences of the hour by finding, in the "
        "shards checked."
    )
    retried: int = Field(description="Occurrences with more than one attempt (listed).")
    late: int = Field(
        description="Occurrences made after their time (a repair, a misfire's catch-up, a "
        "backfill: listed)."
    )
    unlisted: int = Field(
        description="Exceptions counted but not listed (past 1,000 in one shard): read them "
        "by schedule."
    )
    unreadable: int = Field(description="Items at the tenant's keys that are not Punctual's.")
    live: bool = Field(
        description="Read from the occurrences as they are now (an hour of the last three not "
        "yet checked on every shard, or the current one): counts by state, no MISSING (a "
        "fire never made is found by the check)."
    )


class LedgerOut(BaseModel):
    occurrences: list[LedgerItemOut] = Field(
        description="By scheduled_for, then id: the exceptions of the checked hours (every "
        "occurrence that did not succeed at its first attempt), then the upcoming fires."
    )
    hours: list[LedgerHourOut] = Field(
        description="Each ended hour whose listing this page began, with its counts."
    )
    live_complete: bool = Field(
        description="false: the tenant has more schedules than the ledger reads live (500): "
        "its recent hours come from the checks' pages alone."
    )
    upcoming_complete: bool | None = Field(
        description="false: the tenant has more active schedules than the ledger computes "
        "fires for (2,000), and none is listed; null: this page ended before them."
    )
    next_token: str | None


_EARLY_DELIVERY = (
    "Its consumers run the worker SDK, which holds a message until its instant: a message "
    "may become receivable up to 1 s before its available_at, so that the handler starts "
    "on the instant (docs/worker.md, *Starting on the instant*). false: never before it. A "
    "change applies to what the relay sends within 5 minutes; messages already sent keep "
    "their delays."
)


class TargetIn(BaseModel):
    name: str = Field(pattern=TARGET_NAME_PATTERN)
    early_delivery: bool = Field(default=False, strict=True, description=_EARLY_DELIVERY)


class TargetPatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    early_delivery: bool = Field(strict=True, description=_EARLY_DELIVERY)


class TargetOut(BaseModel):
    name: str
    queue_url: str
    queue_arn: str
    dlq_url: str
    dlq_arn: str
    created_at: str
    early_delivery: bool = Field(description=_EARLY_DELIVERY)


class TargetListOut(BaseModel):
    targets: list[TargetOut]


class TenantOut(BaseModel):
    tenant_id: str
    quotas: Quotas
    schedule_count: int
    strict_fires_per_minute_peak: int = Field(
        description="The busiest minute of the hour under admission control."
    )


class TenantListOut(BaseModel):
    tenants: list[TenantOut]
    next_token: str | None


class WorkerPolicyOut(BaseModel):
    policy: dict[str, Any] = Field(
        description="An IAM policy document: attach it to the role the tenant's workers run "
        "as. Every statement is scoped to the tenant's own partition keys and queues."
    )


class MetaOut(BaseModel):
    version: str
    tzdata: str


class PreviewOut(BaseModel):
    fires: list[FireOut]
    notes: list[str]


def _spread_out(found: Spread | None) -> SpreadOut | None:
    if found is None:
        return None
    return SpreadOut(
        count=found.count, p50_seconds=found.p50, p99_seconds=found.p99, max_seconds=found.max
    )


def recent_out(figures: RecentFigures) -> RecentOut:
    failure = figures.last_failure
    return RecentOut(
        fires=figures.fires,
        since=_iso(figures.since),
        receivable_lag=_spread_out(figures.receivable_lag),
        start_lag=_spread_out(figures.start_lag),
        outcomes=OutcomesOut(
            succeeded=figures.succeeded,
            retried=figures.retried,
            dead=figures.dead,
            missed=figures.missed,
            skipped=figures.skipped,
            canceled=figures.canceled,
            open=figures.open,
        ),
        last_failure=None
        if failure is None
        else FailureOut(
            occurrence_id=failure.occurrence_id,
            scheduled_for=utc_text(failure.scheduled_for),
            at=utc_text(failure.at),
            what=failure.what,
            error=failure.error,
        ),
        unreadable=figures.unreadable,
    )


def version_out(version: ScheduleVersion) -> VersionOut:
    schedule = version.schedule
    return VersionOut(
        **schedule.model_dump(include=set(ScheduleDefinition.model_fields) | {"version", "state"}),
        run_version=schedule.run_version,
        effective_from=utc_text(version.effective_from),
    )


def schedule_out(schedule: Schedule, next_fires: NextFires) -> ScheduleOut:
    """``next_fires``: what the control plane says happens next (the first is shown)."""
    return ScheduleOut(
        next_fire_at=next_fires.fires[0].fire.utc if next_fires.fires else None,
        **schedule.model_dump(
            include=set(ScheduleDefinition.model_fields)
            | {
                "schedule_id",
                "version",
                "state",
                "home_region",
                "generation",
                "tzdata_version",
            }
        ),
        run_version=schedule.run_version,
        created_at=schedule.created_at.isoformat(),
        updated_at=schedule.updated_at.isoformat(),
        next_run_at=_iso(schedule.next_run_at),
        missed_total=schedule.missed_total,
        missed=missed_out(schedule.missed),
    )


def missed_out(episodes: list[MissedEpisode]) -> list[MissedOut]:
    return [
        MissedOut(version=e.version, first=utc_text(e.first), last=utc_text(e.last), count=e.count)
        for e in episodes
    ]


def occurrence_out(occurrence: Occurrence, claimed_at: int | None = None) -> dict[str, Any]:
    """``claimed_at``: when a worker first claimed it, if known here."""
    return OccurrenceOut(
        claimed_at=_iso(claimed_at),
        waited_seconds=(
            None if claimed_at is None else max(0, claimed_at - occurrence.available_at)
        ),
        **occurrence.model_dump(
            include={
                "occurrence_id",
                "schedule_id",
                "schedule_version",
                "state",
                "target",
                "attempt_count",
                "reason",
            }
        ),
        scheduled_for=utc_text(occurrence.scheduled_for),
        available_at=utc_text(occurrence.available_at),
        enqueued_at=_iso(occurrence.enqueued_at),
        manual=is_manual(occurrence.occurrence_id),
    ).model_dump(mode="json")


def affected_out(affected: Affected) -> AffectedOut:
    return AffectedOut(**occurrence_out(affected.occurrence), note=affected.note)


def fires_out(fires: Preview) -> list[FireOut]:
    return [FireOut(utc=f.utc, local=f.local) for f in fires.fires]


def next_fires_out(fires: NextFires) -> list[NextFireOut]:
    return [
        NextFireOut(
            utc=f.fire.utc,
            local=f.fire.local,
            available_at=utc_text(f.available_at),
            occurrence_id=f.occurrence_id,
        )
        for f in fires.fires
    ]


def saved_out(saved: Saved) -> SavedOut:
    return SavedOut(
        schedule=schedule_out(saved.schedule, saved.next_fires),
        next_fires=next_fires_out(saved.next_fires),
        notes=saved.notes,
        materialized=[OccurrenceOut(**occurrence_out(o)) for o in saved.materialized],
        affected=[affected_out(a) for a in saved.affected],
    )


def occurrence_detail_out(occurrence: Occurrence, attempts: list[Attempt]) -> OccurrenceDetailOut:
    return OccurrenceDetailOut(
        **occurrence_out(occurrence, attempts[0].started_at if attempts else None),
        attempts=[
            AttemptOut(
                attempt_no=a.attempt_no,
                started_at=utc_text(a.started_at),
                finished_at=_iso(a.finished_at),
                outcome=a.outcome.value,
                error=a.error,
            )
            for a in attempts
        ],
        times=state_times_out(state_times(occurrence, attempts)),
    )


def state_times_out(times: StateTimes) -> StateTimesOut:
    return StateTimesOut(
        to_receivable_seconds=times.to_receivable,
        to_claim_seconds=times.to_claim,
        run_seconds=list(times.runs),
        retry_wait_seconds=list(times.retry_waits),
    )


def target_out(target: Target) -> TargetOut:
    return TargetOut(
        **target.model_dump(
            include={"name", "queue_url", "queue_arn", "dlq_url", "dlq_arn", "early_delivery"}
        ),
        created_at=target.created_at.isoformat(),
    )


def tenant_out(tenant: Tenant) -> TenantOut:
    return TenantOut(
        tenant_id=tenant.tenant_id,
        quotas=tenant.quotas,
        schedule_count=tenant.schedule_count,
        strict_fires_per_minute_peak=max(tenant.minute_load),
    )


def ledger_out(answer: LedgerAnswer) -> LedgerOut:
    items = []
    for item in answer.items:
        if isinstance(item, Upcoming):
            items.append(
                LedgerItemOut(
                    occurrence_id=item.occurrence_id,
                    schedule_id=item.schedule_id,
                    scheduled_for=utc_text(item.scheduled_for),
                    state=UPCOMING,
                    finding=None,
                    attempts=0,
                    target=item.target,
                    available_at=utc_text(item.available_at),
                )
            )
        else:
            items.append(
                LedgerItemOut(
                    occurrence_id=item.occurrence_id,
                    schedule_id=item.schedule_id,
                    scheduled_for=utc_text(item.scheduled_for),
                    state=shown_state(item),
                    finding=item.finding.value,
                    attempts=item.attempts,
                    target=item.target,
                    available_at=_utc_or_none(item.available_at),
                    enqueued_at=_utc_or_none(item.enqueued_at),
                    claimed_at=_utc_or_none(item.claimed_at),
                    reason=item.reason,
                    manual=_manual(item.occurrence_id),
                    late=item.late,
                )
            )
    return LedgerOut(
        occurrences=items,
        hours=[
            LedgerHourOut(
                hour=utc_text(h.hour),
                shards=h.shards,
                shards_checked=h.shards_checked,
                checked_at=None if h.checked_at is None else utc_text(h.checked_at),
                counts={finding.value: n for finding, n in sorted(h.counts.items())},
                retried=h.retried,
                late=h.late,
                unlisted=h.unlisted,
                unreadable=h.unreadable,
                live=h.live,
            )
            for h in answer.hours
        ],
        live_complete=answer.live_complete,
        upcoming_complete=answer.upcoming_complete,
        next_token=answer.next_token,
    )


def _utc_or_none(instant: int | None) -> str | None:
    return None if instant is None else utc_text(instant)


def _manual(occurrence_id: str) -> bool:
    """A run now's or a backfill's; False for an id that is no occurrence id of ours (an
    item a tenant's worker wrote under its own keys, shown to that tenant only)."""
    try:
        return is_manual(occurrence_id)
    except ValueError:
        return False
