"""The run protocol's answers agree with what it records: a heartbeat that says the run is
no longer the worker's means nothing of that attempt is recorded (docs/worker.md,
*Heartbeats*), and QUEUE_ONE's wait slot holds back only a new occurrence, never the
take-over or retry of the one that ran (docs/worker.md, *Overlap*)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from punctual.domain.occurrence import AttemptOutcome, OccurrenceState
from punctual.domain.tenancy import Quotas
from punctual.services import Services
from punctual_client.worker import Job, Outcome
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.worker.helpers import (
    Calls,
    WorkerDied,
    by_occurrence,
    concurrency_slots,
    consumer,
    depth,
    due,
    receive,
    redeliver,
    run_slot,
    state,
    stored,
    three_due,
    two_due,
    wait_slot,
    worker,
)

S = OccurrenceState


def test_heartbeat_false_after_the_run_slot_passed_on_records_nothing_of_the_attempt(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a SKIP_IF_RUNNING schedule's first occurrence running; its handler's first chunk
    # outlasts the lease, and meanwhile the second occurrence takes the expired run slot
    _, [first, second, *_] = two_due(aws, clock, overlap="SKIP_IF_RUNNING")
    deliveries = by_occurrence(receive(aws))
    seen: dict[str, Any] = {}

    def long_chunks(job: Job) -> None:
        clock.advance(61)
        seen["second"] = worker(aws, Calls(), rng=random.Random(3)).process(deliveries[second])
        # WHEN the handler beats its heart after the chunk, and stops as told
        seen["beat"] = job.heartbeat()
        if not seen["beat"]:
            return

    result = worker(aws, long_chunks).process(deliveries[first])
    # THEN the beat said the run is no longer its own, and nothing of the attempt was
    # recorded: not SUCCEEDED, the message kept (not deleted), the attempt still open
    assert seen["second"].outcome is Outcome.SUCCEEDED
    assert seen["beat"] is False
    assert result.outcome is Outcome.LEASE_LOST
    assert not result.delete
    assert state(aws, first) is S.RUNNING
    assert [a.outcome for a in stored(aws, first)[1]] == [AttemptOutcome.RUNNING]


def test_heartbeat_false_after_the_concurrency_slot_passed_on_and_the_work_runs_again(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a tenant limited to one run at a time, and two due one-shots
    aws.tenants.set_quotas("alice", Quotas(max_concurrency=1))
    first, second = due(aws, clock, count=2)
    deliveries = by_occurrence(receive(aws))
    seen: dict[str, Any] = {}
    done: list[str] = []

    def long_chunks(job: Job) -> None:
        if job.occurrence_id == first and job.attempt == 1:
            clock.advance(61)
            # the other one takes the only (expired) concurrency slot, and runs
            seen["second"] = worker(aws, Calls(), rng=random.Random(5)).process(deliveries[second])
            if not job.heartbeat():
                return  # as docs/worker.md says: stop, the work is not done
        done.append(job.occurrence_id)

    # WHEN the first's handler stops on its beat's False
    result = worker(aws, long_chunks).process(deliveries[first])
    # THEN the attempt is not recorded SUCCEEDED (its work was not done) ...
    assert seen["second"].outcome is Outcome.SUCCEEDED
    assert result.outcome is Outcome.LEASE_LOST
    assert state(aws, first) is S.RUNNING
    # ... AND the next delivery, after its lease ran out, takes it over and does the work
    clock.advance(61)
    again = worker(aws, long_chunks).process(redeliver(aws, deliveries[first]))
    assert again.outcome is Outcome.SUCCEEDED
    assert done == [first]
    assert [(a.attempt_no, a.outcome) for a in stored(aws, first)[1]] == [
        (1, AttemptOutcome.LOST),
        (2, AttemptOutcome.SUCCEEDED),
    ]


def test_queue_one_takeover_of_the_running_one_is_not_refused_by_the_waiting_one(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a QUEUE_ONE schedule: the first occurrence runs under a 30 s lease, the second
    # waits (its wait held 60 s); the first's worker dies
    sid, [first, second, _], deliveries = three_due(aws, clock)

    def dies(job: Job) -> None:
        assert worker(aws, Calls()).process(deliveries[second]).outcome is Outcome.WAITING
        raise WorkerDied

    with pytest.raises(WorkerDied):
        worker(aws, dies, lease_seconds=30).process(deliveries[first])
    # WHEN the first's message comes back after its lease ran out, before the second's
    # next try (the second still holds the wait slot)
    clock.advance(31)
    assert wait_slot(aws, sid) is not None
    handler = Calls()
    result = worker(aws, handler).process(redeliver(aws, deliveries[first]))
    # THEN the first is taken over and runs (nothing overlapped: it was the one running),
    # and the second still waits for its turn
    assert result.outcome is Outcome.SUCCEEDED
    assert [job.occurrence_id for job in handler.jobs] == [first]
    assert state(aws, first) is S.SUCCEEDED
    assert state(aws, second) is S.SCHEDULED
    later = worker(aws, handler).process(redeliver(aws, deliveries[second]))
    assert later.outcome is Outcome.SUCCEEDED


def test_queue_one_retry_of_the_one_that_ran_is_not_refused_by_the_waiting_one(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a QUEUE_ONE schedule: the first occurrence runs while the second waits, and
    # the first fails transiently (a back-off shorter than the second's next try)
    sid, [first, second, _], deliveries = three_due(aws, clock)

    def fails_once(job: Job) -> None:
        if job.occurrence_id == first and job.attempt == 1:
            assert worker(aws, Calls()).process(deliveries[second]).outcome is Outcome.WAITING
            raise RuntimeError("transient")

    retried = worker(aws, fails_once, rng=random.Random(1)).process(deliveries[first])
    assert retried.outcome is Outcome.RETRY
    # WHEN the first's message comes back after its back-off, before the second's next try
    clock.advance(retried.visible_in or 0)
    result = worker(aws, fails_once).process(redeliver(aws, deliveries[first]))
    # THEN the retry runs (it is the same occurrence's run going on), not SKIPPED_OVERLAP
    assert result.outcome is Outcome.SUCCEEDED
    assert state(aws, first) is S.SUCCEEDED
    # AND the second, still waiting, runs at its next try
    assert wait_slot(aws, sid) is not None
    assert worker(aws, Calls()).process(redeliver(aws, deliveries[second])).outcome is (
        Outcome.SUCCEEDED
    )


def test_queue_one_retry_that_had_to_wait_gives_the_wait_slot_up_when_it_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a QUEUE_ONE schedule whose first occurrence failed transiently, and whose second
    # then ran; the first's retry came while the second ran, and waited
    sid, [first, second, third], deliveries = three_due(aws, clock)

    def first_fails(job: Job) -> None:
        if job.occurrence_id == first and job.attempt == 1:
            raise RuntimeError("transient")

    retried = worker(aws, first_fails, rng=random.Random(1)).process(deliveries[first])
    assert retried.outcome is Outcome.RETRY
    clock.advance(retried.visible_in or 0)
    seen: dict[str, Any] = {}

    def second_runs(job: Job) -> None:
        seen["first"] = worker(aws, first_fails).process(redeliver(aws, deliveries[first]))

    assert worker(aws, second_runs).process(deliveries[second]).outcome is Outcome.SUCCEEDED
    assert seen["first"].outcome is Outcome.WAITING
    # WHEN the first's retry comes back and runs
    result = worker(aws, first_fails).process(redeliver(aws, deliveries[first]))
    # THEN it ran, and no longer holds the wait slot: the third may wait (or run) now
    assert result.outcome is Outcome.SUCCEEDED
    assert wait_slot(aws, sid) is None
    assert worker(aws, Calls()).process(deliveries[third]).outcome is Outcome.SUCCEEDED


def test_consumer_one_delivery_that_raises_costs_the_others_of_the_batch_nothing(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN two due occurrences received in one batch, and DynamoDB failing (past the
    # SDK's retries) whenever the first one's item is read
    first, second = due(aws, clock, count=2)
    work = worker(aws, Calls())
    real = work.runs.read

    def read(occurrence_id: str, schedule_id: str) -> Any:
        if occurrence_id == first:
            raise RuntimeError("DynamoDB unreachable")
        return real(occurrence_id, schedule_id)

    monkeypatch.setattr(work.runs, "read", read)
    # WHEN the consumer polls once
    results = consumer(work).poll_once()
    # THEN the second ran and its message was deleted; the first is kept (it comes back),
    # counted as failed, not a failure of the poll
    assert sorted(r.outcome for r in results) == sorted([Outcome.SUCCEEDED, Outcome.FAILED])
    assert state(aws, second) is S.SUCCEEDED
    assert state(aws, first) is S.SCHEDULED
    assert depth(aws) == 1


def test_takeover_whose_claim_meets_the_holders_heartbeat_is_refused_and_never_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A running an occurrence, stalled past its 60 s lease, and worker B given
    # the message again: B reads the occurrence RUNNING under a lease that has run out
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    b_handler = Calls()
    seen: dict[str, Any] = {}

    def stall(job: Job) -> None:
        clock.advance(61)
        faults = Faults(FaultPlan.none(), clock)

        def heartbeat_first(_: str, __: dict[str, Any]) -> None:
            if "beat" not in seen:
                seen["beat"] = job.heartbeat()

        faults.before["transact_write_items"] = heartbeat_first
        b = worker(
            dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults)),
            b_handler,
            rng=random.Random(8),
        )
        # WHEN A's heartbeat lands between B's read and B's claim
        seen["b"] = b.process(redeliver(aws, delivery))
        seen["during"] = stored(aws, occ)

    result = worker(aws, stall).process(delivery)
    # THEN B's claim is refused (the lease it read as run out is live again): B reads again,
    # finds the lease held and leaves the message for later; its handler never ran, and the
    # occurrence is still A's first attempt
    assert seen["beat"] is True
    assert (seen["b"].outcome, seen["b"].detail) == (
        Outcome.IN_PROGRESS,
        "another worker holds the lease",
    )
    assert b_handler.count == 0
    occurrence, attempts = seen["during"]
    assert (occurrence.state, occurrence.attempt_count) == (S.RUNNING, 1)
    assert [a.outcome for a in attempts] == [AttemptOutcome.RUNNING]
    # AND A, its lease extended, completes the occurrence: one attempt, SUCCEEDED
    assert result.outcome is Outcome.SUCCEEDED
    assert [a.outcome for a in stored(aws, occ)[1]] == [AttemptOutcome.SUCCEEDED]


def test_claim_that_lost_a_race_on_a_duplicate_delivery_writes_no_slot(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a SKIP_IF_RUNNING schedule's first two occurrences due, the first delivered
    # twice (a duplicate delivery): worker L read it (SCHEDULED) before worker W claimed it
    sid, [first, second, *_] = two_due(aws, clock, overlap="SKIP_IF_RUNNING")
    deliveries = by_occurrence(receive(aws))
    l_handler = Calls()
    loser = worker(aws, l_handler, rng=random.Random(3))
    read_before = loser.runs.read(first, sid)
    real_read = loser.runs.read
    reads: list[str] = []

    def read_once_before(occurrence_id: str, schedule_id: str) -> Any:
        reads.append(occurrence_id)
        return read_before if len(reads) == 1 else real_read(occurrence_id, schedule_id)

    loser.runs.read = read_once_before  # type: ignore[method-assign]
    seen: dict[str, Any] = {}

    def winner_runs(job: Job) -> None:
        # WHEN L's claim, from what it read, comes while W runs the occurrence
        seen["loser"] = loser.process(deliveries[first])
        seen["run_slot"] = run_slot(aws, sid)
        seen["held"] = [s for s in concurrency_slots(aws) if "lease_token" in s]
        seen["token"] = job._lease.token
        # (and W beats its heart after it)
        seen["beat"] = job.heartbeat()

    result = worker(aws, winner_runs).process(deliveries[first])
    # THEN L's claim was refused and wrote nothing: the run slot and the one concurrency
    # slot held are W's; L read again, found W's lease and left the message, never running
    assert (seen["loser"].outcome, seen["loser"].detail) == (
        Outcome.IN_PROGRESS,
        "another worker holds the lease",
    )
    assert l_handler.count == 0
    assert (seen["run_slot"]["occurrence_id"], seen["run_slot"]["lease_token"]) == (
        first,
        seen["token"],
    )
    assert [(s["occurrence_id"], s["lease_token"]) for s in seen["held"]] == [
        (first, seen["token"])
    ]
    # AND W's heartbeat held, W completed it, and its slots were freed: the schedule's next
    # occurrence runs (not SKIPPED_OVERLAP behind a slot the refused claim left held)
    assert seen["beat"] is True
    assert result.outcome is Outcome.SUCCEEDED
    assert [a.outcome for a in stored(aws, first)[1]] == [AttemptOutcome.SUCCEEDED]
    next_handler = Calls()
    assert worker(aws, next_handler).process(deliveries[second]).outcome is Outcome.SUCCEEDED
    assert [job.occurrence_id for job in next_handler.jobs] == [second]
    assert state(aws, second) is S.SUCCEEDED
