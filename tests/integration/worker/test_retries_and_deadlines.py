"""Retries, back-off, deadlines and permanent errors in the worker SDK, on moto with the
injected clock. Transient failures back off within full-jitter bounds until the occurrence is
dead in the DLQ, a refused retry keeps its attempt history, and a duplicate delivery waits
out the rest of the back-off. The deadline counts from a late fire's release, kills an
occurrence whose deadline passed before the claim, and stops a retry that would start after
it. A permanent error is dead at once, a long error is cut to its first thousand characters,
and a DLQ copy that was never made is made by the redelivery."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.domain.ids import occurrence_id, shard_of
from punctual.domain.occurrence import AttemptOutcome
from punctual.domain.policies import RetryPolicy
from punctual.domain.schedule import ScheduleDefinition
from punctual.pipeline.materializer import Materializer
from punctual.services import Services
from punctual_client.worker import (
    Delivery,
    Job,
    Message,
    Outcome,
    PermanentError,
    Result,
    backoff_ceiling,
)
from tests.integration.conftest import Api, Clock
from tests.integration.worker.helpers import (
    DLQ,
    Calls,
    Flaky,
    S,
    SpySQS,
    WorkerDied,
    abandoned,
    consumer,
    dead_letters,
    depth,
    due,
    fail_transiently,
    make_visible,
    outcomes,
    receive,
    redeliver,
    relay,
    state,
    stored,
    with_sqs,
    worker,
)

# --- retries, back-off, deadline and permanent errors ------------------------------------------


def test_worker_backoff_ceiling_doubles_from_the_base_up_to_the_max():
    # GIVEN a policy with base 10 s and max 25 s; THEN the full-jitter bound of attempt n
    # is min(max, base * 2^(n-1))
    policy = RetryPolicy(max_attempts=6, backoff_base_seconds=10, backoff_max_seconds=25)
    assert [backoff_ceiling(policy, n) for n in range(1, 6)] == [10, 20, 25, 25, 25]
    default = RetryPolicy()
    assert [backoff_ceiling(default, n) for n in (1, 2, 7, 8)] == [10, 20, 640, 900]


def test_worker_refusing_a_backed_off_occurrence_keeps_its_attempts_history(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose first attempt failed transiently (RETRY_WAIT), and its
    # schedule paused during the back-off
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    assert worker(aws, Calls(fail_transiently)).process(delivery).outcome is Outcome.RETRY
    ControlPlane(aws).pause("alice", stored(aws, occ)[0].schedule_id)
    # WHEN its message comes back after the back-off
    clock.advance(3600)
    result = worker(aws, Calls()).process(redeliver(aws, delivery))
    # THEN it is refused as stale, and its one attempt stays what it was (no LOST: no lease
    # was abandoned)
    assert result.outcome is Outcome.STALE
    assert outcomes(aws, occ) == [AttemptOutcome.RETRY]


def test_worker_transient_failures_back_off_within_full_jitter_bounds_then_dead_in_dlq(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a handler that always fails transiently, a 4-attempt policy (base 10 s, max
    # 25 s), and workers with seeded random generators
    retry = {"max_attempts": 4, "backoff_base_seconds": 10, "backoff_max_seconds": 25}
    policy = RetryPolicy.model_validate(retry)
    delays: list[int] = []
    for seed in range(5):
        [occ] = due(aws, clock, retry=retry)
        spy = SpySQS(aws.sqs)
        handler = Calls(fail_transiently)
        seen: list[tuple[Delivery, Result]] = []
        feed = consumer(worker(with_sqs(aws, spy), handler, rng=random.Random(seed)), seen)
        # WHEN it is delivered until the attempts run out
        for attempt in (1, 2, 3):
            [result] = feed.poll_once()
            delivery = seen[-1][0]
            # THEN each failure is RETRY_WAIT, visible again after a delay in
            # [0, min(max, base * 2^(attempt-1))], the value given to ChangeMessageVisibility
            assert result.outcome is Outcome.RETRY, (seed, attempt)
            assert result.detail == "Flaky: try later"
            assert result.visible_in is not None
            assert 0 <= result.visible_in <= backoff_ceiling(policy, attempt)
            assert spy.last_visibility(delivery.receipt_handle) == result.visible_in
            occurrence, attempts = stored(aws, occ)
            assert occurrence.state is S.RETRY_WAIT
            assert attempts[-1].outcome is AttemptOutcome.RETRY
            assert "Flaky: try later" in (attempts[-1].error or "")
            delays.append(result.visible_in)
            clock.advance(result.visible_in)
            make_visible(aws, delivery)
        [last] = feed.poll_once()
        # AND the 4th failure is DEAD: its message is in the DLQ with a dead_reason, and
        # deleted from the queue
        assert last.outcome is Outcome.DEAD
        assert [job.attempt for job in handler.jobs] == [1, 2, 3, 4]
        occurrence, attempts = stored(aws, occ)
        assert occurrence.state is S.DEAD
        assert [a.outcome for a in attempts] == [AttemptOutcome.RETRY] * 3 + [AttemptOutcome.DEAD]
        assert attempts[-1].finished_at == int(clock.now)
        [(body, reason)] = dead_letters(aws)
        assert json.loads(body)["occurrence_id"] == occ
        assert reason is not None
        assert "retries exhausted" in reason
        assert last.detail == reason
        assert last.detail.endswith("; last: Flaky: try later")
        assert depth(aws) == 0
    # AND the delays are jittered, not a fixed schedule
    assert len(set(delays)) > 3


def test_worker_duplicate_delivery_during_the_back_off_waits_out_the_rest_of_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a transient failure backing off (seeded) more than 10 s, its message hidden as long
    retry = {"max_attempts": 3, "backoff_base_seconds": 60, "backoff_max_seconds": 60}
    [occ] = due(aws, clock, retry=retry)
    [delivery] = receive(aws)
    first = worker(aws, Calls(fail_transiently), rng=random.Random(3)).process(delivery)
    assert first.outcome is Outcome.RETRY
    assert first.visible_in is not None
    assert first.visible_in > 10
    before = stored(aws, occ)[0]
    clock.advance(10)
    handler = Calls()
    # WHEN a duplicate of the message arrives 10 s into the back-off
    result = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN it does not run: it waits, hidden for the rest of the back-off, like the original
    assert (result.outcome, result.visible_in) == (Outcome.RETRY, first.visible_in - 10)
    assert result.detail == "backing off"
    assert handler.count == 0
    assert stored(aws, occ)[0] == before  # nothing written
    assert outcomes(aws, occ) == [AttemptOutcome.RETRY]


def test_worker_deadline_passed_before_the_claim_is_dead_without_running(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose deadline (scheduled_for + 60 s) passed before a worker got it
    [occ] = due(aws, clock, retry={"deadline_seconds": 60})
    clock.advance(61)
    handler = Calls()
    # WHEN it is delivered
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN it is DEAD without an attempt, the handler never ran, and it is in the DLQ
    assert result.outcome is Outcome.DEAD
    assert handler.count == 0
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.attempt_count, attempts) == (S.DEAD, 0, [])
    assert "deadline passed" in (occurrence.reason or "")
    [(_, reason)] = dead_letters(aws)
    assert "deadline passed" in (reason or "")
    assert depth(aws) == 0


def test_worker_deadline_of_a_late_fire_runs_from_its_release_not_its_instant(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a daily FIRE_ONCE schedule with a 1 h retry deadline, and a materializer that
    # was down from before midnight to 02:00: the missed midnight fire (2 h old, past its
    # instant + deadline) is released now
    midnight = 1_795_046_400  # 2026-11-19T00:00:00Z
    clock.now = midnight - 3600
    definition = ScheduleDefinition.model_validate(
        {
            "target": "default",
            "spec": {"kind": "cron", "expression": "0 0 * * *", "timezone": "UTC"},
            "misfire": {"action": "FIRE_ONCE", "max_lateness_seconds": 300},
            "retry": {"deadline_seconds": 3600},
        }
    )
    sid = ControlPlane(aws).create("alice", definition).schedule.schedule_id
    shard = shard_of(sid, aws.settings.shard_count)
    Materializer(aws, "m").run_shard(int(clock.now), shard)  # the last tick before the outage
    clock.now = midnight + 2 * 3600
    Materializer(aws, "m").run_shard(int(clock.now), shard)
    released = occurrence_id(sid, 1, midnight)
    occurrence, _ = stored(aws, released)
    assert occurrence.available_at == int(clock.now)
    relay(aws, released)
    handler = Calls()
    # WHEN a worker receives it
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN it runs: its deadline counts from when it became receivable
    assert result.outcome is Outcome.SUCCEEDED
    assert handler.count == 1


def test_worker_failure_whose_retry_would_start_after_the_deadline_is_dead(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a 60 s deadline and a handler that fails transiently after running 61 s
    [occ] = due(aws, clock, retry={"deadline_seconds": 60})

    def slow_then_fail(job: Job) -> None:
        clock.advance(61)
        raise Flaky("timeout")

    # WHEN it fails on attempt 1 of 3
    [result] = consumer(worker(aws, slow_then_fail, lease_seconds=300)).poll_once()
    # THEN no retry is scheduled past the deadline: DEAD, in the DLQ
    assert result.outcome is Outcome.DEAD
    assert outcomes(aws, occ) == [AttemptOutcome.DEAD]
    [(_, reason)] = dead_letters(aws)
    assert "deadline passed" in (reason or "")
    assert "Flaky: timeout" in (reason or "")


class InvoiceMissing(PermanentError):
    pass


def _invoice_missing(job: Job) -> None:
    raise InvoiceMissing("no invoice")


def _invalid_payload(job: Job) -> None:
    Message.model_validate(job.payload)  # a pydantic ValidationError: permanent too


@pytest.mark.parametrize(
    ("handler_error", "reason"),
    [
        (_invoice_missing, "InvoiceMissing"),
        (_invalid_payload, "ValidationError"),
    ],
    ids=["PermanentError", "ValidationError"],
)
def test_worker_permanent_error_is_dead_at_once_and_in_the_dlq(
    alice: Api,
    aws: Services,
    clock: Clock,
    handler_error: Callable[[Job], None],
    reason: str,
):
    # GIVEN a handler raising a permanent error, with 3 attempts allowed
    [occ] = due(aws, clock)
    handler = Calls(handler_error)
    # WHEN it is delivered
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN attempt 1 is the last: DEAD, into the DLQ with the reason, deleted from the queue
    assert result.outcome is Outcome.DEAD
    assert handler.count == 1
    occurrence, attempts = stored(aws, occ)
    assert occurrence.state is S.DEAD
    assert [(a.attempt_no, a.outcome) for a in attempts] == [(1, AttemptOutcome.DEAD)]
    assert attempts[0].finished_at == int(clock.now)
    assert f"permanent: {reason}" in (occurrence.reason or "")
    assert result.detail.startswith(f"permanent: {reason}")
    [(body, dead_reason)] = dead_letters(aws)
    assert json.loads(body)["occurrence_id"] == occ
    assert f"permanent: {reason}" in (dead_reason or "")
    assert depth(aws) == 0


class DiesAtTheDlq(SpySQS):
    """The worker process dies as it is about to copy a message into the DLQ."""

    def send_message(self, **kwargs: Any) -> Any:
        raise WorkerDied


def test_worker_keeps_the_first_thousand_characters_of_a_long_error(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a handler failing permanently with a very long message
    [occ] = due(aws, clock)
    [delivery] = receive(aws)

    def verbose(job: Job) -> None:
        raise PermanentError("e" * 5000)

    # WHEN it runs
    assert worker(aws, verbose).process(delivery).outcome is Outcome.DEAD
    # THEN the occurrence's reason and the attempt's error keep the first 1,000 characters
    occurrence, [attempt] = stored(aws, occ)
    expected = ("permanent: PermanentError: " + "e" * 5000)[:1000]
    assert occurrence.reason == attempt.error == expected


def test_worker_dead_whose_dlq_copy_was_never_made_is_copied_by_the_redelivery(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a permanent failure whose worker recorded DEAD, then died before the DLQ copy
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    with pytest.raises(WorkerDied):
        worker(with_sqs(aws, DiesAtTheDlq(aws.sqs)), Calls(_invoice_missing)).process(delivery)
    assert state(aws, occ) is S.DEAD
    assert dead_letters(aws) == []
    handler = Calls()
    # WHEN the message comes back
    result = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN the handler does not run again, and the DLQ gets its copy, once
    assert result.outcome is Outcome.ALREADY_DONE
    assert handler.count == 0
    [(body, reason)] = dead_letters(aws)
    assert json.loads(body)["occurrence_id"] == occ
    assert "permanent" in (reason or "")
    # AND a further redelivery copies nothing more
    worker(aws, handler).process(redeliver(aws, delivery))
    assert dead_letters(aws) == []  # (the DLQ's one message is in flight after the receive)
    assert depth(aws, DLQ) == 1


def test_worker_dead_by_refusal_whose_dlq_copy_was_never_made_is_copied_by_the_redelivery(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-attempt occurrence whose worker died mid-run; after its lease expired the
    # next worker refused it as DEAD (attempts exhausted), then died before the DLQ copy
    occ, delivery = abandoned(aws, clock, retry={"max_attempts": 1})
    clock.advance(61)
    again = redeliver(aws, delivery)
    with pytest.raises(WorkerDied):
        worker(with_sqs(aws, DiesAtTheDlq(aws.sqs)), Calls()).process(again)
    assert state(aws, occ) is S.DEAD
    assert dead_letters(aws) == []
    # WHEN the message comes back once more
    result = worker(aws, Calls()).process(redeliver(aws, again))
    # THEN the DLQ gets its copy (the refusal left the DEAD occurrence flagged for it)
    assert result.outcome is Outcome.ALREADY_DONE
    [(body, _)] = dead_letters(aws)
    assert json.loads(body)["occurrence_id"] == occ
