"""Overlap control with QUEUE_ONE in the worker SDK, on moto with the injected clock (DynamoDB
Local for the race). The next occurrence waits for the running one and a third is skipped, a
later occurrence does not jump the one waiting, and a new claim frees the wait slot in its
own transaction only. A wait holds its place until it runs out and is freed when the waiting
occurrence goes stale, and of several workers racing exactly one waits."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.services import Services
from punctual_client.worker import Job, Outcome
from tests.integration.conftest import ALICE, Api, Clock, bootstrap
from tests.integration.helpers import set_occurrence_state
from tests.integration.worker.helpers import (
    RACE_ROUNDS,
    Calls,
    S,
    race,
    rate_schedule,
    receive_all,
    redeliver,
    relay,
    run_slot,
    state,
    stored,
    three_due,
    wait_slot,
    worker,
)


def occurrence_item(aws: Services, occurrence_id: str) -> dict[str, Any]:
    """The occurrence's stored item, as operators read it in the table."""
    raw = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occurrence_id)),
        ConsistentRead=True,
    )["Item"]
    return from_dynamo(raw)


# --- overlap control (QUEUE_ONE) -------------------------------------------------------------


def test_worker_queue_one_the_next_waits_for_the_running_one_and_a_third_is_skipped(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three due occurrences of a QUEUE_ONE schedule, the first one running
    sid, [first, second, third], deliveries = three_due(aws, clock)
    others = Calls()
    seen: dict[str, Any] = {}

    def running(job: Job) -> None:
        # WHEN the second, then the third, are delivered while the first runs
        seen["second"] = worker(aws, others).process(deliveries[second])
        seen["third"] = worker(aws, others).process(deliveries[third])
        seen["waiting"] = wait_slot(aws, sid)

    assert worker(aws, running).process(deliveries[first]).outcome is Outcome.SUCCEEDED
    # THEN the second waits: not run, its message kept and visible again in a few seconds,
    # the occurrence still SCHEDULED, the wait slot its own
    waited = seen["second"]
    assert (waited.outcome, waited.delete, waited.visible_in) == (Outcome.WAITING, False, 5)
    assert waited.detail == f"{first} of this schedule is running; this one runs next"
    assert seen["waiting"]["occurrence_id"] == second
    assert state(aws, second) is S.SCHEDULED
    # AND the third, finding one waiting already, is SKIPPED_OVERLAP naming both
    skipped = seen["third"]
    assert (skipped.outcome, skipped.delete) == (Outcome.SKIPPED_OVERLAP, True)
    reason = f"{first} of this schedule is running and {second} waits to run"
    assert skipped.detail == stored(aws, third)[0].reason == reason
    assert state(aws, third) is S.SKIPPED_OVERLAP
    assert occurrence_item(aws, third)["finished_at"] == int(clock.now)  # when it was settled
    assert others.count == 0
    # WHEN the second's message comes back after the first finished
    result = worker(aws, others).process(redeliver(aws, deliveries[second]))
    # THEN it runs, and gives up the wait slot as it takes the run slot
    assert result.outcome is Outcome.SUCCEEDED
    assert [job.occurrence_id for job in others.jobs] == [second]
    assert wait_slot(aws, sid) is None
    assert "lease_token" not in run_slot(aws, sid)


def test_worker_queue_one_a_later_occurrence_does_not_jump_the_one_waiting(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a QUEUE_ONE schedule whose second occurrence waited while the first ran
    _, [first, second, third], deliveries = three_due(aws, clock)
    handler = Calls()

    def running(job: Job) -> None:
        assert worker(aws, handler).process(deliveries[second]).outcome is Outcome.WAITING

    assert worker(aws, running).process(deliveries[first]).outcome is Outcome.SUCCEEDED
    # WHEN the third is delivered after the first finished, before the second's next try
    result = worker(aws, handler).process(deliveries[third])
    # THEN the run slot is free, but the third does not run ahead of the second
    assert result.outcome is Outcome.SKIPPED_OVERLAP
    assert result.detail == f"{second} of this schedule waits to run"
    assert handler.count == 0
    # AND the second runs at its next try
    assert worker(aws, handler).process(redeliver(aws, deliveries[second])).outcome is (
        Outcome.SUCCEEDED
    )


def test_worker_queue_one_a_new_claim_frees_the_wait_slot_in_its_transaction_only(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the first due occurrence of a QUEUE_ONE schedule, none running or waiting
    _, [first, *_], deliveries = three_due(aws, clock)
    work = worker(aws, Calls())
    given_up: list[str] = []
    real_stop_waiting = work.runs.stop_waiting

    def stop_waiting(tenant_id: str, schedule_id: str, occurrence_id: str) -> None:
        given_up.append(occurrence_id)
        real_stop_waiting(tenant_id, schedule_id, occurrence_id)

    work.runs.stop_waiting = stop_waiting  # type: ignore[method-assign]
    # WHEN it runs
    result = work.process(deliveries[first])
    # THEN its claim's transaction emptied the wait slot, and no write after the claim gives
    # the slot up again (a conditional write that can only fail, a write unit every run)
    assert result.outcome is Outcome.SUCCEEDED
    assert given_up == []


@pytest.mark.parametrize(("waited", "third_waits"), [(59, False), (60, True)])
def test_worker_queue_one_a_wait_holds_its_place_until_it_runs_out(
    alice: Api, aws: Services, clock: Clock, waited: int, third_waits: bool
):
    # GIVEN a QUEUE_ONE schedule's first occurrence running under a long lease, and the
    # second waiting, whose message does not come back (its worker died)
    sid, [first, second, third], deliveries = three_due(aws, clock)
    seen: dict[str, Any] = {}

    def running(job: Job) -> None:
        assert worker(aws, Calls()).process(deliveries[second]).outcome is Outcome.WAITING
        # WHEN the third is delivered a second before, or as, the second's wait runs out
        clock.advance(waited)
        seen["third"] = worker(aws, Calls()).process(deliveries[third]).outcome
        seen["waiting"] = wait_slot(aws, sid)

    worker(aws, running, lease_seconds=600).process(deliveries[first])
    # THEN before, the second keeps its place (the third is skipped); after, the third
    # waits in its place
    if third_waits:
        assert seen["third"] is Outcome.WAITING
        assert seen["waiting"]["occurrence_id"] == third
    else:
        assert seen["third"] is Outcome.SKIPPED_OVERLAP
        assert state(aws, third) is S.SKIPPED_OVERLAP
        assert seen["waiting"]["occurrence_id"] == second


@pytest.mark.parametrize("swept", [True, False], ids=["canceled", "missed_by_the_sweep"])
def test_worker_queue_one_a_waiting_occurrence_made_stale_frees_the_wait(
    alice: Api, aws: Services, clock: Clock, swept: bool
):
    # GIVEN a QUEUE_ONE schedule's second occurrence waiting while the first runs
    sid, [first, second, _], deliveries = three_due(aws, clock)

    def running(job: Job) -> None:
        assert worker(aws, Calls()).process(deliveries[second]).outcome is Outcome.WAITING
        # WHEN the schedule is updated (its open occurrences of version 1 are canceled, or
        # this one is still SCHEDULED: the update's sweep read a replica without it) and
        # the second's message comes back
        changes = {"payload": {"v": 2}}
        ControlPlane(aws).update("alice", sid, if_match=1, changes=changes)
        if not swept:
            set_occurrence_state(aws, second, "SCHEDULED")
        seen["second"] = worker(aws, Calls()).process(redeliver(aws, deliveries[second]))

    seen: dict[str, Any] = {}
    worker(aws, running).process(deliveries[first])
    # THEN it is refused as stale and the wait slot is free for the new version's
    assert seen["second"].outcome is Outcome.STALE
    assert wait_slot(aws, sid) is None


def test_worker_queue_one_race_lets_exactly_one_wait(local_aws: Services, clock: Clock):
    # GIVEN DynamoDB Local (real conditional writes) and QUEUE_ONE schedules, each with its
    # first occurrence running and two more due
    aws = local_aws
    bootstrap("alice", ALICE)
    schedules = [
        rate_schedule(aws, "rate(1 minute)", overlap="QUEUE_ONE") for _ in range(RACE_ROUNDS // 3)
    ]
    clock.advance(120)
    relay(aws, *[occ for _, occurrences in schedules for occ in occurrences[:3]])
    deliveries = receive_all(aws)
    for sid, (first, second, third, *_) in schedules:
        seen: dict[str, Any] = {}

        def running(job: Job) -> None:
            # WHEN the other two are claimed at the same moment while the first runs
            seen["race"] = race(aws, deliveries[second], deliveries[third])  # noqa: B023

        assert worker(aws, running).process(deliveries[first]).outcome is Outcome.SUCCEEDED
        results, ran, _ = seen["race"]
        # THEN neither ran; exactly one waits (and holds the wait slot), the other is skipped
        assert ran == [], (first, results)
        outcomes = {r.outcome: n for n, r in enumerate(results)}
        assert set(outcomes) == {Outcome.WAITING, Outcome.SKIPPED_OVERLAP}, (first, results)
        waiting = (second, third)[outcomes[Outcome.WAITING]]
        held = wait_slot(aws, sid)
        assert held is not None
        assert held["occurrence_id"] == waiting
