"""Claim races and the relay in the worker SDK, on moto with the injected clock (DynamoDB Local
for the race). Of two workers racing for one occurrence the handler runs once, an occurrence
the relay sent runs with the time it was sent recorded, and an overlap refusal still says why
when the holder's item is gone."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.dal.common import ConditionFailed, Label
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual_client.worker import Outcome
from tests.integration.conftest import ALICE, Api, Clock, bootstrap
from tests.integration.test_relay import one_shot, record
from tests.integration.worker.helpers import (
    RACE_ROUNDS,
    Calls,
    S,
    by_occurrence,
    consumer,
    depth,
    race,
    receive,
    receive_all,
    relay,
    state,
    stored,
    two_due,
    url_of,
    worker,
)

# --- claim races and the relay ----------------------------------------------------------------


def test_worker_race_two_workers_one_occurrence_runs_the_handler_once(
    local_aws: Services, clock: Clock
):
    # GIVEN DynamoDB Local and sent occurrences, each delivered to two workers (a
    # duplicate delivery)
    aws = local_aws
    bootstrap("alice", ALICE)
    made = [one_shot(aws, clock) for _ in range(RACE_ROUNDS)]
    clock.advance(30)
    relay(aws, *made)
    deliveries = receive_all(aws)
    for occ in made:
        # WHEN both claim it at the same moment
        results, ran, most = race(aws, deliveries[occ], deliveries[occ])
        # THEN exactly one ran the handler; the other saw the live lease (or the result)
        assert (ran, most) == ([occ], 1), results
        assert sorted(r.outcome for r in results) in (
            sorted([Outcome.SUCCEEDED, Outcome.IN_PROGRESS]),
            sorted([Outcome.SUCCEEDED, Outcome.ALREADY_DONE]),
        ), results
        occurrence, attempts = stored(aws, occ)
        assert (occurrence.state, len(attempts)) == (S.SUCCEEDED, 1)


def test_worker_runs_a_sent_scheduled_occurrence_and_records_when_it_was_sent(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the relay sent the message (the occurrence stays SCHEDULED: the send is not
    # written back) and crashed before its batch was done
    occ = one_shot(aws, clock)
    clock.advance(30)

    class Crash(Exception):
        pass

    def crash(point: str) -> None:
        if point == "after_send":
            raise Crash(point)

    inserted = record(aws, occ, 1)  # the stream record carries the item as inserted
    with pytest.raises(Crash):
        Relay(aws, crash=crash).relay([inserted])
    assert state(aws, occ) is S.SCHEDULED
    [peeked] = aws.sqs.receive_message(
        QueueUrl=url_of(aws), MessageSystemAttributeNames=["SentTimestamp"], VisibilityTimeout=0
    )["Messages"]
    sent_at = int(peeked["Attributes"]["SentTimestamp"]) // 1000
    assert abs(sent_at - int(clock.now)) > 3600  # the injected clock is far from SQS's
    clock.advance(2)
    handler = Calls()
    # WHEN a worker receives it
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN it runs from SCHEDULED, and the claim recorded enqueued_at from the message's
    # SentTimestamp (SQS's clock, not the worker's)
    assert result.outcome is Outcome.SUCCEEDED
    assert handler.count == 1
    occurrence, _ = stored(aws, occ)
    assert occurrence.state is S.SUCCEEDED
    assert occurrence.enqueued_at == sent_at
    # AND the stream's retry of the relay sends it again, which the worker deletes as done
    # without running the handler
    assert Relay(aws).relay([inserted]).sent == 1
    [again] = consumer(worker(aws, handler)).poll_once()
    assert again.outcome is Outcome.ALREADY_DONE
    assert handler.count == 1
    assert depth(aws) == 0


def test_worker_overlap_refused_without_the_holders_item_still_says_why(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a due occurrence of a SKIP_IF_RUNNING schedule, and a claim refused on the run
    # slot whose answer does not carry the slot's item (DynamoDB returns it only when asked,
    # and only if the item exists)
    _, [first, *_] = two_due(aws, clock, overlap="SKIP_IF_RUNNING")
    delivery = by_occurrence(receive(aws))[first]
    handler = Calls()
    work = worker(aws, handler)

    def refused(lease: Any, **_: Any) -> None:
        raise ConditionFailed(Label.RUN_SLOT, None)

    work.runs.claim = refused  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN it is skipped, with a reason that still says what held it
    assert (result.outcome, result.detail) == (
        Outcome.SKIPPED_OVERLAP,
        "another occurrence of this schedule is running",
    )
    assert stored(aws, first)[0].reason == result.detail
    assert handler.count == 0
