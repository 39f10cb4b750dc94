"""The materializer: due schedules become occurrences, shard by shard, minute by minute.

For each shard it claims the lease (a fencing token that grows with every claim),
then walks the shard's due buckets from the durable watermark up to
``tick + lookahead``. Each schedule step is one set of transaction actions: put
the occurrence(s) (conditional on not existing) and move the schedule's cursor
(conditional on version, old ``next_run_at`` and ACTIVE). Steps share a
transaction (up to 100 actions) with one fence check, so a holder whose lease
was taken over can commit nothing. The watermark moves past a bucket only once
every schedule in it has been committed, so a crash anywhere re-runs the bucket:
the deterministic ids and cursor conditions make the re-run a no-op for what was
done and finish what was not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from punctual.dal.common import Item, from_dynamo, run_batch, to_dynamo, values
from punctual.dal.leases import Lease, LeaseStore
from punctual.dal.schedules import due_bucket, minute_load_of, schedule_from_item
from punctual.dal.tables import DUE_INDEX, SCHEDULE_CURRENT
from punctual.materialize import Planned, new_occurrence, plan
from punctual.models import MisfireAction, Occurrence, Schedule, ScheduleState
from punctual.scheduling import Services
from punctual.tenancy import Quotas

MAX_ACTIONS = 100  # DynamoDB's limit per transaction
STEP_LIMIT = 20  # occurrences one schedule step may create
LEASE_SECONDS = 120
BOOTSTRAP_SECONDS = 3600  # a shard seen for the first time starts this far back
MAX_RETRIES = 5
MAX_CATCHUP_SPREAD = 840  # seconds: under SQS's 900 s delay, with a tick to spare

CrashHook = Callable[[str], None]
# Fault injection for the reconciler's tests: (schedule_id, scheduled_for) -> drop it silently.
SkipHook = Callable[[str, int], bool]


def minute_of(instant: int) -> int:
    return instant - instant % 60


@dataclass
class ShardReport:
    shard: int
    claimed: bool = False
    buckets: int = 0
    schedules: int = 0
    occurrences: int = 0
    missed: int = 0
    conflicts: int = 0
    completed: int = 0
    lease_lost: bool = False
    out_of_time: bool = False  # stopped for lack of time (or never started); the next tick goes on
    watermark: int | None = None


@dataclass
class _Step:
    """One schedule's share of a transaction."""

    item: Item
    schedule: Schedule
    occurrences: list[Occurrence]
    missed: list[int]
    next_run_at: int | None
    next_available_at: int | None
    actions: list[dict[str, Any]] = field(default_factory=list)
    # A catch-up larger than one step continues in follow-up steps at the same pace:
    # (late fires already fired in this catch-up, seconds between them).
    catchup: tuple[int, int] = (0, 0)


class Materializer:
    def __init__(
        self,
        services: Services,
        holder: str,
        *,
        max_actions: int = MAX_ACTIONS,
        crash: CrashHook | None = None,
        out_of_time: Callable[[], bool] | None = None,
        skip: SkipHook | None = None,
    ) -> None:
        self._s = services
        self.settings = services.settings
        self.holder = holder
        self.max_actions = max_actions
        self._crash = crash or (lambda point: None)
        self._out_of_time = out_of_time or (lambda: False)
        self._skip = skip
        self.leases = LeaseStore(services.dynamodb, self.settings.leases_table)
        self._quotas: dict[str, Quotas] = {}

    def _now(self) -> int:
        return int(self._s.now())

    def run(self, tick: int, shards: Sequence[int]) -> list[ShardReport]:
        reports = []
        for shard in shards:
            if self._out_of_time():
                # Not even claimed: its watermark stays and the next tick walks it.
                reports.append(ShardReport(shard, out_of_time=True))
            else:
                reports.append(self.run_shard(tick, shard))
        return reports

    def run_shard(self, tick: int, shard: int) -> ShardReport:
        report = ShardReport(shard)
        now = self._now()
        lease = self.leases.claim(
            shard,
            self.holder,
            now=now,
            ttl=LEASE_SECONDS,
            start_at=minute_of(tick) - BOOTSTRAP_SECONDS,
        )
        if lease is None:
            return report
        report.claimed = True
        last_bucket = minute_of(tick + self.settings.lookahead_seconds)
        # Every fire receivable before the end of the last bucket is materialized now, so
        # a cursor always moves to a bucket after the ones this walk covers.
        until = last_bucket + 59
        minute = lease.watermark
        try:
            while minute <= last_bucket and not self._out_of_time():
                if not self._bucket(lease, minute, until, report):
                    break
                self._crash("before_watermark")
                minute += 60
                if not self.leases.advance(lease, minute):
                    report.lease_lost = True
                    break
                report.buckets += 1
        except Exception:
            # An error (throttling, a bug) releases too, so Step Functions' retry need not
            # wait for the lease to expire; only a killed process leaves it to expire.
            self.leases.release(lease, now=self._now())
            raise
        report.watermark = minute
        if not report.lease_lost:
            self.leases.release(lease, now=self._now())
        return report

    # --- one bucket ---------------------------------------------------------------------

    def _bucket(self, lease: Lease, minute: int, until: int, report: ShardReport) -> bool:
        """Materialize every schedule in one (minute, shard) bucket; False if not all done."""
        pages = self._s.dynamodb.get_paginator("query").paginate(
            TableName=self.settings.schedules_table,
            IndexName=DUE_INDEX,
            KeyConditionExpression="due_bucket = :b",
            ExpressionAttributeValues=values(b=due_bucket(minute, lease.shard)),
        )
        now = self._now()
        steps = [
            step
            for page in pages
            for raw in page["Items"]
            if (step := self._plan(from_dynamo(raw), now, until)) is not None
        ]
        report.schedules += len(steps)
        return self._commit(lease, steps, now, until, report)

    def _plan(
        self, item: Item, now: int, until: int, catchup: tuple[int, int] | None = None
    ) -> _Step | None:
        schedule = schedule_from_item(item)
        cursor = schedule.next_run_at
        due = schedule.next_available_at
        if schedule.state is not ScheduleState.ACTIVE or due is None:
            return None
        if due > until:
            return None  # the index copy was stale: the schedule has moved on
        if cursor is None:
            # The API materialized every fire itself; only the completion is left.
            step = _Step(item, schedule, [], [], None, None)
            step.actions = [self._cursor_update(step)]
            return step
        retention = self.settings.retention_days * 86400
        rule = schedule.rule()
        # Fires later than max_lateness are misfires; recovery starts at the durable cursor.
        late_before = now - schedule.misfire.max_lateness_seconds
        late = list(rule.fires(cursor - 1, late_before - 1)) if cursor < late_before else []
        keep = min(len(late), schedule.misfire.effective_catchup_limit)
        fired_late = late[len(late) - keep :]
        if catchup is None:
            pace = self._catchup_pace(schedule)
            if keep > 1:
                # SQS delays at most 900 s: a slower pace is compressed to stay within it.
                pace = min(pace, MAX_CATCHUP_SPREAD // (keep - 1))
            catchup = (0, pace)
        fired, pace = catchup
        occurrences = [
            new_occurrence(schedule, fire, retention).model_copy(
                update={"available_at": now + (fired + i) * pace}
            )
            for i, fire in enumerate(fired_late[:STEP_LIMIT])
        ]
        if len(fired_late) > STEP_LIMIT:
            # More kept late fires than one step holds: the cursor moves to the next one and
            # a follow-up step (same tick, same pace) fires the rest.
            resume = fired_late[STEP_LIMIT]
            planned = Planned([], resume, resume)
        else:
            planned = plan(
                schedule,
                after=late[-1] if late else cursor - 1,
                materialize_until=until,
                retention_seconds=retention,
                limit=STEP_LIMIT - len(occurrences),
            )
        planned_occurrences = occurrences + planned.occurrences
        if self._skip is not None:
            # An injected fault: the cursor still moves past the dropped instants, exactly the
            # silent loss the reconciler must find.
            planned_occurrences = [
                o for o in planned_occurrences if not self._skip(o.schedule_id, o.scheduled_for)
            ]
        step = _Step(
            item=item,
            schedule=schedule,
            occurrences=planned_occurrences,
            missed=late[: len(late) - keep],
            next_run_at=planned.next_run_at,
            next_available_at=planned.next_available_at,
            catchup=(fired + len(occurrences), pace),
        )
        step.actions = [
            self._s.occurrences.put_new(o, schedule.payload) for o in step.occurrences
        ] + [self._cursor_update(step)]
        return step

    def _catchup_pace(self, schedule: Schedule) -> int:
        """Seconds between catch-up occurrences of one schedule, from the tenant's quota."""
        if schedule.misfire.action is not MisfireAction.CATCHUP:
            return 0
        quotas = self._quotas.get(schedule.tenant_id)
        if quotas is None:
            quotas = self._s.tenants.get(schedule.tenant_id).quotas
            self._quotas[schedule.tenant_id] = quotas
        return max(1, 60 // quotas.catchup_per_minute)

    def _cursor_update(self, step: _Step) -> dict[str, Any]:
        schedule = step.schedule
        names = {"#state": "state"}
        named: dict[str, Any] = {"v": schedule.version, "active": ScheduleState.ACTIVE.value}
        if schedule.next_run_at is None:
            cursor_unchanged = "attribute_not_exists(next_run_at)"
        else:
            cursor_unchanged = "next_run_at = :old"
            named["old"] = schedule.next_run_at
        if step.next_run_at is None or step.next_available_at is None:
            expression = (
                "SET #state = :completed REMOVE due_at, due_bucket, next_run_at, next_available_at"
            )
            named["completed"] = ScheduleState.COMPLETED.value
            sets = []
        else:
            shard = int(step.item["shard"])
            expression = ""
            sets = [
                "next_run_at = :n",
                "next_available_at = :a",
                "due_at = :a",
                "due_bucket = :b",
            ]
            named |= {
                "n": step.next_run_at,
                "a": step.next_available_at,
                "b": due_bucket(step.next_available_at, shard),
            }
        if step.missed:
            # MISSED is a bounded summary on the schedule, never an item per instant.
            sets += [
                "missed_total = if_not_exists(missed_total, :zero) + :m",
                "last_missed_from = :mf",
                "last_missed_to = :mt",
            ]
            named |= {"zero": 0, "m": len(step.missed), "mf": step.missed[0], "mt": step.missed[-1]}
        if sets:
            expression = (
                f"SET {', '.join(sets)}"
                if not expression
                else expression.replace("SET ", f"SET {', '.join(sets)}, ", 1)
            )
        return {
            "Update": {
                "TableName": self.settings.schedules_table,
                "Key": to_dynamo({"schedule_id": schedule.schedule_id, "sk": SCHEDULE_CURRENT}),
                "UpdateExpression": expression,
                # Race: an update, pause or cancel bumped the version (the old version must not
                # fire), or another materializer already moved this cursor (no double step).
                "ConditionExpression": f"version = :v AND {cursor_unchanged} AND #state = :active",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values(**named),
            }
        }

    # --- transactions -------------------------------------------------------------------

    def _commit(
        self, lease: Lease, steps: list[_Step], now: int, until: int, report: ShardReport
    ) -> bool:
        pending = list(steps)
        retries = 0
        while pending:
            if self._out_of_time():
                # Stop between transactions, not at the Lambda's timeout: the lease is
                # released and the watermark stays, so the next tick re-reads this bucket,
                # where only the schedules not yet stepped are left.
                report.out_of_time = True
                return False
            batch: list[_Step] = []
            size = 1  # the fence check
            while pending and size + len(pending[0].actions) <= self.max_actions:
                size += len(pending[0].actions)
                batch.append(pending.pop(0))
            self._crash("before_commit")
            codes = run_batch(
                self._s.dynamodb,
                [self.leases.still_mine(lease)] + [a for s in batch for a in s.actions],
            )
            if not codes:
                self._done(batch, now, until, report, pending)
                self._crash("after_commit")
                continue
            if codes[0] == "ConditionalCheckFailed":
                report.lease_lost = True
                return False
            retries += 1
            if retries > MAX_RETRIES:
                return False  # the watermark stays; the next tick re-runs this bucket
            pending[:0] = self._sort_out(batch, codes[1:], now, until, report)
        return True

    def _done(
        self, batch: list[_Step], now: int, until: int, report: ShardReport, pending: list[_Step]
    ) -> None:
        # Quota is given back after the commit, summed per tenant, outside the hot transaction:
        # a crash in between over-counts (the safe side) until the reconciler recounts.
        released: dict[str, dict[int, int]] = defaultdict(dict)
        completed: dict[str, int] = defaultdict(int)
        for step in batch:
            report.occurrences += len(step.occurrences)
            report.missed += len(step.missed)
            if step.next_run_at is None:
                report.completed += 1
                tenant = step.schedule.tenant_id
                completed[tenant] += 1
                for minute, load in minute_load_of(step.item).items():
                    released[tenant][minute] = released[tenant].get(minute, 0) + load
            elif step.next_available_at is not None and step.next_available_at <= until:
                # The step hit STEP_LIMIT: continue from the committed cursor.
                item = dict(
                    step.item,
                    next_run_at=step.next_run_at,
                    next_available_at=step.next_available_at,
                )
                follow_up = self._plan(item, now, until, step.catchup if step.catchup[0] else None)
                if follow_up is not None:
                    pending.append(follow_up)
        for tenant, count in completed.items():
            self._s.tenants.release(tenant, schedules=count, load=released[tenant])

    def _sort_out(
        self, batch: list[_Step], codes: list[str], now: int, until: int, report: ShardReport
    ) -> list[_Step]:
        """After a cancelled batch: innocent steps go again, refused ones are re-read."""
        again: list[_Step] = []
        index = 0
        for step in batch:
            own = codes[index : index + len(step.actions)]
            index += len(step.actions)
            if all(code in ("None", "") for code in own):
                again.append(step)
                continue
            if "TransactionConflict" in own:
                again.append(step)
                continue
            puts, cursor = own[:-1], own[-1]
            if cursor in ("None", "") and "ConditionalCheckFailed" in puts:
                # Only occurrence puts were refused: those occurrences exist already (the
                # id is deterministic, so it is the same one, e.g. a repair): the step goes
                # on without them instead of stalling the shard on them.
                kept = [
                    o
                    for o, code in zip(step.occurrences, puts, strict=True)
                    if code != "ConditionalCheckFailed"
                ]
                step.occurrences = kept
                step.actions = [
                    self._s.occurrences.put_new(o, step.schedule.payload) for o in kept
                ] + [step.actions[-1]]
                again.append(step)
                continue
            # A condition failed: someone else moved this schedule (an update, a cancel, another
            # materializer). Re-read it and carry on from what is really there.
            report.conflicts += 1
            fresh = self._s.schedules.get_item(step.schedule.schedule_id)
            follow_up = self._plan(fresh, now, until) if fresh else None
            if follow_up is not None:
                again.append(follow_up)
        return again
