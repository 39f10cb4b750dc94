"""Overlap control with SKIP_IF_RUNNING in the worker SDK, on moto with the injected clock
(DynamoDB Local for the race). A second occurrence is skipped while the first runs, runs once
the first has completed, and takes over the slot of an expired lease. An abandoned run whose
slot was taken is skipped, as a move of the state machine, and two workers racing never run
two occurrences at once."""

from __future__ import annotations

import random
from typing import Any

import pytest

from punctual.domain.occurrence import can_transition
from punctual.services import Services
from punctual_client.worker import Job, Outcome, Result
from tests.integration.conftest import ALICE, Api, Clock, bootstrap
from tests.integration.worker.helpers import (
    RACE_ROUNDS,
    Calls,
    S,
    WorkerDied,
    by_occurrence,
    race,
    rate_schedule,
    receive,
    receive_all,
    redeliver,
    relay,
    run_slot,
    state,
    stored,
    two_due,
    worker,
)

# --- overlap control (SKIP_IF_RUNNING) --------------------------------------------------------


def test_worker_skip_if_running_second_occurrence_is_skipped_while_the_first_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two due occurrences of a SKIP_IF_RUNNING schedule
    sid, [first, second, *_] = two_due(aws, clock, overlap="SKIP_IF_RUNNING")
    deliveries = by_occurrence(receive(aws))
    other = Calls()
    seen: dict[str, Any] = {}

    def running(job: Job) -> None:
        # WHEN the second is delivered while the first runs
        seen["second"] = worker(aws, other, rng=random.Random(3)).process(deliveries[second])
        seen["state"] = state(aws, job.occurrence_id)

    result = worker(aws, running).process(deliveries[first])
    # THEN the first was RUNNING and SUCCEEDED; the second is SKIPPED_OVERLAP without a
    # run, with a reason naming the first, and its message is to be deleted
    assert seen["state"] is S.RUNNING
    assert result.outcome is Outcome.SUCCEEDED
    assert seen["second"].outcome is Outcome.SKIPPED_OVERLAP
    assert seen["second"].delete
    assert other.count == 0
    skipped, attempts = stored(aws, second)
    assert (skipped.state, attempts) == (S.SKIPPED_OVERLAP, [])
    assert skipped.reason == seen["second"].detail == f"{first} of this schedule is running"
    assert state(aws, first) is S.SUCCEEDED
    # AND the run slot was released on completion
    assert "lease_token" not in run_slot(aws, sid)


def test_worker_skip_if_running_after_the_first_completes_the_next_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a SKIP_IF_RUNNING schedule whose first occurrence ran to completion
    _, [first, second, *_] = two_due(aws, clock, overlap="SKIP_IF_RUNNING")
    deliveries = by_occurrence(receive(aws))
    handler = Calls()
    assert worker(aws, handler).process(deliveries[first]).outcome is Outcome.SUCCEEDED
    # WHEN the next occurrence is delivered
    result = worker(aws, handler).process(deliveries[second])
    # THEN the slot was free again: it runs
    assert result.outcome is Outcome.SUCCEEDED
    assert [job.occurrence_id for job in handler.jobs] == [first, second]


def test_worker_skip_if_running_slot_of_an_expired_lease_is_taken_over(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the first occurrence's worker died holding the run slot
    sid, [first, second, *_] = two_due(aws, clock, overlap="SKIP_IF_RUNNING")
    deliveries = by_occurrence(receive(aws))

    def die(job: Job) -> None:
        raise WorkerDied

    with pytest.raises(WorkerDied):
        worker(aws, die).process(deliveries[first])
    assert run_slot(aws, sid)["occurrence_id"] == first
    # WHEN the second is delivered after that lease expired
    clock.advance(61)
    handler = Calls()
    result = worker(aws, handler).process(deliveries[second])
    # THEN it takes the slot over and runs
    assert result.outcome is Outcome.SUCCEEDED
    assert handler.count == 1


def _abandoned_first_while_second_runs(aws: Services, clock: Clock) -> tuple[str, Result]:
    """SKIP_IF_RUNNING: the first occurrence's worker died; after its lease expired the
    second took the run slot, and while it runs the first's message comes back."""
    _, [first, second, *_] = two_due(aws, clock, overlap="SKIP_IF_RUNNING")
    deliveries = by_occurrence(receive(aws))

    def die(job: Job) -> None:
        raise WorkerDied

    with pytest.raises(WorkerDied):
        worker(aws, die).process(deliveries[first])
    clock.advance(61)
    seen: dict[str, Any] = {}

    def running(job: Job) -> None:
        again = redeliver(aws, deliveries[first])
        try:
            seen["first"] = worker(aws, Calls(), rng=random.Random(3)).process(again)
        except Exception as error:
            seen["error"] = error

    assert worker(aws, running).process(deliveries[second]).outcome is Outcome.SUCCEEDED
    if "error" in seen:
        raise seen["error"]
    return first, seen["first"]


def test_worker_abandoned_run_whose_slot_was_taken_is_skipped(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN / WHEN the abandoned first occurrence comes back while the second runs
    first, result = _abandoned_first_while_second_runs(aws, clock)
    # THEN it is skipped: the slot belongs to the running second occurrence
    assert result.outcome is Outcome.SKIPPED_OVERLAP
    assert state(aws, first) is S.SKIPPED_OVERLAP


def test_worker_skipping_an_abandoned_run_is_a_move_of_the_state_machine(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN / WHEN the abandoned first occurrence comes back while the second runs
    first, _ = _abandoned_first_while_second_runs(aws, clock)
    # THEN whatever it becomes is a move the state machine allows from RUNNING
    final = state(aws, first)
    assert can_transition(S.RUNNING, final), f"RUNNING -> {final.value}"


def test_worker_skip_if_running_race_never_runs_two_at_once(local_aws: Services, clock: Clock):
    # GIVEN DynamoDB Local (real transaction isolation), SKIP_IF_RUNNING schedules and, for
    # each round, two due occurrences of one of them
    aws = local_aws
    bootstrap("alice", ALICE)
    schedules = [
        rate_schedule(aws, "rate(1 minute)", overlap="SKIP_IF_RUNNING")
        for _ in range(RACE_ROUNDS // 2)
    ]
    clock.advance(180)  # the first four occurrences of each are due
    relay(aws, *[occ for _, occurrences in schedules for occ in occurrences[:4]])
    deliveries = receive_all(aws)
    rounds = [(o[i], o[i + 1]) for _, o in schedules for i in (0, 2)]
    for first, second in rounds:
        # WHEN two workers claim them at the same moment
        results, ran, most = race(aws, deliveries[first], deliveries[second])
        # THEN never two handlers at once: exactly one ran and SUCCEEDED, the other was
        # SKIPPED_OVERLAP; the slot was released for the schedule's next round
        assert most == 1, (first, results)
        assert len(ran) == 1, (first, results)
        assert sorted(r.outcome for r in results) == sorted(
            [Outcome.SUCCEEDED, Outcome.SKIPPED_OVERLAP]
        ), (first, results)
        assert sorted([state(aws, first), state(aws, second)]) == sorted(
            [S.SUCCEEDED, S.SKIPPED_OVERLAP]
        )
