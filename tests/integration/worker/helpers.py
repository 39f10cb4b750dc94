"""Shared scenery for the worker SDK's integration tests. It holds the names of alice's queue
and dead-letter queue, the test doubles for a worker process that dies and a handler that
fails or records its jobs, an SQS client that records visibility changes and can lose acks,
and the steps that set a scene or read what happened: an occurrence made due and relayed, its
message received or delivered again, the stored occurrence and its attempts, the queue's
depth, the dead letters and the run slots. The scenes several topics share (an abandoned run,
a failing handler, overlapping occurrences and their races, the Lambda's SQS event) are here
too. Every file of this folder imports from it, and so do the other integration test modules
that drive the worker."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.runs import run_partition, run_slot_sk, wait_slot_sk
from punctual.domain.occurrence import Attempt, AttemptOutcome, Occurrence, OccurrenceState
from punctual.domain.schedule import ScheduleDefinition
from punctual.integrations.queues import queue_name
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual_client.worker import (
    Delivery,
    Job,
    Outcome,
    QueueConsumer,
    Result,
    Worker,
    WorkerServices,
)
from tests.integration.conftest import Clock
from tests.integration.helpers import table_items
from tests.integration.test_relay import one_shot, record

S = OccurrenceState
QUEUE = queue_name("punctual", "alice", "default")
DLQ = queue_name("punctual", "alice", "default", dlq=True)
QUEUE_ARN = f"arn:aws:sqs:us-east-1:123456789012:{QUEUE}"
RACE_ROUNDS = 30


class WorkerDied(BaseException):
    """The worker process dies mid-handler: nothing after this point of the SDK runs."""


class Flaky(Exception):
    """A transient failure (anything not marked permanent)."""


class SpySQS:
    """The moto client, recording visibility changes; ``lose_acks`` makes every
    DeleteMessageBatch entry fail (the handler finished, the ack did not arrive)."""

    def __init__(self, real: Any, *, lose_acks: bool = False) -> None:
        self.real = real
        self.lose_acks = lose_acks
        self.visibility: list[tuple[str, int]] = []  # (receipt handle, seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def change_message_visibility(self, **kwargs: Any) -> Any:
        self.visibility.append((kwargs["ReceiptHandle"], kwargs["VisibilityTimeout"]))
        return self.real.change_message_visibility(**kwargs)

    def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        if not self.lose_acks:
            return self.real.delete_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        failed = [
            {"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "lost"}
            for e in Entries
        ]
        return {"Successful": [], "Failed": failed}

    def last_visibility(self, receipt_handle: str) -> int:
        return [seconds for handle, seconds in self.visibility if handle == receipt_handle][-1]


class Calls:
    """A handler that records each job it ran, then does ``then`` (if given)."""

    def __init__(self, then: Callable[[Job], object] | None = None) -> None:
        self.jobs: list[Job] = []
        self.then = then

    def __call__(self, job: Job) -> None:
        self.jobs.append(job)
        if self.then is not None:
            self.then(job)

    @property
    def count(self) -> int:
        return len(self.jobs)


# --- setting the scene ------------------------------------------------------------------


def with_sqs(aws: Services, sqs: Any) -> Services:
    return Services(aws.dynamodb, sqs, aws.settings, aws.now)


def url_of(aws: WorkerServices, queue: str = QUEUE) -> str:
    return str(aws.sqs.get_queue_url(QueueName=queue)["QueueUrl"])


def relay(aws: Services, *occurrence_ids: str) -> None:
    """The relay sends each occurrence to alice's queue (due now: no delay) and marks it."""
    report = Relay(aws).relay([record(aws, o, n) for n, o in enumerate(occurrence_ids, 1)])
    assert report.failures == {}
    assert report.sent == len(occurrence_ids)


def due(aws: Services, clock: Clock, count: int = 1, **fields: Any) -> list[str]:
    """``count`` one-shots, due now and relayed: each has its message in alice's queue."""
    made = [one_shot(aws, clock, **fields) for _ in range(count)]
    clock.advance(30)
    relay(aws, *made)
    return made


def rate_schedule(
    aws: Services, expression: str = "rate(1 minute)", **fields: Any
) -> tuple[str, list[str]]:
    """A rate schedule anchored now; its id and the occurrences the API materialized
    (the first is due now, the others every interval up to the planning horizon)."""
    definition = ScheduleDefinition.model_validate(
        {"target": "default", "spec": {"kind": "rate", "expression": expression}, **fields}
    )
    saved = ControlPlane(aws).create("alice", definition)
    return saved.schedule.schedule_id, [o.occurrence_id for o in saved.materialized]


def receive(aws: Services, queue: str = QUEUE) -> list[Delivery]:
    url = url_of(aws, queue)
    got = aws.sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    ).get("Messages", [])
    return [
        Delivery(
            body=m["Body"],
            receipt_handle=m["ReceiptHandle"],
            queue_url=url,
            receive_count=int(m["Attributes"]["ApproximateReceiveCount"]),
        )
        for m in got
    ]


def by_occurrence(deliveries: list[Delivery]) -> dict[str, Delivery]:
    return {json.loads(d.body)["occurrence_id"]: d for d in deliveries}


def make_visible(aws: Services, delivery: Delivery) -> None:
    """The message's visibility timeout runs out (moto keeps real time: set it to 0)."""
    aws.sqs.change_message_visibility(
        QueueUrl=delivery.queue_url, ReceiptHandle=delivery.receipt_handle, VisibilityTimeout=0
    )


def redeliver(aws: Services, delivery: Delivery) -> Delivery:
    """SQS brings the message back: receive it again (a new receipt handle)."""
    make_visible(aws, delivery)
    [again] = receive(aws)
    assert again.body == delivery.body
    return again


def depth(aws: Services, queue: str = QUEUE) -> int:
    """Messages still in the queue: visible, in flight or delayed."""
    attributes = aws.sqs.get_queue_attributes(QueueUrl=url_of(aws, queue), AttributeNames=["All"])[
        "Attributes"
    ]
    return sum(
        int(attributes[name])
        for name in (
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        )
    )


def dead_letters(aws: Services) -> list[tuple[str, str | None]]:
    """(body, dead_reason) of every message in alice's DLQ."""
    got = aws.sqs.receive_message(
        QueueUrl=url_of(aws, DLQ), MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    ).get("Messages", [])
    return [
        (m["Body"], m.get("MessageAttributes", {}).get("dead_reason", {}).get("StringValue"))
        for m in got
    ]


def stored(aws: Services, occurrence_id: str) -> tuple[Occurrence, list[Attempt]]:
    found = aws.occurrences.get_with_attempts(occurrence_id)
    assert found is not None
    return found


def state(aws: Services, occurrence_id: str) -> OccurrenceState:
    return stored(aws, occurrence_id)[0].state


def outcomes(aws: Services, occurrence_id: str) -> list[AttemptOutcome]:
    return [a.outcome for a in stored(aws, occurrence_id)[1]]


def concurrency_slots(aws: Services) -> list[dict[str, Any]]:
    items = [from_dynamo(i) for i in table_items(aws, aws.settings.tenants_table)]
    return [i for i in items if i["pk"] == "R#alice" and str(i["sk"]).startswith("RUN#")]


def run_slot(aws: Services, schedule_id: str) -> dict[str, Any]:
    raw = aws.dynamodb.get_item(
        TableName=aws.settings.tenants_table,
        Key=to_dynamo({"pk": run_partition("alice"), "sk": run_slot_sk(schedule_id)}),
        ConsistentRead=True,
    )["Item"]
    return from_dynamo(raw)


def worker(aws: Services, handler: Callable[[Job], None], **options: Any) -> Worker:
    options.setdefault("rng", random.Random(7))
    return Worker(aws, "alice", handler, **options)


def consumer(work: Worker, seen: list[tuple[Delivery, Result]] | None = None) -> QueueConsumer:
    url = url_of(work.services)
    if seen is None:
        return QueueConsumer(work, url, wait_seconds=0, threads=1)
    return QueueConsumer(
        work, url, wait_seconds=0, threads=1, on_result=lambda d, r: seen.append((d, r))
    )


def abandoned(aws: Services, clock: Clock, **fields: Any) -> tuple[str, Delivery]:
    """An occurrence whose worker died mid-run, delivered again after its lease expired."""
    [occ] = due(aws, clock, **fields)
    [delivery] = receive(aws)

    def die(job: Job) -> None:
        raise WorkerDied

    with pytest.raises(WorkerDied):
        worker(aws, die).process(delivery)
    return occ, delivery


def fail_transiently(job: Job) -> None:
    raise Flaky("try later")


def two_due(aws: Services, clock: Clock, **fields: Any) -> tuple[str, list[str]]:
    """A rate(1 minute) schedule with its first two occurrences due and relayed."""
    sid, occurrences = rate_schedule(aws, "rate(1 minute)", **fields)
    clock.advance(60)
    relay(aws, *occurrences[:2])
    return sid, occurrences


def receive_all(aws: Services) -> dict[str, Delivery]:
    """Every message now visible in alice's queue, by occurrence id."""
    found: dict[str, Delivery] = {}
    while batch := receive(aws):
        found.update(by_occurrence(batch))
    return found


def race(aws: Services, a: Delivery, b: Delivery) -> tuple[list[Result], list[str], int]:
    """Two workers process ``a`` and ``b`` at the same moment (a barrier); a handler that
    runs holds its run until the other worker's attempt is over, so the two truly overlap.
    The results, the occurrences whose handler ran, and the most handlers run at once."""
    lock = threading.Lock()
    barrier = threading.Barrier(2)
    returned = [threading.Event(), threading.Event()]
    ran: list[str] = []
    running = [0, 0]  # now, most
    results = [Result(Outcome.REJECTED, "did not return")] * 2

    def claim(n: int, delivery: Delivery) -> None:
        def hold(job: Job) -> None:
            with lock:
                ran.append(job.occurrence_id)
                running[0] += 1
                running[1] = max(running)
            returned[1 - n].wait(timeout=5)
            with lock:
                running[0] -= 1

        barrier.wait()
        try:
            results[n] = worker(aws, hold, rng=random.Random(n)).process(delivery)
        finally:
            returned[n].set()

    threads = [threading.Thread(target=claim, args=pair) for pair in enumerate((a, b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, ran, running[1]


def three_due(aws: Services, clock: Clock) -> tuple[str, list[str], dict[str, Delivery]]:
    """A QUEUE_ONE rate(1 minute) schedule with its first three occurrences due and relayed."""
    sid, occurrences = rate_schedule(aws, "rate(1 minute)", overlap="QUEUE_ONE")
    clock.advance(120)
    relay(aws, *occurrences[:3])
    return sid, occurrences[:3], by_occurrence(receive(aws))


def wait_slot(aws: Services, schedule_id: str) -> dict[str, Any] | None:
    """The schedule's wait slot if an occurrence holds it (an emptied one is free)."""
    raw = aws.dynamodb.get_item(
        TableName=aws.settings.tenants_table,
        Key=to_dynamo({"pk": run_partition("alice"), "sk": wait_slot_sk(schedule_id)}),
        ConsistentRead=True,
    ).get("Item")
    return from_dynamo(raw) if raw and "occurrence_id" in raw else None


def sqs_event(aws: Services, queue: str = QUEUE) -> dict[str, Any]:
    """What an SQS event source mapping passes to Lambda, from the messages now visible."""
    got = aws.sqs.receive_message(
        QueueUrl=url_of(aws, queue),
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=["All"],
    ).get("Messages", [])
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": {
                    "ApproximateReceiveCount": m["Attributes"]["ApproximateReceiveCount"],
                    "SentTimestamp": m["Attributes"]["SentTimestamp"],
                    "SenderId": "123456789012",
                    "ApproximateFirstReceiveTimestamp": m["Attributes"]["SentTimestamp"],
                },
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": QUEUE_ARN,
                "awsRegion": "us-east-1",
            }
            for m in got
        ]
    }
