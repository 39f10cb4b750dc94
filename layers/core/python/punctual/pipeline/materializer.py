"""The materializer: due schedules become occurrences, shard by shard, minute by minute.

For each shard it claims a short lease (a fencing token that grows with every claim, renewed
as the walk goes on, so a killed holder blocks its shard for seconds, not minutes), then
walks the shard's due buckets from the durable watermark up to ``tick + lookahead``. Each
schedule step is one set of transaction actions: put the occurrence(s) (conditional on not
existing) and move the schedule's cursor (conditional on version, old cursor and ACTIVE).
Steps share a transaction (up to 100 actions) with one fence check, so a holder whose lease
was taken over can commit nothing. The watermark moves past a bucket only once every
schedule in it has been committed, so a crash anywhere re-runs the bucket: the deterministic
ids and cursor conditions make the re-run a no-op for what was done and finish what was not.

A step that completes a schedule gives its quota back in the same transaction, to a tally
kept on the shard (never a hot item shared by every shard); the tally is handed over to the
tenant's usage in one more transaction, so a crash anywhere neither loses nor doubles it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from punctual.backoff import Backoff
from punctual.dal.common import ConditionFailed, Label
from punctual.dal.leases import BOOTSTRAP_SECONDS, Lease
from punctual.dal.schedules import (
    StoredSchedule,
    after_step,
    homed_in,
)
from punctual.dal.tenants import released_usage
from punctual.domain.errors import Retryable
from punctual.domain.ids import minute_of
from punctual.domain.occurrence import Occurrence
from punctual.domain.planning import Catchup, Plan, plan
from punctual.domain.policies import MisfireAction
from punctual.domain.schedule import Schedule, ScheduleState
from punctual.domain.tenancy import Quotas
from punctual.observability import logger
from punctual.pipeline.rezone import replan, stale
from punctual.services import Services

MAX_ACTIONS = 100  # DynamoDB's limit per transaction
STEP_LIMIT = 20  # occurrences one schedule step may create
# Short, renewed leases: a killed holder's shard is free again after this, and the walk
# renews well before it runs out (a takeover of a live holder is safe, only wasteful: the
# fence stops the old holder's next commit).
LEASE_SECONDS = 20
RENEW_AFTER = LEASE_SECONDS // 3
# A bucket's transaction is tried this many times in a tick; then the watermark stays and
# the next tick runs the bucket again. The pause before each retry: a throttled or contended
# transaction tried again at once would meet the same hot partition (or the same rival).
COMMIT_ATTEMPTS = 6
RETRY = Backoff(tries=COMMIT_ATTEMPTS, base=0.05, cap=1.0)

CrashHook = Callable[[str], None]
# Fault injection for the reconciler's tests: (schedule_id, scheduled_for) -> drop it silently.
SkipHook = Callable[[str, int], bool]


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
    malformed: int = 0  # items skipped as a tenant's bad data (a re-plan's reads)


@dataclass
class _Step:
    """One schedule's share of a transaction."""

    stored: StoredSchedule
    occurrences: list[Occurrence]
    plan: Plan | None  # None: every fire was made already; the step only completes it
    actions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def schedule(self) -> Schedule:
        return self.stored.schedule

    @property
    def completes(self) -> bool:
        return self.plan is None or self.plan.cursor.next_run_at is None

    @property
    def missed(self) -> list[int]:
        return self.plan.missed if self.plan else []


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
        self.leases = services.leases
        self._quotas: dict[str, Quotas] = {}
        self._renewed_at = 0

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
        bad = self._s.bad_items.count
        report = self._run_shard(tick, shard)
        report.malformed = self._s.bad_items.count - bad
        return report

    def _run_shard(self, tick: int, shard: int) -> ShardReport:
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
        self._renewed_at = now
        report.claimed = True
        last_bucket = minute_of(tick + self.settings.lookahead_seconds)
        # Every fire receivable before the end of the last bucket is materialized now, so
        # a cursor always moves to a bucket after the ones this walk covers.
        until = last_bucket + 59
        minute = lease.watermark
        try:
            while minute <= last_bucket and not self._out_of_time():
                done, lease = self._bucket(lease, minute, until, report)
                if not done:
                    break
                self._crash("before_watermark")
                minute += 60
                self._renewed_at = self._now()
                if not self.leases.advance(
                    lease, minute, expires_at=self._renewed_at + LEASE_SECONDS
                ):
                    report.lease_lost = True
                    break
                report.buckets += 1
            if not report.lease_lost:
                self._crash("before_hand_over")
                report.lease_lost = not self._hand_over(lease)
        except Exception:
            # An error (throttling, a bug) releases too, so Step Functions' retry need not
            # wait for the lease to expire; only a killed process leaves it to expire.
            self.leases.release(lease, now=self._now())
            raise
        report.watermark = minute
        if not report.lease_lost:
            self.leases.release(lease, now=self._now())
        return report

    def _still_held(self, lease: Lease) -> bool:
        """Renew the lease once a third of it has passed; False if it was lost."""
        now = self._now()
        if now - self._renewed_at < RENEW_AFTER:
            return True
        self._renewed_at = now
        return self.leases.renew(lease, expires_at=now + LEASE_SECONDS)

    # --- one bucket ---------------------------------------------------------------------

    def _bucket(
        self, lease: Lease, minute: int, until: int, report: ShardReport
    ) -> tuple[bool, Lease]:
        """Materialize every schedule in one (minute, shard) bucket; False if not all done."""
        # The due index may lag: a schedule moved into this bucket a moment ago can be missing
        # from this read. Writers keep a margin ahead of the walk (control/plane.py), and the
        # reconciler moves a schedule left behind the watermark to a bucket still ahead.
        now = self._now()
        steps = [
            step
            for found in self._s.schedules.due_in(minute, lease.shard)
            if (stored := self._under_rules_in_use(found)) is not None
            and (step := self._plan(stored, now, until)) is not None
        ]
        report.schedules += len(steps)
        return self._commit(lease, self._ready(steps), now, until, report)

    def _under_rules_in_use(self, stored: StoredSchedule) -> StoredSchedule | None:
        """``stored``, re-planned first if it was planned under older zone rules
        (punctual.pipeline.rezone): a step from its old cursor would fire a moved wall time twice or
        not at all. None when the re-plan kept losing races (the reconciler re-plans it)."""
        schedule = stored.schedule
        if not stale(schedule) or not homed_in(schedule, self.settings.region):
            return stored
        try:
            replan(self._s, schedule.schedule_id)
        except Retryable:
            logger.error(
                "a schedule planned under older zone rules could not be re-planned; the "
                "reconciler will",
                extra={"schedule_id": schedule.schedule_id},
            )
            return None
        return self._s.schedules.current(schedule.schedule_id)

    def _plan(
        self, stored: StoredSchedule, now: int, until: int, resume: Catchup | None = None
    ) -> _Step | None:
        schedule = stored.schedule
        if schedule.state is not ScheduleState.ACTIVE or schedule.next_available_at is None:
            return None
        if not homed_in(schedule, self.settings.region):
            # Another region's (a take-over moved it, docs/multi-region.md): only the region
            # holding its generation plans it; the step's condition fences a stale read.
            return None
        if schedule.next_available_at > until:
            return None  # the index copy was stale: the schedule has moved on
        if schedule.next_run_at is None:
            # The API materialized every fire itself; only the completion is left.
            step = _Step(stored, [], None)
        else:
            handled = (
                schedule.planned_until
                if schedule.planned_until is not None
                else schedule.next_run_at - 1  # a cursor written before planned_until existed
            )
            planned = plan(
                schedule,
                planned_until=handled,
                until=until,
                now=now,
                retention_seconds=self.settings.retention_days * 86400,
                limit=STEP_LIMIT,
                catchup_pace=self._catchup_pace(schedule),
                resume=resume,
            )
            made = planned.occurrences
            if self._skip is not None:
                # An injected fault: the cursor still moves past the dropped instants, exactly
                # the silent loss the reconciler must find.
                made = [o for o in made if not self._skip(o.schedule_id, o.scheduled_for)]
            step = _Step(stored, made, planned)
        return step

    def _ready(self, steps: list[_Step]) -> list[_Step]:
        """The steps with their transaction actions. A schedule read from the due index (or
        its CURRENT item) carries no payload, only a mark that it has one: the payloads of
        those that make occurrences are read from their version items first, one
        BatchGetItem per 100 (``ScheduleStore.payloads``: a miss of the eventually consistent
        read is read again consistently). A version item even that does not find is
        Retryable: the invocation fails and Step Functions runs it again (its watermark kept)."""
        unread = [s for s in steps if s.occurrences and s.schedule.payload is None]
        read = iter(self._s.schedules.with_payloads([s.schedule for s in unread]))
        for step in unread:
            step.stored = replace(step.stored, schedule=next(read))
        for step in steps:
            step.actions = self._actions(step)
        return steps

    def _actions(self, step: _Step) -> list[dict[str, Any]]:
        cursor = None if step.completes or step.plan is None else step.plan.cursor
        payload = step.schedule.known_payload if step.occurrences else {}
        return [self._s.occurrences.put_new_action(o, payload) for o in step.occurrences] + [
            self._s.schedules.step_action(step.stored, cursor, step.missed)
        ]

    def _catchup_pace(self, schedule: Schedule) -> int:
        """Seconds between catch-up occurrences of one schedule, from the tenant's quota."""
        if schedule.misfire.action is not MisfireAction.CATCHUP:
            return 0
        quotas = self._quotas.get(schedule.tenant_id)
        if quotas is None:
            quotas = self._s.tenants.get(schedule.tenant_id).quotas
            self._quotas[schedule.tenant_id] = quotas
        return quotas.catchup_pace

    # --- transactions -------------------------------------------------------------------

    def _commit(
        self, lease: Lease, steps: list[_Step], now: int, until: int, report: ShardReport
    ) -> tuple[bool, Lease]:
        pending = list(steps)
        retries = 0
        while pending:
            if self._out_of_time():
                # Stop between transactions, not at the Lambda's timeout: the lease is
                # released and the watermark stays, so the next tick re-reads this bucket,
                # where only the schedules not yet stepped are left.
                report.out_of_time = True
                return False, lease
            if not self._still_held(lease):
                report.lease_lost = True
                return False, lease
            batch, releases = self._next_batch(pending)
            self._crash("before_commit")
            actions = [(Label.FENCE, self.leases.still_mine_action(lease, frozenset(releases)))]
            actions += [
                (Label.TALLY, self.leases.tally_release_action(lease, t, a))
                for t, a in releases.items()
            ]
            fixed = len(actions)
            actions += [(Label.STEP, a) for s in batch for a in s.actions]
            try:
                self._s.transactions.commit(actions)
            except ConditionFailed as refused:
                if refused.label == Label.FENCE:  # (the first action: its failure comes first)
                    report.lease_lost = True
                    return False, lease
                again = self._sort_out(batch, refused, fixed, now, until, report)
            except Retryable:
                again = batch  # a conflicting transaction or throttling: the same steps again
            else:
                lease = replace(lease, pending=lease.pending | releases.keys())
                self._done(batch, now, until, report, pending)
                self._crash("after_commit")
                continue
            retries += 1
            if retries >= COMMIT_ATTEMPTS:
                return False, lease  # the watermark stays; the next tick re-runs this bucket
            self._s.sleep(RETRY.pause(retries - 1))
            pending[:0] = again
        return True, lease

    def _next_batch(self, pending: list[_Step]) -> tuple[list[_Step], dict[str, dict[str, int]]]:
        """The steps of the next transaction, and the quota their completions give back (per
        tenant), within DynamoDB's action limit (the fence and one tally per tenant count)."""
        batch: list[_Step] = []
        counts: dict[str, int] = defaultdict(int)
        loads: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        while pending:
            step = pending[0]
            tenant = step.schedule.tenant_id
            extra = int(step.completes and tenant not in counts)
            size = 1 + len(counts) + sum(len(s.actions) for s in batch)
            if size + extra + len(step.actions) > self.max_actions:
                break
            batch.append(pending.pop(0))
            if step.completes:
                counts[tenant] += 1
                for minute, load in step.stored.minute_load.items():
                    loads[tenant][minute] += load
        releases = {t: released_usage(n, dict(loads[t])) for t, n in counts.items()}
        return batch, releases

    def _done(
        self, batch: list[_Step], now: int, until: int, report: ShardReport, pending: list[_Step]
    ) -> None:
        for step in batch:
            report.occurrences += len(step.occurrences)
            report.missed += len(step.missed)
            if step.completes:
                report.completed += 1
                continue
            assert step.plan is not None
            cursor = step.plan.cursor
            if cursor.next_available_at is not None and cursor.next_available_at <= until:
                # The step hit STEP_LIMIT: continue from the committed cursor, at the same
                # catch-up pace.
                stepped = after_step(step.stored, cursor, step.missed)
                follow_up = self._plan(stepped, now, until, step.plan.catchup)
                if follow_up is not None:
                    pending += self._ready([follow_up])

    def _hand_over(self, lease: Lease) -> bool:
        """Move every tenant's released quota from the shard's tally to the tenant's usage,
        one transaction per tenant; False when the lease was lost."""
        for tenant in sorted(lease.pending):
            tally = self.leases.release_tally(lease, tenant)
            fenced, *emptied = self.leases.hand_over_actions(lease, tenant, tally)
            actions = [(Label.FENCE, fenced), *[(Label.TALLY, a) for a in emptied]]
            if tally:
                actions.append((Label.TENANT, self._s.tenants.release_action(tenant, tally)))
            try:
                self._s.transactions.commit(actions)
            except ConditionFailed as refused:
                if refused.label == Label.FENCE:
                    return False
            except Retryable:
                pass
            # Any other refusal (a conflict on the tenant's item): the tally stays pending,
            # whole, for the next run.
        return True

    def _sort_out(
        self,
        batch: list[_Step],
        refused: ConditionFailed,
        first: int,
        now: int,
        until: int,
        report: ShardReport,
    ) -> list[_Step]:
        """After a refused batch (its steps' actions from index ``first``): innocent steps
        go again, refused ones are re-read."""
        again: list[_Step] = []
        index = first
        for step in batch:
            own = range(index, index + len(step.actions))
            index += len(step.actions)
            if all(refused.innocent(i) for i in own) or any(refused.conflicted(i) for i in own):
                again.append(step)
                continue
            puts, cursor = own[:-1], own[-1]
            if refused.innocent(cursor) and any(refused.failed(i) for i in puts):
                # Only occurrence puts were refused: those occurrences exist already (the
                # id is deterministic, so it is the same one, e.g. a repair): the step goes
                # on without them instead of stalling the shard on them.
                step.occurrences = [
                    o for o, i in zip(step.occurrences, puts, strict=True) if not refused.failed(i)
                ]
                again.append(step)
                continue
            # A condition failed: someone else moved this schedule (an update, a cancel, another
            # materializer). Re-read it and carry on from what is really there.
            report.conflicts += 1
            fresh = self._s.schedules.current(step.schedule.schedule_id)
            follow_up = self._plan(fresh, now, until) if fresh else None
            if follow_up is not None:
                again.append(follow_up)
        # (Their actions again: a re-read one's payload is read, a refused put is left out.)
        return self._ready(again)
