"""Process one delivered occurrence: claim, run the handler under a lease, complete.

Duplicate deliveries, one business effect: the claim is a conditional write from the
state the worker read, so each attempt runs on at most one worker at a time; every later
write of the attempt is fenced by its lease token; the handler never runs for an
occurrence that is finished, stale (its schedule changed) or canceled.
"""

from __future__ import annotations

import json
import math
import random
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from punctual.backoff import Backoff, Sleep
from punctual.dal.common import ConditionFailed, Label
from punctual.dal.runs import (
    RunLease,
    RunStore,
    ScheduleForRun,
    Seen,
    StoredRun,
)
from punctual.domain.errors import NotFound, Retryable
from punctual.domain.ids import tenant_of_schedule
from punctual.domain.message import Message, parse_message
from punctual.domain.occurrence import TERMINAL, AttemptOutcome, OccurrenceState
from punctual.domain.policies import OverlapPolicy, RetryPolicy
from punctual.domain.schedule import OWNS_FIRES, ScheduleState
from punctual.observability import logger
from punctual.skew import ClockSkew
from punctual_client.worker.wiring import WorkerServices

# Re-reads after a lost race before the message is left for a later delivery.
CLAIM_ATTEMPTS = 4
# Concurrency slots probed per claim before all of them are read.
SLOT_PROBES = 8
TENANT_CACHE_SECONDS = 60
# A throttled or contended message comes back after this many seconds (uniform).
THROTTLE_BACKOFF = (5, 30)
# Well below the target queue's redrive count (integrations/queues.py MAX_RECEIVE_COUNT = 25):
# ApproximateReceiveCount is approximate.
REQUEUE_AFTER_RECEIVES = 10
# A completion met by a conflict or throttling is tried again (the lease is still ours).
FINISH = Backoff(tries=4, base=0.05, cap=0.5)
# SQS refuses to hide a message for more than 12 hours counted from its receive; the minute
# off covers the time since this receive (a claim comes seconds after it). A handler that
# runs longer sees its message again: the claim answers IN_PROGRESS while the lease lives.
MAX_VISIBILITY = 43_200 - 60
# QUEUE_ONE: the waiting occurrence's message comes back this often to try its claim again,
# and holds the wait slot this long past each try (a worker that dies waiting frees it).
QUEUE_RETRY_SECONDS = 5
QUEUE_WAIT_SECONDS = 60
# A message received at most this long before its instant is held (the handler's thread
# waits); one further ahead is put back, visible again at its instant.
MAX_HOLD_SECONDS = 5.0
HOLDS = 4  # holds of one message at most (each for what is left)


class PermanentError(Exception):
    """Raise it (or a subclass) from a handler for a failure no retry can fix: DEAD at once."""


class Outcome(StrEnum):
    SUCCEEDED = "SUCCEEDED"  # the handler ran and returned
    RETRY = "RETRY"  # transient failure: visible again after the back-off
    DEAD = "DEAD"  # permanent failure, retries exhausted or deadline passed: to the DLQ
    ALREADY_DONE = "ALREADY_DONE"  # a re-delivery of a finished occurrence (a lost ack)
    IN_PROGRESS = "IN_PROGRESS"  # another worker holds a live lease on it
    STALE = "STALE"  # its schedule was updated, paused or canceled: refused, CANCELED
    # SKIP_IF_RUNNING and another run holds the slot; or QUEUE_ONE and another one waits too
    SKIPPED_OVERLAP = "SKIPPED_OVERLAP"
    WAITING = "WAITING"  # QUEUE_ONE: next in line while another runs; visible again soon
    THROTTLED = "THROTTLED"  # the tenant's concurrency limit is reached: visible again later
    LEASE_LOST = "LEASE_LOST"  # our lease expired and another worker took over
    REJECTED = "REJECTED"  # not an occurrence message of this tenant: to the DLQ
    # Received further ahead of its instant than a worker holds one: visible again then.
    EARLY = "EARLY"
    FAILED = "FAILED"  # processing raised (AWS unreachable past retries): the message stays


# What happens to the SQS message after each outcome; the others stay in the queue.
DELETE = frozenset(
    {
        Outcome.SUCCEEDED,
        Outcome.DEAD,
        Outcome.ALREADY_DONE,
        Outcome.STALE,
        Outcome.SKIPPED_OVERLAP,
        Outcome.REJECTED,
    }
)
# The metric each outcome counts under (docs/operations.md).
METRICS = {
    Outcome.SUCCEEDED: "Succeeded",
    Outcome.RETRY: "Retried",
    Outcome.DEAD: "Dead",
    Outcome.ALREADY_DONE: "DuplicateClaims",
    Outcome.IN_PROGRESS: "DuplicateClaims",
    Outcome.STALE: "StaleRefused",
    Outcome.SKIPPED_OVERLAP: "SkippedOverlap",
    Outcome.WAITING: "OverlapWaiting",
    Outcome.THROTTLED: "ConcurrencyThrottled",
    Outcome.LEASE_LOST: "WorkerLeasesLost",
    Outcome.REJECTED: "Rejected",
    Outcome.EARLY: "ReceivedEarly",
    Outcome.FAILED: "ProcessingFailed",
}


@dataclass(frozen=True, slots=True)
class Delivery:
    """One received message, from a long poll or from an SQS-triggered Lambda."""

    body: str
    receipt_handle: str
    queue_url: str
    receive_count: int = 1
    sent_at: int | None = None  # SQS's SentTimestamp: when the relay sent the message

    def message(self) -> Message:
        return parse_message(self.body)


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    detail: str = ""
    visible_in: int | None = None  # a kept message is received again after this many seconds
    requeued: bool = False  # replaced by a fresh copy: the original is deleted

    @property
    def delete(self) -> bool:
        return self.outcome in DELETE or self.requeued


@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim that won: the lease the handler runs under, the schedule's retry policy, and
    when the occurrence became receivable (its available_at, which the deadline runs
    from)."""

    lease: RunLease
    policy: RetryPolicy
    released: int


def backoff_ceiling(policy: RetryPolicy, attempt_no: int) -> int:
    """The upper bound of the full-jitter delay after failed attempt ``attempt_no``."""
    return int(min(policy.backoff_max_seconds, policy.backoff_base_seconds * 2 ** (attempt_no - 1)))


@dataclass
class Job:
    """What a handler gets: the message, its attempt number and the lease it runs under."""

    message: Message
    attempt: int
    _worker: Worker = field(repr=False)
    _lease: RunLease = field(repr=False)
    _delivery: Delivery = field(repr=False)
    lease_lost: bool = False
    _checked_at: float = field(default=float("-inf"), repr=False)
    _canceled: bool = field(default=False, repr=False)

    @property
    def occurrence_id(self) -> str:
        return self.message.occurrence_id

    @property
    def payload(self) -> dict[str, Any]:
        return self.message.payload

    def heartbeat(self) -> bool:
        """Extend the lease, the slots and the message's visibility together; False once the
        run is no longer this worker's: its lease, or a slot it holds (the tenant's
        concurrency slot, the schedule's run slot), passed to another run after the lease
        ran out. The handler should stop: the SDK records nothing of this attempt once a
        heartbeat said False (no completion is written, whatever the handler returns or
        raises), and a later delivery runs the occurrence again."""
        if not self.lease_lost:
            self.lease_lost = not self._worker.extend(self._lease, self._delivery)
        return not self.lease_lost

    def canceled(self) -> bool:
        """Cooperative cancel: was the schedule canceled, paused or updated since this
        occurrence was made? One small read, cached for ``cancel_check_seconds``."""
        now = self._worker.services.now()
        if not self._canceled and now - self._checked_at >= self._worker.cancel_check_seconds:
            self._checked_at = now
            try:
                found = self._worker.runs.schedule_version(self.message.schedule_id)
            except Retryable:
                return self._canceled  # not known now: asked again after cancel_check_seconds
            self._canceled = (
                found is None
                or found[0] != self.message.schedule_version
                or found[1] == ScheduleState.CANCELED.value
            )
        return self._canceled


Handler = Callable[[Job], None]


class Worker:
    """Runs ``handler`` for the occurrences of one tenant, whatever delivered them."""

    def __init__(
        self,
        services: WorkerServices,
        tenant_id: str,
        handler: Handler,
        *,
        lease_seconds: int = 60,
        heartbeat_seconds: float | None = None,
        permanent: tuple[type[BaseException], ...] = (PermanentError, ValidationError),
        cancel_check_seconds: float = 5,
        rng: random.Random | None = None,
        hold: Sleep | None = None,
    ) -> None:
        self.services = services
        self.tenant_id = tenant_id
        self.handler = handler
        self.lease_seconds = lease_seconds
        # Heartbeats run on a thread while the handler runs; None: the handler calls
        # job.heartbeat() itself (and tests drive it with an injected clock).
        self.heartbeat_seconds = heartbeat_seconds
        self.permanent = permanent
        self.cancel_check_seconds = cancel_check_seconds
        self.rng = rng or random.Random()
        self.runs = RunStore(services.db, services.settings, services.bad_items)
        self.stats: Counter[Outcome] = Counter()
        self._lock = threading.Lock()
        self._limit: tuple[int, float] | None = None
        self._dlqs: dict[str, str] = {}
        # The host clock's offset from SQS's (the long-poll consumer feeds it), and how a
        # message received before its instant is held until then (services.sleep unless
        # given: the simulation's moves its clock).
        self.skew = ClockSkew()
        self.hold = hold or services.sleep

    def _now(self) -> int:
        return int(self.services.now())

    # --- the whole path ---------------------------------------------------------------

    def process(self, delivery: Delivery) -> Result:
        """Claim, run, complete. Changes the message's visibility and sends it to the DLQ
        as the outcome needs; deleting it is the caller's (result.delete)."""
        result = self._process(delivery)
        if not result.delete and delivery.receive_count >= REQUEUE_AFTER_RECEIVES:
            result = self._requeue(delivery, result)
        elif result.visible_in is not None and not result.delete:
            self._set_visibility(delivery, result.visible_in)
        with self._lock:
            self.stats[result.outcome] += 1
        logger.info(
            "occurrence processed",
            extra={"outcome": result.outcome.value, "detail": result.detail},
        )
        return result

    def _requeue(self, delivery: Delivery, result: Result) -> Result:
        """A message kept for a long time (throttled, waiting on a lease or a back-off) would
        reach the queue's redrive count and land in the DLQ with its occurrence unrun; a fresh
        copy (receive count 0) replaces it. Copies are harmless: claims decide."""
        self.services.sqs.send_message(
            QueueUrl=delivery.queue_url,
            MessageBody=delivery.body,
            DelaySeconds=max(0, min(result.visible_in or 0, 900)),
        )
        return replace(result, requeued=True)

    def _process(self, delivery: Delivery) -> Result:
        try:
            message = delivery.message()
        except (ValueError, ValidationError) as error:
            return self._rejected(delivery, f"unreadable message: {error}")
        not_now = self._not_ours(delivery, message) or self._held_until_due(message)
        if not_now is not None:
            return not_now
        for _ in range(CLAIM_ATTEMPTS):
            step = self._claim(delivery, message)
            if isinstance(step, Claimed):
                return self._run(delivery, message, step.lease, step.policy, step.released)
            if step is not None:
                return step
        return Result(Outcome.IN_PROGRESS, "contended; left for a later delivery", self._later())

    def _not_ours(self, delivery: Delivery, message: Message) -> Result | None:
        if message.tenant_id != self.tenant_id:
            return self._rejected(delivery, f"a message of tenant {message.tenant_id}")
        if tenant_of_schedule(message.schedule_id) != self.tenant_id:
            # Its key is another tenant's (a forged item's message): whatever its tenant_id
            # field says, this worker neither reads nor runs another tenant's occurrence.
            return self._rejected(delivery, "a message of another tenant's schedule")
        return None

    def _early_by(self, message: Message) -> float:
        """How long before the message's instant (its available_at) the true time can be
        now: the host's clock corrected by the least offset from SQS's it measured."""
        return message.available_at.timestamp() - self.skew.true_now(self.services.now())

    def _held_until_due(self, message: Message) -> Result | None:
        """A message received before its instant (a target with early delivery, or a clock
        behind) is held until then, so its handler never starts early and starts on the
        instant; one further ahead than MAX_HOLD_SECONDS (or still ahead after the hold) is
        left in the queue, visible again at its instant. None: due, go on."""
        ahead = self._early_by(message)
        if ahead > MAX_HOLD_SECONDS:
            return Result(Outcome.EARLY, f"due in {ahead:.3f} s", math.ceil(ahead))
        # Held again while still ahead: a sleep may end a moment short of the wall clock
        # (it runs on the monotonic one), and the estimate's bounds widen as it waits.
        for _ in range(HOLDS):
            if ahead <= 0:
                return None
            self.hold(ahead)
            ahead = self._early_by(message)
        if ahead <= 0:
            return None
        return Result(Outcome.EARLY, f"due in {ahead:.3f} s", max(1, math.ceil(ahead)))

    def _claim(self, delivery: Delivery, message: Message) -> Result | Claimed | None:
        """A refusal, a claim to run under, or None when a race was lost (read again)."""
        now = self._now()
        occurrence, schedule = self.runs.read(message.occurrence_id, message.schedule_id)
        if occurrence is None or occurrence.tenant_id != self.tenant_id:
            return self._rejected(delivery, "no such occurrence")
        not_now = self._not_claimable(delivery, message, occurrence, schedule, now)
        if not_now is not None:
            return not_now
        seen = occurrence.seen
        stale = _staleness(
            occurrence.schedule_version,
            None if schedule is None else (schedule.run_version, schedule.state),
        )
        if stale is not None:
            self._leave_queue(message, schedule)
            return self._refuse(message, seen, OccurrenceState.CANCELED, stale, Outcome.STALE, now)
        assert schedule is not None
        # The deadline runs from when the occurrence became receivable: a late fire that a
        # misfire policy released hours after its instant gets its whole deadline too.
        over = _exhausted(seen.attempt_count, schedule.retry, occurrence.available_at, now)
        if over is not None:
            refused = self._refuse(message, seen, OccurrenceState.DEAD, over, Outcome.DEAD, now)
            if refused is not None:
                self._dead_letter(delivery, message.occurrence_id, over)
            return refused
        slot = self._free_slot(now)
        if slot is None:
            return Result(Outcome.THROTTLED, "tenant concurrency limit reached", self._later())
        return self._claim_in(slot, delivery, message, occurrence, schedule, now)

    def _not_claimable(
        self,
        delivery: Delivery,
        message: Message,
        occurrence: StoredRun,
        schedule: ScheduleForRun | None,
        now: int,
    ) -> Result | None:
        """Why the occurrence, as read, is not to be claimed now: canceled, finished, running
        under another worker's live lease, or backing off; None when it may be."""
        seen = occurrence.seen
        if seen.state is OccurrenceState.CANCELED:
            # An update, pause or cancel got to it first (or our own refusal's delete was
            # lost): the message of a canceled occurrence is dropped, never run.
            self._leave_queue(message, schedule)
            return Result(Outcome.STALE, f"canceled: {occurrence.reason}")
        if seen.state in TERMINAL:
            if occurrence.dlq_pending:
                # DEAD, but the worker that decided it stopped before the DLQ copy.
                self._dead_letter(delivery, message.occurrence_id, occurrence.reason)
            return Result(Outcome.ALREADY_DONE, f"already {seen.state.value}")
        lease_end = occurrence.lease_expires_at
        if seen.state is OccurrenceState.RUNNING and lease_end > now:
            return Result(Outcome.IN_PROGRESS, "another worker holds the lease", lease_end - now)
        retry_at = occurrence.retry_at
        if seen.state is OccurrenceState.RETRY_WAIT and retry_at > now:
            # A duplicate delivery during the back-off: it waits like the original.
            return Result(Outcome.RETRY, "backing off", retry_at - now)
        return None

    def _claim_in(
        self,
        slot: int,
        delivery: Delivery,
        message: Message,
        occurrence: StoredRun,
        schedule: ScheduleForRun,
        now: int,
    ) -> Result | Claimed | None:
        """Claim the next attempt in concurrency ``slot``, then make sure the schedule did
        not change meanwhile: a refusal, the claim, or None when a race was lost."""
        seen = occurrence.seen
        queue_one = schedule.overlap is OverlapPolicy.QUEUE_ONE
        lease = self._new_lease(message, seen, schedule, slot, now)
        try:
            self.runs.claim(lease, seen=seen, now=now, queued_at=delivery.sent_at or now)
        except ConditionFailed as refused:
            return self._overlap_refusal(refused, message, seen, queue_one, now)
        except Retryable:
            return None
        if queue_one and not lease.queue_one:
            # A retry that had to wait (another ran meanwhile) gives the wait slot up now.
            self._leave_queue(message, schedule)
        return self._confirmed(lease, seen, occurrence, schedule.retry, now)

    def _new_lease(
        self, message: Message, seen: Seen, schedule: ScheduleForRun, slot: int, now: int
    ) -> RunLease:
        """The lease of the occurrence's next attempt, to claim in concurrency ``slot``."""
        return RunLease(
            occurrence_id=message.occurrence_id,
            tenant_id=self.tenant_id,
            schedule_id=message.schedule_id,
            attempt_no=seen.attempt_count + 1,
            token=secrets.token_urlsafe(16),
            expires_at=now + self.lease_seconds,
            concurrency_slot=slot,
            overlap=schedule.overlap is not OverlapPolicy.ALLOW,
            # QUEUE_ONE: a new occurrence must not jump ahead of one already waiting; the
            # take-over or retry of one that ran already is that occurrence's own run going
            # on, and no waiting one is ahead of it.
            queue_one=(
                schedule.overlap is OverlapPolicy.QUEUE_ONE
                and seen.state is OccurrenceState.SCHEDULED
            ),
            attempt_index=len(seen.attempts),
        )

    def _overlap_refusal(
        self, refused: ConditionFailed, message: Message, seen: Seen, queue_one: bool, now: int
    ) -> Result | None:
        """A claim the run slot refused (another occurrence of the schedule runs, or waits to):
        wait for it (QUEUE_ONE) or skip (SKIPPED_OVERLAP); None when the claim failed for
        another reason (the occurrence, the schedule or the slot moved: read again)."""
        holder = (refused.old_item or {}).get("occurrence_id", "another occurrence")
        if refused.label == Label.RUN_SLOT and queue_one:
            return self._wait(message, seen, holder, now)
        if refused.label == Label.RUN_SLOT:
            reason = f"{holder} of this schedule is running"
        elif refused.label == Label.WAIT_SLOT:
            # QUEUE_ONE: the run slot is free, but an earlier occurrence waits for it
            # (its next try takes it): this one would jump the queue.
            reason = f"{holder} of this schedule waits to run"
        else:
            return None
        return self._refuse(
            message, seen, OccurrenceState.SKIPPED_OVERLAP, reason, Outcome.SKIPPED_OVERLAP, now
        )

    def _confirmed(
        self, lease: RunLease, seen: Seen, occurrence: StoredRun, policy: RetryPolicy, now: int
    ) -> Result | Claimed:
        """The claim, once the schedule is read again and has not changed; else the claim
        undone (or left to run out) and why."""
        # The claim's transaction checks no schedule: read it again, strongly consistent.
        # Versions only grow, so one still current now was current at the claim, which is
        # then ordered before any change (whose answer reports the run); one changed since
        # the read above (an update, pause or cancel that committed in between) is undone.
        try:
            found = self.runs.schedule_version(lease.schedule_id, consistent=True)
        except Retryable:
            return self._unclaim(lease, seen)
        changed = _staleness(
            occurrence.schedule_version,
            None if found is None else (found[0], ScheduleState(found[1])),
        )
        if changed is not None:
            return self._withdraw(lease, changed, now)
        return Claimed(lease, policy, occurrence.available_at)

    def _unclaim(self, lease: RunLease, seen: Seen) -> Result:
        """The schedule could not be read after the claim (DynamoDB busy): whether it changed
        is not known, and the handler does not run on a guess. The claim is undone, so the
        attempt is not spent, and the message comes back soon. A takeover's claim (of an
        expired lease) cannot be put back: it keeps the lease, and the next delivery after
        it takes the run over (the claim recorded LOST)."""
        if seen.state is not OccurrenceState.RUNNING:
            try:
                self.runs.unclaim(lease, seen)
            except (ConditionFailed, Retryable):
                pass  # still claimed: the lease runs out, as for a takeover
            else:
                self.runs.release(lease)
                return Result(Outcome.IN_PROGRESS, "the schedule could not be read", self._later())
        return Result(
            Outcome.IN_PROGRESS,
            "the schedule could not be read after the claim; the lease runs out",
            self.lease_seconds,
        )

    def _withdraw(self, lease: RunLease, why: str, now: int) -> Result:
        """A claim whose schedule changed before its handler ran: undone, the message
        dropped (STALE), as a refusal before the claim would have. (No wait slot to give up:
        a QUEUE_ONE claim emptied the one this occurrence held, and one claimed as another
        policy never waited.)"""
        try:
            self.runs.withdraw(lease, reason=why, now=now)
        except (ConditionFailed, Retryable):
            # Not undone: the lease runs out, and the next delivery refuses the stale run.
            return Result(Outcome.IN_PROGRESS, "a stale claim not undone yet", self.lease_seconds)
        self.runs.release(lease)
        return Result(Outcome.STALE, why)

    def _wait(self, message: Message, seen: Seen, running: str, now: int) -> Result | None:
        """QUEUE_ONE and the run slot is held: wait for it if no other occurrence does."""
        try:
            waiting = self.runs.wait(
                self.tenant_id,
                message.schedule_id,
                message.occurrence_id,
                until=now + QUEUE_WAIT_SECONDS,
                now=now,
            )
        except Retryable:
            return None
        if waiting is None:
            reason = f"{running} of this schedule is running; this one runs next"
            return Result(Outcome.WAITING, reason, QUEUE_RETRY_SECONDS)
        reason = f"{running} of this schedule is running and {waiting} waits to run"
        return self._refuse(
            message, seen, OccurrenceState.SKIPPED_OVERLAP, reason, Outcome.SKIPPED_OVERLAP, now
        )

    def _leave_queue(self, message: Message, schedule: ScheduleForRun | None) -> None:
        """A QUEUE_ONE occurrence that will not run gives up the wait slot it may hold, so
        that the next one need not wait for the slot to expire."""
        if schedule is not None and schedule.overlap is OverlapPolicy.QUEUE_ONE:
            self.runs.stop_waiting(self.tenant_id, message.schedule_id, message.occurrence_id)

    def _refuse(
        self,
        message: Message,
        seen: Seen,
        state: OccurrenceState,
        reason: str,
        outcome: Outcome,
        now: int,
    ) -> Result | None:
        moved = self.runs.refuse(
            message.occurrence_id, seen=seen, state=state, reason=reason, now=now
        )
        return Result(outcome, reason) if moved else None

    def _run(
        self, delivery: Delivery, message: Message, lease: RunLease, policy: RetryPolicy, due: int
    ) -> Result:
        # The message must not come back to another worker while this lease is live.
        self._set_visibility(delivery, self.lease_seconds)
        job = Job(
            message=message,
            attempt=lease.attempt_no,
            _worker=self,
            _lease=lease,
            _delivery=delivery,
        )
        stop = self._heartbeats(job)
        error: BaseException | None = None
        try:
            self.handler(job)
        except Exception as raised:
            error = raised
        finally:
            stop()
        if job.lease_lost:
            # A heartbeat answered False: the run is no longer this worker's (its lease, or a
            # slot it held, passed to another run after the lease ran out), and the handler
            # was told to stop. Whatever it did is not recorded: the attempt ends LOST when
            # a later delivery takes the occurrence over and runs it again.
            self.runs.release(lease)
            return Result(Outcome.LEASE_LOST, f"attempt {lease.attempt_no} lost its lease")
        now = self._now()
        if error is None:
            return self._finish(
                delivery, lease, OccurrenceState.SUCCEEDED, AttemptOutcome.SUCCEEDED, now
            )
        text = f"{type(error).__name__}: {error}"
        if isinstance(error, self.permanent):
            return self._finish(
                delivery,
                lease,
                OccurrenceState.DEAD,
                AttemptOutcome.DEAD,
                now,
                f"permanent: {text}",
            )
        delay = int(self.rng.uniform(0, backoff_ceiling(policy, lease.attempt_no)))
        over = _exhausted(lease.attempt_no, policy, due, now + delay)
        if over is not None:
            return self._finish(
                delivery,
                lease,
                OccurrenceState.DEAD,
                AttemptOutcome.DEAD,
                now,
                f"{over}; last: {text}",
            )
        return self._finish(
            delivery,
            lease,
            OccurrenceState.RETRY_WAIT,
            AttemptOutcome.RETRY,
            now,
            text,
            retry_in=delay,
        )

    def _finish(
        self,
        delivery: Delivery,
        lease: RunLease,
        state: OccurrenceState,
        outcome: AttemptOutcome,
        now: int,
        error: str | None = None,
        retry_in: int | None = None,
    ) -> Result:
        for attempt in FINISH.attempts(self.services.sleep):
            try:
                self.runs.finish(
                    lease,
                    state=state,
                    outcome=outcome,
                    now=now,
                    error=error,
                    retry_at=None if retry_in is None else now + retry_in,
                )
                break
            except ConditionFailed:
                logger.warning(
                    "completion rejected: the lease was lost to another worker",
                    extra={"occurrence_id": lease.occurrence_id, "attempt": lease.attempt_no},
                )
                return Result(Outcome.LEASE_LOST, f"attempt {lease.attempt_no} lost its lease")
            except Retryable:
                # A transaction conflict or throttling, not a verdict: the lease is still
                # ours, so the same fenced completion is tried again.
                if attempt == FINISH.tries - 1:
                    raise
        self.runs.release(lease)
        if state is OccurrenceState.SUCCEEDED:
            return Result(Outcome.SUCCEEDED)
        if state is OccurrenceState.DEAD:
            self._dead_letter(delivery, lease.occurrence_id, error or "dead")
            return Result(Outcome.DEAD, error or "")
        return Result(Outcome.RETRY, error or "", retry_in)

    # --- leases and slots ---------------------------------------------------------------

    def extend(self, lease: RunLease, delivery: Delivery) -> bool:
        """The heartbeat: False when the lease is no longer ours."""
        try:
            self.runs.extend(lease, self._now() + self.lease_seconds)
        except ConditionFailed:
            return False
        except Retryable:
            return True  # throttled: the next beat tries again, the lease is still ours
        self._set_visibility(delivery, self.lease_seconds)
        return True

    def _heartbeats(self, job: Job) -> Callable[[], None]:
        if self.heartbeat_seconds is None:
            return lambda: None
        interval = self.heartbeat_seconds
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    if not job.heartbeat():
                        return
                except Exception:
                    # An SQS or DynamoDB hiccup: the lease is likely still ours; beat again.
                    logger.exception("heartbeat failed; trying again at the next beat")

        thread = threading.Thread(target=beat, name=f"heartbeat-{job.occurrence_id}", daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join()

        return halt

    def _free_slot(self, now: int) -> int | None:
        """A concurrency slot that looks free; the claim's condition has the last word."""
        limit = self._concurrency_limit()
        candidates = self.rng.sample(range(limit), min(limit, SLOT_PROBES))
        busy = self.runs.busy_slots(self.tenant_id, candidates, now)
        free = [slot for slot in candidates if slot not in busy]
        if not free and limit > len(candidates):
            every = list(range(limit))
            busy = self.runs.busy_slots(self.tenant_id, every, now)
            free = [slot for slot in every if slot not in busy]
        return self.rng.choice(free) if free else None

    def _concurrency_limit(self) -> int:
        now = self.services.now()
        if self._limit is None or now - self._limit[1] > TENANT_CACHE_SECONDS:
            try:
                quotas = self.services.tenants.get(self.tenant_id).quotas
            except NotFound:
                raise ValueError(f"tenant {self.tenant_id} does not exist") from None
            self._limit = (quotas.max_concurrency, now)
        return self._limit[0]

    def _later(self) -> int:
        return self.rng.randint(*THROTTLE_BACKOFF)

    # --- the queue ------------------------------------------------------------------------

    def _set_visibility(self, delivery: Delivery, seconds: int) -> None:
        self.services.sqs.change_message_visibility(
            QueueUrl=delivery.queue_url,
            ReceiptHandle=delivery.receipt_handle,
            VisibilityTimeout=max(0, min(seconds, MAX_VISIBILITY)),
        )

    def _rejected(self, delivery: Delivery, reason: str) -> Result:
        self._to_dlq(delivery, reason)
        return Result(Outcome.REJECTED, reason)

    def _to_dlq(self, delivery: Delivery, reason: str) -> None:
        self.services.sqs.send_message(
            QueueUrl=self._dlq_url(delivery.queue_url),
            MessageBody=delivery.body,
            MessageAttributes={"dead_reason": {"DataType": "String", "StringValue": reason[:256]}},
        )

    def _dead_letter(self, delivery: Delivery, occurrence_id: str, reason: str) -> None:
        """The DEAD occurrence's message into the DLQ, then the flag set with DEAD cleared."""
        self._to_dlq(delivery, reason)
        self.runs.dlq_sent(occurrence_id)

    def _dlq_url(self, queue_url: str) -> str:
        """The queue's own redrive target: the DLQ that receive-count redrive also uses."""
        if queue_url not in self._dlqs:
            attributes = self.services.sqs.get_queue_attributes(
                QueueUrl=queue_url, AttributeNames=["RedrivePolicy"]
            )["Attributes"]
            arn = json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"]
            self._dlqs[queue_url] = queue_url_of(self.services.sqs, arn)
        return self._dlqs[queue_url]


def queue_url_of(sqs: Any, arn: str) -> str:
    """arn:aws:sqs:region:account:name -> the queue URL."""
    *_, account, name = arn.split(":")
    return str(sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"])


def _staleness(version: int, schedule: tuple[int, ScheduleState] | None) -> str | None:
    """Why an occurrence of ``version`` must not run any more, given the schedule's current
    (run version, state), or None: a rename (a version that keeps the run version) does not
    make it stale."""
    if schedule is None:
        return "the schedule no longer exists"
    current, state = schedule
    if state is ScheduleState.CANCELED:
        return "the schedule was canceled"
    if current != version:
        return (
            f"stale: the schedule runs as version {current}, this occurrence is of version "
            f"{version}"
        )
    if state not in OWNS_FIRES:  # paused
        return f"the schedule is {state.value}"
    return None


def _exhausted(attempts: int, policy: RetryPolicy, released: int, start: int) -> str | None:
    """Why no further attempt may start at ``start``, or None (``released``: available_at)."""
    if attempts >= policy.max_attempts:
        return f"retries exhausted: {attempts} of {policy.max_attempts} attempts made"
    if start > released + policy.deadline_seconds:
        return (
            f"deadline passed: no attempt starts after available_at + {policy.deadline_seconds} s"
        )
    return None
