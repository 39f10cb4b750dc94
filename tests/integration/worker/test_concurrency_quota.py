"""The tenant's concurrency quota in the worker SDK, on moto with the injected clock. A worker
over the quota is throttled and keeps the message, the slot of a dead worker frees itself
when its lease expires, and an occurrence throttled for long is not lost to the DLQ."""

from __future__ import annotations

import random
from typing import Any

import pytest

from punctual.integrations.queues import MAX_RECEIVE_COUNT
from punctual.services import Services
from punctual_client.worker import Job, Outcome
from punctual_client.worker.core import REQUEUE_AFTER_RECEIVES, THROTTLE_BACKOFF
from tests.integration.conftest import ALICE, Clock, bootstrap
from tests.integration.worker.helpers import (
    QUEUE,
    Calls,
    S,
    SpySQS,
    WorkerDied,
    by_occurrence,
    dead_letters,
    due,
    receive,
    redeliver,
    state,
    stored,
    with_sqs,
    worker,
)

# --- the tenant's concurrency quota ------------------------------------------------------


def test_worker_concurrency_quota_throttles_and_keeps_the_message(aws: Services, clock: Clock):
    # GIVEN alice may run 1 occurrence at a time, and one runs under a heartbeated lease
    bootstrap("alice", ALICE, max_concurrency=1)
    blocking, waiting = due(aws, clock, 2)
    deliveries = by_occurrence(receive(aws))
    spy = SpySQS(aws.sqs)
    second = Calls()
    seen: dict[str, Any] = {}

    def long_job(job: Job) -> None:
        clock.advance(50)
        assert job.heartbeat()
        clock.advance(30)  # past the first lease: only the heartbeat keeps the slot
        # WHEN the other occurrence is delivered
        seen["throttled"] = worker(with_sqs(aws, spy), second, rng=random.Random(4)).process(
            deliveries[waiting]
        )
        seen["state"] = stored(aws, waiting)[0]

    first = worker(aws, long_job).process(deliveries[blocking])
    # THEN it is THROTTLED: kept (not deleted), visible again within the throttle back-off,
    # the handler did not run and the occurrence did not change
    throttled = seen["throttled"]
    assert (throttled.outcome, throttled.detail) == (
        Outcome.THROTTLED,
        "tenant concurrency limit reached",
    )
    assert not throttled.delete
    assert throttled.visible_in is not None
    assert THROTTLE_BACKOFF[0] <= throttled.visible_in <= THROTTLE_BACKOFF[1]
    assert spy.visibility == [(deliveries[waiting].receipt_handle, throttled.visible_in)]
    assert second.count == 0
    assert (seen["state"].state, seen["state"].attempt_count) == (S.SCHEDULED, 0)
    # AND after the first completes, the kept message runs when it comes back
    assert first.outcome is Outcome.SUCCEEDED
    later = worker(aws, second).process(redeliver(aws, deliveries[waiting]))
    assert later.outcome is Outcome.SUCCEEDED
    assert second.count == 1


def test_worker_concurrency_slot_of_a_dead_worker_frees_itself_when_its_lease_expires(
    aws: Services, clock: Clock
):
    # GIVEN alice may run 1 at a time, and a worker died holding her only slot
    bootstrap("alice", ALICE, max_concurrency=1)
    dead, waiting = due(aws, clock, 2)
    deliveries = by_occurrence(receive(aws))

    def die(job: Job) -> None:
        raise WorkerDied

    with pytest.raises(WorkerDied):
        worker(aws, die).process(deliveries[dead])
    handler = Calls()
    assert worker(aws, handler).process(deliveries[waiting]).outcome is Outcome.THROTTLED
    # WHEN the other occurrence comes back after the dead worker's lease expired
    clock.advance(61)
    result = worker(aws, handler).process(redeliver(aws, deliveries[waiting]))
    # THEN the slot is taken over and it runs
    assert result.outcome is Outcome.SUCCEEDED
    assert handler.count == 1


def test_worker_throttled_for_long_is_not_lost_to_the_dlq(aws: Services, clock: Clock):
    # GIVEN alice may run 1 at a time, and a long job holds her slot (heartbeating)
    bootstrap("alice", ALICE, max_concurrency=1)
    blocking, waiting = due(aws, clock, 2)
    deliveries = by_occurrence(receive(aws))
    results: list[Outcome] = []

    def long_job(job: Job) -> None:
        delivery = deliveries[waiting]
        # WHEN the waiting message comes back 30 times during the long job (about 9 min
        # at the 5-30 s throttle back-off)
        for _ in range(30):
            clock.advance(17)
            assert job.heartbeat()
            aws.sqs.change_message_visibility(
                QueueUrl=delivery.queue_url,
                ReceiptHandle=delivery.receipt_handle,
                VisibilityTimeout=0,
            )
            got = receive(aws)
            if not got:
                return
            [delivery] = got
            result = worker(aws, Calls()).process(delivery)
            results.append(result.outcome)
            if result.delete:  # as the consumers do
                aws.sqs.delete_message(
                    QueueUrl=delivery.queue_url, ReceiptHandle=delivery.receipt_handle
                )

    worker(aws, long_job, rng=random.Random(5)).process(deliveries[blocking])
    # THEN it was throttled every time it came back, and before SQS's redrive count (25)
    # the worker replaced it with a fresh copy (delayed, so the loop saw no more): it is
    # still in alice's queue, not in the DLQ (where redrive would have put it without a
    # dead_reason, its occurrence SCHEDULED and never run)
    assert set(results) == {Outcome.THROTTLED}
    # (the first receive, before the loop, counts too)
    assert REQUEUE_AFTER_RECEIVES - 1 <= len(results) < MAX_RECEIVE_COUNT
    assert dead_letters(aws) == []
    assert state(aws, waiting) is S.SCHEDULED
    url = aws.sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    counts = aws.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert int(counts["ApproximateNumberOfMessagesDelayed"]) == 1
