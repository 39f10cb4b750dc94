"""The worker SDK on moto (and DynamoDB Local for the races), with the injected clock:
lost acks and idempotent effects, lease expiry and fencing, heartbeats, retries with
full-jitter back-off, stale and canceled occurrences, overlap control, the concurrency
quota, cooperative cancel, the Lambda feed, rejected messages and claim races."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.control.plane import ControlPlane, Saved
from punctual.dal.common import ConditionFailed, Label, from_dynamo, to_dynamo
from punctual.dal.runs import RunLease, run_partition, run_slot_sk, wait_slot_sk
from punctual.dal.tables import current_key, occurrence_key
from punctual.domain.errors import Retryable
from punctual.domain.ids import occurrence_id, shard_of
from punctual.domain.models import (
    Attempt,
    AttemptOutcome,
    Occurrence,
    OccurrenceState,
    RetryPolicy,
    ScheduleDefinition,
    ScheduleState,
    can_transition,
)
from punctual.integrations.queues import MAX_RECEIVE_COUNT, queue_name
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.timing import utc_text
from punctual_client.worker import (
    Delivery,
    EffectLedger,
    Job,
    Message,
    Outcome,
    PermanentError,
    QueueConsumer,
    Result,
    Worker,
    WorkerServices,
    backoff_ceiling,
    sqs_lambda_handler,
)
from punctual_client.worker.core import (
    CLAIM_ATTEMPTS,
    FINISH,
    MAX_VISIBILITY,
    REQUEUE_AFTER_RECEIVES,
    SLOT_PROBES,
    TENANT_CACHE_SECONDS,
    THROTTLE_BACKOFF,
    queue_url_of,
)
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import ALICE, Api, Clock, LambdaContextStub, bootstrap
from tests.integration.helpers import patch, set_occurrence_state, table_items
from tests.integration.test_relay import one_shot, record

S = OccurrenceState
QUEUE = queue_name("punctual", "alice", "default")
DLQ = queue_name("punctual", "alice", "default", dlq=True)
QUEUE_ARN = f"arn:aws:sqs:us-east-1:123456789012:{QUEUE}"
EFFECTS = "alice-effects"  # a table of the tenant's own, key "pk"
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


def occurrence_item(aws: Services, occurrence_id: str) -> dict[str, Any]:
    """The occurrence's stored item, as operators read it in the table."""
    raw = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occurrence_id)),
        ConsistentRead=True,
    )["Item"]
    return from_dynamo(raw)


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


# --- the tenant's own table for idempotent effects ----------------------------------------


def effects_table(aws: Services) -> EffectLedger:
    aws.dynamodb.create_table(
        TableName=EFFECTS,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return EffectLedger(aws.dynamodb, EFFECTS, now=aws.now)


def credit(amount: int = 1) -> dict[str, Any]:
    """The business write: add to alice's balance (not idempotent on its own)."""
    return {
        "Update": {
            "TableName": EFFECTS,
            "Key": {"pk": {"S": "balance"}},
            "UpdateExpression": "ADD amount :a",
            "ExpressionAttributeValues": {":a": {"N": str(amount)}},
        }
    }


def balance(aws: Services) -> int:
    item = aws.dynamodb.get_item(
        TableName=EFFECTS, Key={"pk": {"S": "balance"}}, ConsistentRead=True
    ).get("Item")
    return int(item["amount"]["N"]) if item else 0


# --- the plain path -------------------------------------------------------------------


def test_worker_runs_an_enqueued_occurrence_and_deletes_its_message(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence relayed into alice's queue
    [occ] = due(aws, clock, payload={"report": "daily"})
    handler = Calls()
    # WHEN a consumer polls once
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN the handler ran once with the message, attempt 1; the occurrence SUCCEEDED with
    # one SUCCEEDED attempt, its concurrency slot was released, and the message is gone
    assert result.outcome is Outcome.SUCCEEDED
    [job] = handler.jobs
    assert (job.occurrence_id, job.attempt, job.payload) == (occ, 1, {"report": "daily"})
    assert job.message.tenant_id == "alice"
    occurrence, attempts = stored(aws, occ)
    assert occurrence.state is S.SUCCEEDED
    assert occurrence.attempt_count == 1
    assert occurrence.lease_token is None
    assert [(a.attempt_no, a.outcome) for a in attempts] == [(1, AttemptOutcome.SUCCEEDED)]
    assert (attempts[0].started_at, attempts[0].finished_at) == (int(clock.now),) * 2
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))
    assert depth(aws) == 0


def test_worker_claim_shows_how_long_the_occurrence_waited_for_a_worker(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence relayed on time into alice's queue, whose workers were down
    [occ] = due(aws, clock)
    due_at = int(clock.now)
    clock.advance(146)
    # WHEN a worker takes it 146 s after it was due
    [result] = consumer(worker(aws, Calls())).poll_once()
    assert result.outcome is Outcome.SUCCEEDED
    # THEN the API shows when it was claimed and that it waited 146 s for a worker (the
    # relay's lag, sent ahead of its time, being none), listed and read alone
    schedule_id = occ.split("_", 1)[1].rsplit("_", 2)[0]
    [listed] = alice.get(f"/v1/schedules/{schedule_id}/occurrences").body["occurrences"]
    read = alice.get(f"/v1/occurrences/{occ}").body
    for shown in (listed, read):
        assert shown["claimed_at"] == utc_text(due_at + 146)
        assert shown["waited_seconds"] == 146


def test_worker_attempts_a_tenant_wrote_badly_show_no_claim_and_fail_nothing(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose attempt history its tenant's worker wrote as garbage
    [occ] = due(aws, clock)
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occ)),
        UpdateExpression="SET attempts = :junk",
        ExpressionAttributeValues={":junk": {"L": [{"S": "not a map"}]}},
    )
    # WHEN its schedule's occurrences are listed
    schedule_id = occ.split("_", 1)[1].rsplit("_", 2)[0]
    answer = alice.get(f"/v1/schedules/{schedule_id}/occurrences")
    # THEN it is listed, without a claim (display only: no error)
    assert answer.status == 200, answer.body
    [listed] = answer.body["occurrences"]
    assert (listed["claimed_at"], listed["waited_seconds"]) == (None, None)


# --- lost acks and idempotent effects ------------------------------------------------------


def test_worker_lost_ack_redelivery_is_already_done_and_the_effect_is_not_repeated(
    alice: Api, aws: Services, clock: Clock, caplog: pytest.LogCaptureFixture
):
    # GIVEN a handler that credits alice's balance once per occurrence, and an SQS whose
    # DeleteMessageBatch reports the entry as Failed (crash point: after the handler and
    # the completion, at the ack)
    [occ] = due(aws, clock)
    ledger = effects_table(aws)
    handler = Calls(lambda job: ledger.apply(job.occurrence_id, [credit()]))
    lossy = SpySQS(aws.sqs, lose_acks=True)
    seen: list[tuple[Delivery, Result]] = []
    with caplog.at_level(logging.WARNING, logger="punctual"):
        [first] = consumer(worker(with_sqs(aws, lossy), handler), seen).poll_once()
    assert first.outcome is Outcome.SUCCEEDED
    assert seen[0][1] is first  # on_result is told each delivery's result
    assert depth(aws) == 1  # the ack was lost: the message is still there
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "delete failed; the re-delivery will be recognized"
    ]
    # WHEN the message comes back (its visibility ran out) to a consumer whose acks work
    make_visible(aws, seen[0][0])
    [second] = consumer(worker(aws, handler)).poll_once()
    # THEN it is recognized as done: the handler did not run again, the effect was applied
    # once, the occurrence stays SUCCEEDED with its one attempt, and the message is deleted
    assert (second.outcome, second.detail) == (Outcome.ALREADY_DONE, "already SUCCEEDED")
    assert handler.count == 1
    assert balance(aws) == 1
    assert state(aws, occ) is S.SUCCEEDED
    assert outcomes(aws, occ) == [AttemptOutcome.SUCCEEDED]
    assert depth(aws) == 0


def test_effect_ledger_second_apply_of_an_occurrence_returns_false_and_writes_nothing(
    aws: Services, clock: Clock
):
    # GIVEN the tenant's own table and an effect applied for occ_1
    ledger = effects_table(aws)
    assert ledger.apply("occ_1", [credit(5)]) is True
    assert ledger.applied("occ_1")
    # WHEN the same occurrence applies its effect again (with a different write, even)
    again = ledger.apply(
        "occ_1",
        [credit(5), {"Put": {"TableName": EFFECTS, "Item": {"pk": {"S": "second-write"}}}}],
    )
    # THEN it is refused as already applied and nothing of the second transaction is
    # written; another occurrence, or another named effect of occ_1, still applies
    assert again is False
    assert balance(aws) == 5
    keys = {i["pk"]["S"] for i in table_items(aws, EFFECTS)}
    assert keys == {"balance", "effect#default#occ_1"}
    assert ledger.apply("occ_2", [credit(1)]) is True
    assert ledger.apply("occ_1", [credit(1)], effect="email") is True
    assert balance(aws) == 7
    record_item = from_dynamo(
        aws.dynamodb.get_item(TableName=EFFECTS, Key={"pk": {"S": "effect#default#occ_1"}})["Item"]
    )
    assert record_item["occurrence_id"] == "occ_1"
    assert record_item["expires_at"] == int(clock.now) + 35 * 86400


def test_effect_ledger_a_failing_business_write_is_not_mistaken_for_a_duplicate(
    aws: Services,
):
    # GIVEN a business write whose own condition fails
    ledger = effects_table(aws)
    refused = {
        "Put": {
            "TableName": EFFECTS,
            "Item": {"pk": {"S": "x"}},
            "ConditionExpression": "attribute_exists(pk)",
        }
    }
    # WHEN it is applied with the ledger record
    # THEN the refusal surfaces, naming the business write (not "already applied"), and no
    # effect is recorded
    with pytest.raises(ConditionFailed) as raised:
        ledger.apply("occ_1", [refused])
    assert raised.value.label == Label.EFFECT_WRITE
    assert raised.value.failed(0)
    assert not raised.value.failed(1)
    assert not ledger.applied("occ_1")


def test_effect_ledger_record_in_a_transaction_of_ones_own_is_the_one_apply_checks(
    aws: Services, clock: Clock
):
    # GIVEN an effect recorded by ``record`` in a transaction the tenant builds itself
    ledger = effects_table(aws)
    aws.dynamodb.transact_write_items(TransactItems=[credit(), ledger.record_action("occ_1")])
    # THEN ``applied`` and ``apply`` (same default effect name) see it: nothing twice
    assert ledger.applied("occ_1")
    assert not ledger.apply("occ_1", [credit()])
    assert balance(aws) == 1
    # AND the record says what it is for, and when it was made; it expires after 35 days
    raw = aws.dynamodb.get_item(TableName=EFFECTS, Key={"pk": {"S": "effect#default#occ_1"}})
    now = int(clock.now)
    assert from_dynamo(raw["Item"]) == {
        "pk": "effect#default#occ_1",
        "occurrence_id": "occ_1",
        "effect": "default",
        "recorded_at": now,
        "expires_at": now + 35 * 86400,
    }


def test_effect_ledger_sees_an_effect_recorded_a_moment_ago_on_a_lagging_replica(
    aws: Services, clock: Clock
):
    # GIVEN a ledger whose eventually consistent reads are served a minute stale
    effects_table(aws)
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    ledger = EffectLedger(FaultyDynamoDB(aws.dynamodb, faults), EFFECTS, now=aws.now)
    # WHEN an effect is recorded, and the same occurrence asks a second later
    assert ledger.apply("occ_1", [credit()])
    clock.advance(1)
    # THEN it is applied (a stale read would say no, and the caller would apply it again)
    assert ledger.applied("occ_1")


def test_worker_crash_after_effect_before_completion_rerun_does_not_repeat_the_effect(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a handler that applies its effect, then fails transiently on attempt 1 (crash
    # point: after the effect, before the completion)
    [occ] = due(aws, clock)
    ledger = effects_table(aws)
    applied: list[bool] = []

    def effect_then_fail(job: Job) -> None:
        applied.append(ledger.apply(job.occurrence_id, [credit()]))
        if job.attempt == 1:
            raise Flaky("connection reset after the write")

    seen: list[tuple[Delivery, Result]] = []
    [first] = consumer(worker(aws, effect_then_fail), seen).poll_once()
    assert first.outcome is Outcome.RETRY
    # WHEN the retry is delivered after its back-off and runs the handler again
    assert first.visible_in is not None
    clock.advance(first.visible_in)
    make_visible(aws, seen[0][0])
    [second] = consumer(worker(aws, effect_then_fail)).poll_once()
    # THEN the second run found the effect recorded: applied once, occurrence SUCCEEDED
    assert second.outcome is Outcome.SUCCEEDED
    assert applied == [True, False]
    assert balance(aws) == 1
    assert outcomes(aws, occ) == [AttemptOutcome.RETRY, AttemptOutcome.SUCCEEDED]


def test_worker_dies_after_effect_lease_expires_and_the_takeover_does_not_repeat_the_effect(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A applies the effect and its process dies before completing (crash
    # point: after the effect, before the completion; the lease is left to expire)
    [occ] = due(aws, clock)
    ledger = effects_table(aws)
    applied: list[bool] = []

    def effect_then_die(job: Job) -> None:
        applied.append(ledger.apply(job.occurrence_id, [credit()]))
        raise WorkerDied

    [delivery] = receive(aws)
    with pytest.raises(WorkerDied):
        worker(aws, effect_then_die).process(delivery)
    assert state(aws, occ) is S.RUNNING
    # WHEN the lease expires and the message comes back to worker B
    clock.advance(61)
    again = redeliver(aws, delivery)
    b = worker(aws, lambda job: applied.append(ledger.apply(job.occurrence_id, [credit()])))
    result = b.process(again)
    # THEN B took over (attempt 2, attempt 1 LOST), its effect was refused as a duplicate
    assert result.outcome is Outcome.SUCCEEDED
    assert applied == [True, False]
    assert balance(aws) == 1
    assert outcomes(aws, occ) == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]


# --- leases and heartbeats ------------------------------------------------------------------


def test_worker_heartbeat_of_a_run_another_worker_refused_says_the_lease_is_gone(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A running an occurrence; A stalls past its lease, the schedule is paused,
    # and B, given the message again, refuses the abandoned run (CANCELED; the refusal
    # leaves A's token on the item)
    _, [occ, *_] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    [delivery] = receive(aws)
    seen: dict[str, Any] = {}

    def stall(job: Job) -> None:
        clock.advance(61)
        ControlPlane(aws).pause("alice", job.message.schedule_id)
        seen["b"] = worker(aws, Calls(), rng=random.Random(8)).process(redeliver(aws, delivery))
        seen["heartbeat"] = job.heartbeat()

    # WHEN A beats its heart after that
    late = worker(aws, stall).process(delivery)
    # THEN the beat says the lease is gone (the run is no longer RUNNING), and A's
    # completion is rejected: the occurrence stays CANCELED
    assert seen["b"].outcome is Outcome.STALE
    assert seen["heartbeat"] is False
    assert late.outcome is Outcome.LEASE_LOST
    assert state(aws, occ) is S.CANCELED


def test_worker_abandoned_run_is_moved_once_when_a_refusal_and_a_takeover_race(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a run whose lease expired, read RUNNING (with its token) by two workers
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    outcome: dict[str, Any] = {}

    def stall(job: Job) -> None:
        clock.advance(61)
        runs = worker(aws, Calls()).runs
        found, _ = runs.read(occ, job.message.schedule_id)
        assert found is not None
        seen, now = found.seen, int(clock.now)
        # WHEN one refuses it (CANCELED: the refusal keeps the token) and the other then
        # claims it, and a third refusal (DEAD) comes after both, all on what they read
        outcome["refused"] = runs.refuse(occ, seen=seen, state=S.CANCELED, reason="stale", now=now)
        lease = dataclasses.replace(job._lease, token="t-late", attempt_no=2, attempt_index=1)
        try:
            runs.claim(lease, seen=seen, now=now, queued_at=now)
            outcome["claimed"] = True
        except ConditionFailed:
            outcome["claimed"] = False
        outcome["refused_again"] = runs.refuse(
            occ, seen=seen, state=S.DEAD, reason="exhausted", now=now
        )

    worker(aws, stall).process(delivery)
    # THEN only the first move happened: the state it read is gone for the others
    assert outcome == {"refused": True, "claimed": False, "refused_again": False}
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.reason) == (S.CANCELED, "stale")
    assert [a.outcome for a in attempts] == [AttemptOutcome.LOST]


def test_worker_lease_expiry_b_takes_over_and_a_late_completion_is_rejected(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A running an occurrence under a 60 s lease; B gets the same message
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    b_handler = Calls()
    b = worker(aws, b_handler, rng=random.Random(8))
    seen: dict[str, Any] = {}

    def stall(job: Job) -> None:
        # While A's lease is live, B is told someone else holds it.
        seen["live"] = b.process(redeliver(aws, delivery))
        seen["a_token"] = stored(aws, occ)[0].lease_token
        # A stalls beyond its lease; the message comes back to B, which takes over.
        clock.advance(61)
        seen["b"] = b.process(redeliver(aws, delivery))
        seen["after_b"] = stored(aws, occ)
        seen["heartbeat"] = job.heartbeat()

    a = worker(aws, stall)
    # WHEN A finally returns
    late = a.process(delivery)
    # THEN while A's lease was live B refused (IN_PROGRESS, back when the lease ends); after
    # it expired B claimed with a new token as attempt 2 (attempt 1 LOST) and succeeded
    assert seen["live"].outcome is Outcome.IN_PROGRESS
    assert seen["live"].detail == "another worker holds the lease"
    assert seen["live"].visible_in == 60
    assert seen["b"].outcome is Outcome.SUCCEEDED
    assert [job.attempt for job in b_handler.jobs] == [2]
    occurrence, attempts = seen["after_b"]
    assert occurrence.state is S.SUCCEEDED
    assert [(x.attempt_no, x.outcome) for x in attempts] == [
        (1, AttemptOutcome.LOST),
        (2, AttemptOutcome.SUCCEEDED),
    ]
    assert b_handler.jobs[0]._lease.token != seen["a_token"] is not None
    # AND A's heartbeat after the takeover said the lease is gone, and A's completion was
    # rejected without touching the occurrence or either attempt
    assert seen["heartbeat"] is False
    assert late.outcome is Outcome.LEASE_LOST
    assert late.detail == "attempt 1 lost its lease"
    assert not late.delete
    assert stored(aws, occ) == seen["after_b"]


def test_worker_stale_completion_while_the_new_holder_still_runs_is_fenced_by_the_token(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A stalled past its lease, worker B took the occurrence over, and A returns
    # while B's handler is still running (the occurrence is RUNNING, only the token differs)
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    b_started, a_finished = threading.Event(), threading.Event()

    def b_runs(job: Job) -> None:
        b_started.set()
        assert a_finished.wait(10)

    b = worker(aws, b_runs, rng=random.Random(8))
    box: dict[str, Any] = {}

    def a_stalls(job: Job) -> None:
        clock.advance(61)
        box["b"] = threading.Thread(
            target=lambda: box.__setitem__("b_result", b.process(redeliver(aws, delivery)))
        )
        box["b"].start()
        assert b_started.wait(10)

    # WHEN A's handler returns and A completes
    late = worker(aws, a_stalls).process(delivery)
    during = stored(aws, occ)
    a_finished.set()
    box["b"].join(10)
    # THEN A's completion is refused (LEASE_LOST): the occurrence stays RUNNING under B's
    # token, attempt 1 LOST and attempt 2 still running
    assert late.outcome is Outcome.LEASE_LOST
    occurrence, attempts = during
    assert occurrence.state is S.RUNNING
    assert occurrence.attempt_count == 2
    assert occurrence.lease_token is not None
    assert [(x.attempt_no, x.outcome) for x in attempts] == [
        (1, AttemptOutcome.LOST),
        (2, AttemptOutcome.RUNNING),
    ]
    # AND B finishes it SUCCEEDED
    assert box["b_result"].outcome is Outcome.SUCCEEDED
    assert outcomes(aws, occ) == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]
    assert stored(aws, occ)[0].state is S.SUCCEEDED


def test_worker_late_permanent_failure_after_a_takeover_leaves_the_dlq_alone(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A stalls past its lease, B takes over and succeeds
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    seen: dict[str, Result] = {}

    def stall_then_fail(job: Job) -> None:
        clock.advance(61)
        seen["b"] = worker(aws, Calls(), rng=random.Random(8)).process(redeliver(aws, delivery))
        # WHEN A then fails with a permanent error
        raise PermanentError("bad input")

    late = worker(aws, stall_then_fail).process(delivery)
    # THEN A's completion is rejected and the occurrence stays SUCCEEDED; nothing of A's
    # stale attempt should reach the DLQ (it would alarm and be redriven for nothing)
    assert seen["b"].outcome is Outcome.SUCCEEDED
    assert late.outcome is Outcome.LEASE_LOST
    assert state(aws, occ) is S.SUCCEEDED
    assert dead_letters(aws) == []


class FaultOnCompletion:
    """The DynamoDB client; the first completion write fails: throttled before it is made,
    or made and its answer lost (a timeout after the commit, which the SDK or the worker
    sends again)."""

    def __init__(self, real: Any, fault: str) -> None:
        self.real = real
        self.fault = fault
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def update_item(self, **kw: Any) -> Any:
        if not self.failed and "finished_at" in kw.get("UpdateExpression", ""):
            self.failed += 1
            if self.fault == "answer lost":
                self.real.update_item(**kw)
                code = "InternalServerError"
            else:
                code = "ProvisionedThroughputExceededException"
            raise ClientError({"Error": {"Code": code, "Message": self.fault}}, "UpdateItem")
        return self.real.update_item(**kw)


@pytest.mark.parametrize("fault", ["throttled", "answer lost"])
def test_worker_completion_that_fails_transiently_is_retried_and_counts_once(
    alice: Api, aws: Services, clock: Clock, fault: str
):
    # GIVEN the first completion write fails transiently: throttled before it is made, or
    # made and its answer lost (fault point: after the handler returned, at the completion)
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    flaky = FaultOnCompletion(aws.dynamodb, fault)
    handler = Calls()
    work = worker(Services(flaky, aws.sqs, aws.settings, aws.now), handler)
    # WHEN the worker completes the run
    result = work.process(delivery)
    # THEN the completion is sent again and succeeds, once: a repeat that meets its own
    # write is not taken for a lost lease; no second run, the slot is free again
    assert flaky.failed == 1
    assert result.outcome is Outcome.SUCCEEDED
    assert result.delete
    assert state(aws, occ) is S.SUCCEEDED
    assert outcomes(aws, occ) == [AttemptOutcome.SUCCEEDED]
    assert handler.count == 1
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))


# RunStore.refuse passes ``now`` twice to values() for a RUNNING occurrence, so every
# refusal of an abandoned run crashes: CPython 3.11 reports the duplicate keyword as a
# TypeError, or as a KeyError when the call happens inside an ``except`` block (the
# overlap refusal is made from Worker._claim_in's ``except ConditionFailed``).
REFUSE_CRASH = (TypeError, KeyError)


def abandoned(aws: Services, clock: Clock, **fields: Any) -> tuple[str, Delivery]:
    """An occurrence whose worker died mid-run, delivered again after its lease expired."""
    [occ] = due(aws, clock, **fields)
    [delivery] = receive(aws)

    def die(job: Job) -> None:
        raise WorkerDied

    with pytest.raises(WorkerDied):
        worker(aws, die).process(delivery)
    return occ, delivery


@pytest.mark.parametrize("ending", ["canceled", "updated", "paused", "exhausted"])
def test_worker_refuses_an_abandoned_run_that_is_stale_or_exhausted(
    alice: Api, aws: Services, clock: Clock, ending: str
):
    # GIVEN a one-attempt occurrence whose worker died mid-run, and its schedule canceled,
    # updated or paused meanwhile (a RUNNING occurrence is reported by the change, not
    # canceled), or nothing more
    occ, delivery = abandoned(aws, clock, retry={"max_attempts": 1})
    sid = stored(aws, occ)[0].schedule_id
    if ending == "canceled":
        ControlPlane(aws).cancel("alice", sid)
    elif ending == "updated":
        later = {"kind": "at", "at": utc_text(int(clock.now) + 3600)}
        assert patch(alice, sid, {"spec": later}, version=1).status == 200
    elif ending == "paused":
        ControlPlane(aws).pause("alice", sid)
    clock.advance(61)
    handler = Calls()
    # WHEN the message comes back after the lease expired
    result = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN it is refused without running: CANCELED as stale (with why), or DEAD (and in
    # the DLQ once)
    expected = (Outcome.DEAD, S.DEAD) if ending == "exhausted" else (Outcome.STALE, S.CANCELED)
    assert (result.outcome, state(aws, occ)) == expected
    assert handler.count == 0
    assert len(dead_letters(aws)) == (1 if ending == "exhausted" else 0)
    why = {"canceled": "the schedule was canceled", "updated": "version 2", "paused": "version 2"}
    if ending == "canceled":
        assert stored(aws, occ)[0].reason == why[ending]
    elif ending in why:
        assert why[ending] in (stored(aws, occ)[0].reason or "")


@pytest.mark.parametrize("ending", ["canceled", "exhausted"])
def test_worker_refusing_an_abandoned_run_marks_its_attempt_lost(
    alice: Api, aws: Services, clock: Clock, ending: str
):
    # GIVEN a one-attempt occurrence whose worker died mid-run (and maybe a cancel)
    occ, delivery = abandoned(aws, clock, retry={"max_attempts": 1})
    if ending == "canceled":
        ControlPlane(aws).cancel("alice", stored(aws, occ)[0].schedule_id)
    clock.advance(61)
    # WHEN the message comes back and the occurrence is refused
    worker(aws, Calls()).process(redeliver(aws, delivery))
    # THEN the abandoned attempt is closed as LOST, like a takeover closes it
    assert state(aws, occ) in (S.CANCELED, S.DEAD)
    assert outcomes(aws, occ) == [AttemptOutcome.LOST]


def test_worker_lease_ending_this_second_is_taken_over_not_waited_for(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN worker A running an occurrence under a 60 s lease, stalled exactly 60 s
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    b_handler = Calls()
    seen: dict[str, Result] = {}

    def stall(job: Job) -> None:
        clock.advance(60)
        # WHEN the message comes back to B at the very second A's lease ends
        seen["b"] = worker(aws, b_handler).process(redeliver(aws, delivery))

    worker(aws, stall).process(delivery)
    # THEN B takes over at once (the claim's condition allows a lease ending now), rather
    # than waiting a round for a lease that no longer protects anything
    assert seen["b"].outcome is Outcome.SUCCEEDED
    assert [job.attempt for job in b_handler.jobs] == [2]
    assert outcomes(aws, occ) == [AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]


def test_worker_heartbeat_extends_the_lease_and_both_slots(alice: Api, aws: Services, clock: Clock):
    # GIVEN a SKIP_IF_RUNNING schedule's occurrence running under a 60 s lease
    sid, [occ, *_] = rate_schedule(aws, "rate(5 minutes)", overlap="SKIP_IF_RUNNING")
    relay(aws, occ)
    [delivery] = receive(aws)
    other = worker(aws, Calls(), rng=random.Random(9))
    seen: dict[str, Any] = {}

    def lease_and_slots() -> tuple[int | None, int, int]:
        [slot] = [s for s in concurrency_slots(aws) if s.get("occurrence_id") == occ]
        return (
            stored(aws, occ)[0].lease_expires_at,
            slot["expires_at"],
            run_slot(aws, sid)["expires_at"],
        )

    def long_job(job: Job) -> None:
        seen["claimed_at"] = int(clock.now)
        seen["before"] = lease_and_slots()
        # WHEN 50 s in, the handler heartbeats
        clock.advance(50)
        seen["beat"] = job.heartbeat()
        seen["after"] = lease_and_slots()
        seen["visibility"] = list(spy.visibility)
        # 30 s later the first lease (claimed + 60) has passed, the extended one has not
        clock.advance(30)
        seen["other"] = other.process(redeliver(aws, delivery))

    spy = SpySQS(aws.sqs)
    result = worker(with_sqs(aws, spy), long_job).process(delivery)
    # THEN the occurrence's lease and both slot items moved from claim + 60 to beat + 60
    # together, the message's visibility was extended with them (once at the claim, once
    # at the beat), and another worker still sees IN_PROGRESS (for the 30 s left)
    claimed = seen["claimed_at"]
    assert seen["before"] == (claimed + 60,) * 3
    assert seen["beat"] is True
    assert seen["after"] == (claimed + 50 + 60,) * 3
    assert seen["visibility"] == [(delivery.receipt_handle, 60)] * 2
    assert seen["other"].outcome is Outcome.IN_PROGRESS
    assert seen["other"].visible_in == 30
    assert result.outcome is Outcome.SUCCEEDED
    assert state(aws, occ) is S.SUCCEEDED


def test_worker_heartbeat_thread_keeps_the_lease_while_the_handler_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a worker that heartbeats on a thread every 10 ms
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    seen: dict[str, Any] = {}

    def slow(job: Job) -> None:
        clock.advance(50)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            seen["lease"] = stored(aws, occ)[0].lease_expires_at
            if seen["lease"] == int(clock.now) + 60:
                return
            time.sleep(0.01)

    # WHEN the handler runs 50 s of injected time
    result = worker(aws, slow, heartbeat_seconds=0.01).process(delivery)
    # THEN a beat moved the lease to now + 60 without the handler calling heartbeat()
    assert seen["lease"] == int(clock.now) + 60
    assert result.outcome is Outcome.SUCCEEDED


# --- retries, back-off, deadline and permanent errors ------------------------------------------


def test_worker_backoff_ceiling_doubles_from_the_base_up_to_the_max():
    # GIVEN a policy with base 10 s and max 25 s; THEN the full-jitter bound of attempt n
    # is min(max, base * 2^(n-1))
    policy = RetryPolicy(max_attempts=6, backoff_base_seconds=10, backoff_max_seconds=25)
    assert [backoff_ceiling(policy, n) for n in range(1, 6)] == [10, 20, 25, 25, 25]
    default = RetryPolicy()
    assert [backoff_ceiling(default, n) for n in (1, 2, 7, 8)] == [10, 20, 640, 900]


def fail_transiently(job: Job) -> None:
    raise Flaky("try later")


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


# --- stale, paused and canceled schedules ----------------------------------------------------


@pytest.mark.parametrize("change", ["update", "pause", "cancel"])
def test_worker_stale_or_canceled_occurrence_is_refused_before_the_handler_runs(
    alice: Api, aws: Services, clock: Clock, change: str
):
    # GIVEN an occurrence of version 1 already in the queue
    sid, [occ] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    # WHEN the schedule is updated (PATCH with If-Match), paused or canceled
    if change == "update":
        answer = patch(alice, sid, {"payload": {"v": 2}}, version=1)
        assert answer.status == 200, answer.body
    elif change == "pause":
        ControlPlane(aws).pause("alice", sid)
    else:
        ControlPlane(aws).cancel("alice", sid)
    # (the change canceled the occurrence; its message is still in the queue)
    assert state(aws, occ) is S.CANCELED
    assert depth(aws) == 1
    handler = Calls()
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN the worker refuses it (STALE) before the handler: CANCELED with the reason, no
    # attempt, message deleted, nothing in the DLQ
    assert result.outcome is Outcome.STALE
    assert handler.count == 0
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.attempt_count, attempts) == (S.CANCELED, 0, [])
    assert occurrence.reason
    assert result.detail == f"canceled: {occurrence.reason}"
    assert depth(aws) == 0
    assert dead_letters(aws) == []


@pytest.mark.parametrize(
    "window",
    ["its commit and its settling", "a retry's read and claim", "a commit the API died after"],
)
def test_worker_claim_that_meets_a_change_of_the_schedule_is_undone_before_the_handler(
    alice: Api, aws: Services, clock: Clock, window: str
):
    # GIVEN an occurrence of version 1 whose message a worker has read, and an update of the
    # schedule that commits after that read, its settling of version 1's occurrences:
    # - after the claim (which checks no version), so the update's answer reports it running
    # - before the claim, where it only reports a retry waiting (RETRY_WAIT is not canceled)
    # - never (the API died after its commit)
    sid, [occ, *_] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    [delivery] = receive(aws)
    before = 0
    if window == "a retry's read and claim":
        assert worker(aws, Calls(fail_transiently)).process(delivery).outcome is Outcome.RETRY
        clock.advance(3600)
        delivery, before = redeliver(aws, delivery), 1
    saved: list[Saved] = []
    handler = Calls()
    work = worker(aws, handler)
    real_claim = work.runs.claim

    def claim_as_an_update_commits(lease: Any, **kwargs: Any) -> None:
        plane = ControlPlane(aws)
        listing = plane.occurrences.open_for_schedule

        def settle(*args: Any, **kw: Any) -> list[Occurrence]:
            if window == "a commit the API died after":
                raise RuntimeError("the API's Lambda died after the commit")
            if window == "its commit and its settling":
                real_claim(lease, **kwargs)
            return listing(*args, **kw)

        plane.occurrences.open_for_schedule = settle  # type: ignore[method-assign]
        with contextlib.suppress(RuntimeError):  # the API's death after the commit
            saved.append(plane.update("alice", sid, if_match=1, changes={"payload": {"v": 2}}))
        if window != "its commit and its settling":
            real_claim(lease, **kwargs)

    work.runs.claim = claim_as_an_update_commits  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN its check after the claim (strongly consistent) finds version 2 and undoes the
    # claim: the handler never ran, CANCELED with the reason, the attempts as they were
    # before the claim, the slot free, the message dropped
    assert result.outcome is Outcome.STALE
    assert result.detail == "stale: the schedule runs as version 2, this occurrence is of version 1"
    assert handler.count == 0
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.reason) == (S.CANCELED, result.detail)
    raw = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table, Key=to_dynamo(occurrence_key(occ))
    )["Item"]
    assert from_dynamo(raw)["finished_at"] == int(clock.now)
    assert occurrence.attempt_count == len(attempts) == before
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRY] * before
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))
    assert result.delete
    # AND the update's answer said what it found, and is now true: running (it stops before
    # its handler), or a retry the worker refuses
    notes = [a.note for answer in saved for a in answer.affected]
    assert (
        notes
        == {
            "its commit and its settling": ["running: it can only stop cooperatively"],
            "a retry's read and claim": ["in the queue for a retry: the worker will refuse it"],
            "a commit the API died after": [],
        }[window]
    )


def throttled_schedule_reads(aws: Services, monkeypatch: pytest.MonkeyPatch, *, consistent: bool):
    """DynamoDB refuses (throttles) every read of a schedule item of that consistency."""
    real = aws.dynamodb.get_item

    def get_item(**request: Any) -> Any:
        if request["TableName"] == aws.settings.schedules_table and (
            request.get("ConsistentRead", False) is consistent
        ):
            raise ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "busy"}},
                "GetItem",
            )
        return real(**request)

    monkeypatch.setattr(aws.dynamodb, "get_item", get_item)
    return real


def test_worker_claim_whose_schedule_cannot_be_read_after_it_is_undone_without_spending_it(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a one-attempt occurrence whose message a worker claims, and DynamoDB throttling
    # the strongly consistent read of the schedule that must follow the claim
    [occ] = due(aws, clock, retry={"max_attempts": 1})
    [delivery] = receive(aws)
    real = throttled_schedule_reads(aws, monkeypatch, consistent=True)
    handler = Calls()
    # WHEN the worker processes it
    result = worker(aws, handler).process(delivery)
    # THEN the handler does not run on a guess: the claim is undone (SCHEDULED, no attempt
    # spent, the slots free) and the message comes back soon, not after the lease
    assert result.outcome is Outcome.IN_PROGRESS
    assert result.visible_in is not None
    assert result.visible_in < 60
    assert not result.delete
    assert handler.count == 0
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.attempt_count, attempts) == (S.SCHEDULED, 0, [])
    assert all("lease_token" not in slot for slot in concurrency_slots(aws))
    # WHEN the reads succeed again and the message comes back
    monkeypatch.setattr(aws.dynamodb, "get_item", real)
    clock.advance(result.visible_in)
    again = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN its one attempt runs it
    assert again.outcome is Outcome.SUCCEEDED
    assert handler.count == 1
    occurrence, attempts = stored(aws, occ)
    assert occurrence.state is S.SUCCEEDED
    assert [a.outcome for a in attempts] == [AttemptOutcome.SUCCEEDED]


def test_worker_retry_whose_schedule_cannot_be_read_after_its_claim_keeps_its_history(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a two-attempt occurrence whose first attempt failed transiently (RETRY_WAIT)
    [occ] = due(aws, clock, retry={"max_attempts": 2})
    [delivery] = receive(aws)
    assert worker(aws, Calls(fail_transiently)).process(delivery).outcome is Outcome.RETRY
    clock.advance(3600)
    delivery = redeliver(aws, delivery)
    real = throttled_schedule_reads(aws, monkeypatch, consistent=True)
    # WHEN its retry's claim cannot read the schedule after it
    result = worker(aws, Calls()).process(delivery)
    # THEN the claim is undone back to RETRY_WAIT with its first attempt's record only
    assert result.outcome is Outcome.IN_PROGRESS
    occurrence, attempts = stored(aws, occ)
    assert (occurrence.state, occurrence.attempt_count) == (S.RETRY_WAIT, 1)
    assert [a.outcome for a in attempts] == [AttemptOutcome.RETRY]
    # AND its second attempt still runs it
    monkeypatch.setattr(aws.dynamodb, "get_item", real)
    handler = Calls()
    clock.advance(3600)
    assert worker(aws, handler).process(redeliver(aws, delivery)).outcome is Outcome.SUCCEEDED
    assert handler.count == 1
    assert outcomes(aws, occ) == [AttemptOutcome.RETRY, AttemptOutcome.SUCCEEDED]


def test_worker_takeover_whose_schedule_cannot_be_read_after_it_keeps_the_lease(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN an occurrence whose worker died mid-run, delivered again after its lease
    occ, delivery = abandoned(aws, clock)
    clock.advance(61)
    delivery = redeliver(aws, delivery)
    real = throttled_schedule_reads(aws, monkeypatch, consistent=True)
    handler = Calls()
    # WHEN the takeover's read of the schedule after its claim is throttled
    result = worker(aws, handler).process(delivery)
    # THEN the expired lease cannot be put back: the new one is kept until it runs out,
    # and the handler did not run
    assert (result.outcome, result.visible_in) == (Outcome.IN_PROGRESS, 60)
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.RUNNING
    # WHEN it comes back after that lease, with the reads working again
    monkeypatch.setattr(aws.dynamodb, "get_item", real)
    clock.advance(61)
    again = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN it runs once: the dead worker's attempt and the takeover that never ran are LOST
    assert again.outcome is Outcome.SUCCEEDED
    assert handler.count == 1
    outcomes = [a.outcome for a in stored(aws, occ)[1]]
    assert outcomes == [AttemptOutcome.LOST, AttemptOutcome.LOST, AttemptOutcome.SUCCEEDED]


def delivered(aws: Services) -> tuple[str, str, Any]:
    """A rate schedule's first occurrence, relayed and received: (schedule, occurrence, its
    delivery)."""
    sid, [occ, *_] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    [delivery] = receive(aws)
    return sid, occ, delivery


def update_whose_api_dies(services: Services, sid: str) -> None:
    """Version 2 of the schedule committed; its API dies before settling version 1's
    occurrences (they stay as they were)."""
    plane = ControlPlane(services)

    def died(*args: Any, **kw: Any) -> list[Occurrence]:
        raise RuntimeError("the API's Lambda died after the commit")

    plane.occurrences.open_for_schedule = died  # type: ignore[method-assign]
    with contextlib.suppress(RuntimeError):
        plane.update("alice", sid, if_match=1, changes={"payload": {"v": 2}})


def test_worker_stale_claim_that_cannot_be_withdrawn_is_refused_after_its_lease(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence of version 1, and an update of its schedule that commits between
    # the worker's read and its claim (its API died before settling version 1's occurrences)
    sid, occ, delivery = delivered(aws)
    handler = Calls()
    work = worker(aws, handler)
    real_claim, real_withdraw = work.runs.claim, work.runs.withdraw

    def claim_after_an_update(lease: Any, **kwargs: Any) -> None:
        update_whose_api_dies(aws, sid)
        real_claim(lease, **kwargs)

    def withdraw_throttled(*args: Any, **kwargs: Any) -> None:
        raise Retryable("DynamoDB is busy")

    work.runs.claim = claim_after_an_update  # type: ignore[method-assign]
    work.runs.withdraw = withdraw_throttled  # type: ignore[method-assign]
    # WHEN the worker finds the change after its claim but cannot undo the claim
    result = work.process(delivery)
    # THEN the handler does not run; the message comes back when the lease runs out
    assert (result.outcome, result.visible_in) == (Outcome.IN_PROGRESS, 60)
    assert handler.count == 0
    # WHEN it comes back after the lease, to a worker that can write again
    work.runs.claim, work.runs.withdraw = real_claim, real_withdraw  # type: ignore[method-assign]
    clock.advance(61)
    again = work.process(redeliver(aws, delivery))
    # THEN the stale run is refused (version 2 now), never run, and the message dropped
    assert again.outcome is Outcome.STALE
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.CANCELED
    assert again.delete


def test_worker_reads_its_occurrence_and_schedule_strongly_consistent_before_a_claim(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a DynamoDB that serves every eventually consistent read a minute stale, and an
    # occurrence of version 1 whose schedule was updated through it a moment before the
    # worker reads (the update's API died before settling version 1's occurrences)
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    stale = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    sid, _, delivery = delivered(aws)
    update_whose_api_dies(stale, sid)
    claims: list[str] = []  # a claim's transaction takes a concurrency slot (tenants table)

    def transaction(params: dict[str, Any], **_: Any) -> None:
        for action in params["TransactItems"]:
            for body in action.values():
                if body["TableName"] == aws.settings.tenants_table:
                    claims.append(str(body["Key"]))

    aws.dynamodb.meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", transaction
    )
    handler = Calls()
    # WHEN a worker on that DynamoDB processes the message
    result = Worker(stale, "alice", handler, rng=random.Random(7)).process(delivery)
    # THEN its read saw version 2: refused before any claim (a stale read would have
    # claimed, then found the change and undone the claim), never run
    assert result.outcome is Outcome.STALE
    assert claims == []
    assert handler.count == 0


def test_worker_check_after_its_claim_sees_a_change_committed_a_moment_before_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a DynamoDB that serves every eventually consistent read a minute stale, an
    # occurrence of version 1 whose message a worker on it has read, and an update of the
    # schedule committed through it between that read and the claim (its API died before
    # settling version 1's occurrences, so only the worker's check can refuse the run)
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    stale = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    sid, occ, delivery = delivered(aws)
    handler = Calls()
    work = worker(stale, handler)
    real_claim = work.runs.claim

    def claim_a_moment_after_an_update(lease: Any, **kwargs: Any) -> None:
        update_whose_api_dies(stale, sid)
        clock.advance(1)
        real_claim(lease, **kwargs)

    work.runs.claim = claim_a_moment_after_an_update  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN its check after the claim saw version 2 (a stale read would show version 1 and
    # run a superseded occurrence): the claim undone, the handler never ran
    assert result.outcome is Outcome.STALE
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.CANCELED


def test_worker_claim_whose_schedule_is_gone_by_the_check_after_it_is_withdrawn(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose schedule's record is deleted between the worker's claim and
    # its check after the claim (a purge of the item, as its retention ends)
    sid, occ, delivery = delivered(aws)
    handler = Calls()
    work = worker(aws, handler)
    real_claim = work.runs.claim

    def claim_then_the_schedule_goes(lease: Any, **kwargs: Any) -> None:
        real_claim(lease, **kwargs)
        aws.dynamodb.delete_item(
            TableName=aws.settings.schedules_table, Key=to_dynamo(current_key(sid))
        )

    work.runs.claim = claim_then_the_schedule_goes  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN the claim is undone and the run refused as stale: never run, the message dropped
    assert (result.outcome, result.detail) == (Outcome.STALE, "the schedule no longer exists")
    assert handler.count == 0
    assert stored(aws, occ)[0].state is S.CANCELED
    assert result.delete


def test_worker_runs_an_occurrence_made_before_a_rename_and_the_rename_is_no_cancel(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence of version 1 in the queue, and its schedule renamed (version 2,
    # running as version 1); then renamed again while its handler runs
    sid, [occ] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    answer = patch(alice, sid, {"name": "renamed"}, version=1)
    assert answer.status == 200, answer.body
    checks: list[bool] = []

    def cooperative(job: Job) -> None:
        again = patch(alice, sid, {"name": "again"}, version=2)
        assert again.status == 200, again.body
        clock.advance(60)  # (past the cancel check's cache)
        checks.append(job.canceled())

    [result] = consumer(worker(aws, cooperative)).poll_once()
    # THEN the worker runs it (not stale), the cooperative check says "not canceled", and it
    # SUCCEEDED
    assert result.outcome is Outcome.SUCCEEDED, result
    assert checks == [False]
    assert stored(aws, occ)[0].state is S.SUCCEEDED


def test_worker_cooperative_cancel_check_that_is_throttled_is_not_a_cancel(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a running handler that checks job.canceled(), and the (eventually consistent)
    # read of its schedule throttled
    [occ] = due(aws, clock)
    checks: list[bool] = []

    def cooperative(job: Job) -> None:
        throttled_schedule_reads(aws, monkeypatch, consistent=False)
        checks.append(job.canceled())

    [result] = consumer(worker(aws, cooperative)).poll_once()
    # THEN the check says "not canceled" (not known), and the run goes on to succeed
    assert checks == [False]
    assert result.outcome is Outcome.SUCCEEDED
    assert stored(aws, occ)[0].state is S.SUCCEEDED


def test_worker_last_occurrence_of_a_completed_one_shot_still_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, which the materializer plans and marks COMPLETED
    at = int(clock.now) + 3600
    definition = ScheduleDefinition.model_validate(
        {
            "target": "default",
            "spec": {"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()},
        }
    )
    sid = ControlPlane(aws).create("alice", definition).schedule.schedule_id
    clock.now = at - 60
    Materializer(aws, "m1").run_shard(int(clock.now), shard_of(sid, aws.settings.shard_count))
    assert ControlPlane(aws).get("alice", sid).state is ScheduleState.COMPLETED
    [occ] = [o.occurrence_id for o in aws.occurrences.open_for_schedule(sid, since=0)]
    clock.now = at
    relay(aws, occ)
    handler = Calls()
    # WHEN its message is delivered
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN it is not refused as stale: a completed schedule keeps its version
    assert result.outcome is Outcome.SUCCEEDED
    assert handler.count == 1


# --- overlap control (SKIP_IF_RUNNING) --------------------------------------------------------


def two_due(aws: Services, clock: Clock, **fields: Any) -> tuple[str, list[str]]:
    """A rate(1 minute) schedule with its first two occurrences due and relayed."""
    sid, occurrences = rate_schedule(aws, "rate(1 minute)", **fields)
    clock.advance(60)
    relay(aws, *occurrences[:2])
    return sid, occurrences


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


# --- overlap control (QUEUE_ONE) -------------------------------------------------------------


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


# --- cooperative cancel ------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["cancel", "pause", "update"])
def test_worker_cooperative_cancel_is_seen_once_the_cache_expires(
    alice: Api, aws: Services, clock: Clock, change: str
):
    # GIVEN a running handler that checks job.canceled() (cached for 5 s)
    sid, [occ] = rate_schedule(aws, "rate(10 minutes)")
    relay(aws, occ)
    checks: list[bool] = []
    plane = ControlPlane(aws)

    def cooperative(job: Job) -> None:
        checks.append(job.canceled())
        # WHEN the schedule is canceled, paused or updated while it runs (each makes this
        # occurrence one the schedule no longer wants)
        if change == "cancel":
            plane.cancel("alice", sid)
        elif change == "pause":
            plane.pause("alice", sid)
        else:
            plane.update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
        checks.append(job.canceled())  # within the cache: the old answer
        clock.advance(5)
        checks.append(job.canceled())
        checks.append(job.canceled())  # stays canceled

    [result] = consumer(worker(aws, cooperative)).poll_once()
    # THEN the handler sees it once the cache (5 s unless the worker says otherwise) has
    # expired, and stopped on its own
    assert checks == [False, False, True, True]
    assert result.outcome is Outcome.SUCCEEDED


# --- the Lambda feed -------------------------------------------------------------------------


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


def message_ids(event: dict[str, Any]) -> dict[str, str]:
    """occurrence id (or the raw body) -> messageId."""
    found = {}
    for r in event["Records"]:
        try:
            found[json.loads(r["body"])["occurrence_id"]] = r["messageId"]
        except ValueError:
            found[r["body"]] = r["messageId"]
    return found


def test_worker_lambda_handler_reports_exactly_the_kept_messages(aws: Services, clock: Clock):
    # GIVEN alice (1 at a time), and in her queue: a good occurrence, a flaky one, a
    # re-delivery of one already SUCCEEDED (a relay resend), and an unreadable body
    bootstrap("alice", ALICE, max_concurrency=1)
    good, flaky, done, blocking, throttled = due(aws, clock, 5)
    deliveries = by_occurrence(receive(aws))
    assert worker(aws, Calls()).process(deliveries[done]).outcome is Outcome.SUCCEEDED
    url = url_of(aws)
    aws.sqs.send_message(QueueUrl=url, MessageBody=deliveries[done].body)
    aws.sqs.send_message(QueueUrl=url, MessageBody="{not json")
    for occ in (good, flaky):
        aws.sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=deliveries[occ].receipt_handle, VisibilityTimeout=0
        )

    def handler(job: Job) -> None:
        if job.occurrence_id == flaky:
            raise Flaky("503")

    work = worker(aws, handler)
    lambda_handler = sqs_lambda_handler(work)
    event = sqs_event(aws)
    ids = message_ids(event)
    assert set(ids) == {good, flaky, done, "{not json"}
    # WHEN Lambda invokes the handler with the batch
    answer = lambda_handler(event, LambdaContextStub())
    # THEN only the kept message (RETRY) is a batch item failure; the done ones (SUCCEEDED,
    # ALREADY_DONE, REJECTED) are left for Lambda to delete
    assert answer == {"batchItemFailures": [{"itemIdentifier": ids[flaky]}]}
    assert dict(work.stats) == {
        Outcome.SUCCEEDED: 1,
        Outcome.RETRY: 1,
        Outcome.ALREADY_DONE: 1,
        Outcome.REJECTED: 1,
    }
    assert (state(aws, good), state(aws, flaky)) == (S.SUCCEEDED, S.RETRY_WAIT)
    [retried] = [r for r in event["Records"] if r["messageId"] == ids[flaky]]
    aws.sqs.delete_message(QueueUrl=url, ReceiptHandle=retried["receiptHandle"])

    # AND a message throttled by the quota is kept too, next to a done one
    seen: dict[str, Any] = {}

    def hold_the_slot(job: Job) -> None:
        aws.sqs.send_message(QueueUrl=url, MessageBody=deliveries[done].body)
        aws.sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=deliveries[throttled].receipt_handle, VisibilityTimeout=0
        )
        event = sqs_event(aws)
        seen["ids"] = message_ids(event)
        seen["answer"] = lambda_handler(event, LambdaContextStub())

    assert worker(aws, hold_the_slot).process(deliveries[blocking]).outcome is Outcome.SUCCEEDED
    assert set(seen["ids"]) == {throttled, done}
    assert seen["answer"] == {"batchItemFailures": [{"itemIdentifier": seen["ids"][throttled]}]}
    assert state(aws, throttled) is S.SCHEDULED


def test_worker_lambda_handler_batch_of_only_kept_messages_returns_its_failures(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a batch of one message whose handler fails transiently
    due(aws, clock)

    def flaky(job: Job) -> None:
        raise Flaky("503")

    lambda_handler = sqs_lambda_handler(worker(aws, flaky))
    event = sqs_event(aws)
    # WHEN Lambda invokes the handler
    answer = lambda_handler(event, LambdaContextStub())
    # THEN the invocation succeeds and reports that one message as kept, as the poll
    # consumer would keep it
    assert answer == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}


# --- rejected messages --------------------------------------------------------------------


def _bob_body(aws: Services, clock: Clock) -> dict[str, Any]:
    """A real message of bob's, taken from his queue."""
    occ = one_shot(aws, clock, tenant="bob")
    clock.advance(30)
    Relay(aws).relay([record(aws, occ, 1)])
    [delivery] = receive(aws, queue_name("punctual", "bob", "default"))
    body: dict[str, Any] = json.loads(delivery.body)
    return body


def _alice_body(aws: Services, clock: Clock) -> dict[str, Any]:
    """A real message of alice's (taken out of her queue)."""
    due(aws, clock)
    [delivery] = receive(aws)
    aws.sqs.delete_message(QueueUrl=delivery.queue_url, ReceiptHandle=delivery.receipt_handle)
    body: dict[str, Any] = json.loads(delivery.body)
    return body


BODIES: dict[str, Callable[[Services, Clock], str]] = {
    "not json": lambda aws, clock: "{not json",
    "a json list": lambda aws, clock: "[1, 2]",
    "version 2": lambda aws, clock: json.dumps({**_alice_body(aws, clock), "version": 2}),
    "missing fields": lambda aws, clock: json.dumps({"version": 1, "occurrence_id": "occ_x"}),
    "bob's message": lambda aws, clock: json.dumps(_bob_body(aws, clock)),
    "bob's occurrence claimed as alice's": lambda aws, clock: json.dumps(
        {**_bob_body(aws, clock), "tenant_id": "alice"}
    ),
    "not an occurrence id": lambda aws, clock: json.dumps(
        {**_alice_body(aws, clock), "occurrence_id": "occ_does_not_exist"}
    ),
    "an id naming another instant": lambda aws, clock: json.dumps(
        _shifted(aws, clock, id_only=True)
    ),
    "an unknown occurrence": lambda aws, clock: json.dumps(_shifted(aws, clock, id_only=False)),
}


def _shifted(aws: Services, clock: Clock, *, id_only: bool) -> dict[str, Any]:
    """Alice's message for an instant a minute later that was never planned: the id alone
    (then the body contradicts itself), or the id and the instant (a well-formed unknown)."""
    body = _alice_body(aws, clock)
    later = int(datetime.fromisoformat(body["scheduled_for"]).timestamp()) + 60
    body["occurrence_id"] = occurrence_id(body["schedule_id"], body["schedule_version"], later)
    if not id_only:
        body["scheduled_for"] = utc_text(later)
    return body


@pytest.mark.parametrize("kind", list(BODIES))
def test_worker_rejects_what_is_not_an_occurrence_message_of_this_tenant(
    alice: Api, bob: Api, aws: Services, clock: Clock, kind: str
):
    # GIVEN a message in alice's queue that is not one of her version 1 occurrence messages
    body = BODIES[kind](aws, clock)
    aws.sqs.send_message(QueueUrl=url_of(aws), MessageBody=body)
    handler = Calls()
    # WHEN alice's worker receives it
    [result] = consumer(worker(aws, handler)).poll_once()
    # THEN it is REJECTED: the handler never ran, it is in the DLQ with a dead_reason, it
    # is deleted from the queue, and no occurrence (bob's included) was touched
    assert result.outcome is Outcome.REJECTED
    assert handler.count == 0
    [(dead_body, reason)] = dead_letters(aws)
    assert dead_body == body
    assert reason
    # what the worker reports (logs, on_result) says why; the DLQ's attribute keeps 256
    assert result.detail
    assert reason == result.detail[:256]
    if kind == "an unknown occurrence":
        assert result.detail == "no such occurrence"
    if kind == "bob's occurrence claimed as alice's":
        # (refused by its schedule id before any read: on AWS her role could not read it)
        assert result.detail == "a message of another tenant's schedule"
    assert depth(aws) == 0
    if kind.startswith("bob"):
        bobs = json.loads(body)["occurrence_id"]
        assert stored(aws, bobs)[0].state is S.SCHEDULED
        assert stored(aws, bobs)[0].attempt_count == 0


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


# --- lost races, transient faults and the slot scan ------------------------------------------


@pytest.mark.parametrize("fault", ["lost race", "throttled"])
def test_worker_claim_that_loses_every_round_leaves_the_message_for_a_later_delivery(
    alice: Api, aws: Services, clock: Clock, fault: str
):
    # GIVEN every claim transaction is refused: a race lost each time (the occurrence moved
    # between the read and the write), or throttled
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    handler = Calls()
    spy = SpySQS(aws.sqs)
    work = worker(with_sqs(aws, spy), handler)
    claims: list[int] = []

    def refused(lease: Any, **_: Any) -> None:
        claims.append(lease.attempt_no)
        raise ConditionFailed(Label.OCCURRENCE, None) if fault == "lost race" else Retryable("slow")

    work.runs.claim = refused  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN it read and tried again CLAIM_ATTEMPTS times, then kept the message (not deleted,
    # not in the DLQ) for a later delivery within the throttle back-off; nothing ran
    assert claims == [1] * CLAIM_ATTEMPTS
    assert (result.outcome, result.detail) == (
        Outcome.IN_PROGRESS,
        "contended; left for a later delivery",
    )
    assert not result.delete
    assert result.visible_in is not None
    assert THROTTLE_BACKOFF[0] <= result.visible_in <= THROTTLE_BACKOFF[1]
    assert spy.visibility == [(delivery.receipt_handle, result.visible_in)]
    assert handler.count == 0
    assert state(aws, occ) is S.SCHEDULED
    assert dead_letters(aws) == []


def test_worker_claim_that_loses_one_race_reads_again_and_runs(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the first claim transaction loses a race, the second does not
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    handler = Calls()
    work = worker(aws, handler)
    real = work.runs.claim
    claims: list[int] = []

    def first_refused(lease: Any, **kwargs: Any) -> None:
        claims.append(lease.attempt_no)
        if len(claims) == 1:
            raise ConditionFailed(Label.OCCURRENCE, None)
        real(lease, **kwargs)

    work.runs.claim = first_refused  # type: ignore[method-assign]
    # WHEN the worker processes the message; THEN the second round claims it and it runs once
    assert work.process(delivery).outcome is Outcome.SUCCEEDED
    assert claims == [1, 1]
    assert handler.count == 1
    assert outcomes(aws, occ) == [AttemptOutcome.SUCCEEDED]


@pytest.mark.parametrize(("fault", "ours"), [("throttled", True), ("taken over", False)])
def test_worker_heartbeat_under_a_fault_keeps_the_lease_only_if_it_is_still_ours(
    alice: Api, aws: Services, clock: Clock, fault: str, ours: bool
):
    # GIVEN a running job whose heartbeat's write is throttled, or refused (another worker
    # took the lease over)
    due(aws, clock)
    [delivery] = receive(aws)
    spy = SpySQS(aws.sqs)
    work = worker(with_sqs(aws, spy), Calls())
    seen: dict[str, Any] = {}

    def refused(lease: Any, expires_at: int) -> None:
        raise Retryable("slow") if fault == "throttled" else ConditionFailed(Label.OCCURRENCE, None)

    def job(job: Job) -> None:
        work.runs.extend = refused  # type: ignore[method-assign]
        clock.advance(30)
        # WHEN the handler heartbeats twice
        seen["beats"] = [job.heartbeat(), job.heartbeat()]
        seen["lost"] = job.lease_lost
        seen["visibility"] = list(spy.visibility)

    work.handler = job
    work.process(delivery)
    # THEN a throttled beat says the lease is still ours (the next beat tries again) and a
    # refused one says it is lost, for good; neither extends the message's visibility
    # (only the claim set it)
    assert seen["beats"] == [ours, ours]
    assert seen["lost"] is (not ours)
    assert seen["visibility"] == [(delivery.receipt_handle, 60)]


def test_worker_heartbeat_thread_beats_on_after_a_failed_beat(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a worker heartbeating on a thread every 10 ms, whose first beat fails with an
    # SQS error (the visibility change), the lease extension having been written
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    failures: list[int] = []

    class FailOnce(SpySQS):
        def change_message_visibility(self, **kwargs: Any) -> Any:
            if len(self.visibility) == 1 and not failures:  # the claim's change went through
                failures.append(1)
                raise ClientError({"Error": {"Code": "InternalError"}}, "ChangeMessageVisibility")
            return super().change_message_visibility(**kwargs)

    spy = FailOnce(aws.sqs)
    seen: dict[str, Any] = {}

    def slow(job: Job) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(spy.visibility) < 3:
            time.sleep(0.01)
        seen["visibility"] = len(spy.visibility)
        seen["lost"] = job.lease_lost

    # WHEN the handler runs while the thread beats
    result = worker(with_sqs(aws, spy), slow, heartbeat_seconds=0.01).process(delivery)
    # THEN the thread beat again after the failure: the message's visibility was extended
    # by later beats, the lease is still ours, and the run succeeded
    assert failures == [1]
    assert seen["visibility"] >= 3
    assert seen["lost"] is False
    assert result.outcome is Outcome.SUCCEEDED
    assert state(aws, occ) is S.SUCCEEDED


@pytest.mark.parametrize(("limit", "scanned"), [(SLOT_PROBES + 4, True), (SLOT_PROBES, False)])
def test_worker_slots_all_probed_busy_are_followed_by_a_scan_of_every_slot(
    aws: Services, clock: Clock, limit: int, scanned: bool
):
    # GIVEN alice may run ``limit`` at a time, and every slot the worker probes first looks
    # busy (the others are free)
    bootstrap("alice", ALICE, max_concurrency=limit)
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    held: list[dict[str, Any]] = []
    work = worker(aws, Calls(lambda job: held.extend(concurrency_slots(aws))))
    real = work.runs.busy_slots
    asked: list[list[int]] = []

    def probed_busy(tenant_id: str, candidates: list[int], now: int) -> set[int]:
        assert (tenant_id, now) == ("alice", int(clock.now))
        asked.append(list(candidates))
        return set(asked[0]) & set(candidates) | real(tenant_id, candidates, now)

    work.runs.busy_slots = probed_busy  # type: ignore[method-assign]
    # WHEN the worker looks for a slot
    result = work.process(delivery)
    # THEN with more slots than probes it reads them all and claims one it had not probed;
    # with no slot left unprobed it is throttled at once
    assert len(asked[0]) == SLOT_PROBES
    if scanned:
        assert asked[1:] == [list(range(limit))]
        assert result.outcome is Outcome.SUCCEEDED
        [slot] = [s for s in held if s.get("occurrence_id") == occ]
        assert int(str(slot["sk"]).removeprefix("RUN#")) not in asked[0]
    else:
        assert asked[1:] == []
        assert result.outcome is Outcome.THROTTLED


def test_worker_reads_the_tenant_limit_again_once_its_cache_expires(aws: Services, clock: Clock):
    # GIVEN alice may run 1 at a time and a worker that has read that limit
    bootstrap("alice", ALICE, max_concurrency=1)
    work = worker(aws, Calls())
    assert work._concurrency_limit() == 1
    # WHEN the operator raises it to 5
    aws.tenants.set_quotas(
        "alice", aws.tenants.get("alice").quotas.model_copy(update={"max_concurrency": 5})
    )
    # THEN the worker keeps the cached limit for TENANT_CACHE_SECONDS, then reads the new one
    clock.advance(TENANT_CACHE_SECONDS)
    assert work._concurrency_limit() == 1
    clock.advance(1)
    assert work._concurrency_limit() == 5


def test_worker_of_a_tenant_that_does_not_exist_says_so(aws: Services, clock: Clock):
    # GIVEN a worker for a tenant that was never created; WHEN it needs the tenant's limit
    # THEN it fails naming the tenant, instead of running without a limit
    with pytest.raises(ValueError, match="tenant ghost does not exist"):
        Worker(aws, "ghost", Calls())._concurrency_limit()


def test_worker_refusal_that_loses_its_race_reads_again(alice: Api, aws: Services, clock: Clock):
    # GIVEN an abandoned run whose schedule was paused meanwhile (the worker must refuse it
    # once its lease expired), and whose refusal write loses a race every time
    occ, delivery = abandoned(aws, clock)
    ControlPlane(aws).pause("alice", stored(aws, occ)[0].schedule_id)
    clock.advance(61)
    delivery = redeliver(aws, delivery)
    work = worker(aws, Calls())
    real = work.runs.refuse
    refusals: list[str] = []

    def lost(occurrence_id: str, **kwargs: Any) -> bool:
        refusals.append(kwargs["reason"])
        return False

    work.runs.refuse = lost  # type: ignore[method-assign]
    # WHEN the worker processes the message
    result = work.process(delivery)
    # THEN each lost refusal is a lost race, read again: no verdict is reported on a write
    # that did not happen, and after CLAIM_ATTEMPTS the message is left for a later delivery
    assert len(refusals) == CLAIM_ATTEMPTS
    assert result.outcome is Outcome.IN_PROGRESS
    assert not result.delete
    assert state(aws, occ) is S.RUNNING
    # AND once the refusal is written, the verdict carries its reason
    work.runs.refuse = real  # type: ignore[method-assign]
    refused = work.process(delivery)
    assert refused.outcome is Outcome.STALE
    assert refused.detail == refusals[0]
    assert "version 2" in refused.detail
    assert state(aws, occ) is S.CANCELED


def test_worker_dead_verdict_that_loses_its_race_to_a_late_completion_is_not_dead_lettered(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-attempt occurrence whose worker stalled mid-run; after its lease expired
    # the next worker reads it and finds its attempts exhausted
    occ, delivery = abandoned(aws, clock, retry={"max_attempts": 1})
    clock.advance(61)
    again = redeliver(aws, delivery)
    item = stored(aws, occ)[0]
    assert item.lease_token is not None
    stalled = RunLease(
        occ, "alice", item.schedule_id, 1, item.lease_token, item.lease_expires_at or 0, 0, False
    )
    work = worker(aws, Calls())
    real = work.runs.refuse
    returned: list[bool] = []

    def late_completion_first(occurrence_id: str, **kwargs: Any) -> bool:
        if not returned:
            # WHEN the stalled worker returns and completes between that read and the
            # DEAD refusal's write
            work.runs.finish(
                stalled, state=S.SUCCEEDED, outcome=AttemptOutcome.SUCCEEDED, now=int(clock.now)
            )
        returned.append(real(occurrence_id, **kwargs))
        return returned[-1]

    work.runs.refuse = late_completion_first  # type: ignore[method-assign]
    result = work.process(again)
    # THEN the refusal's write is refused, the worker reads again and finds it done: it
    # reports no DEAD and sends nothing to the DLQ
    assert returned == [False]
    assert result.outcome is Outcome.ALREADY_DONE
    assert state(aws, occ) is S.SUCCEEDED
    assert dead_letters(aws) == []


class SendSpy(SpySQS):
    """Also records every SendMessage's queue and delay."""

    def __init__(self, real: Any) -> None:
        super().__init__(real)
        self.sent: list[tuple[str, int | None]] = []

    def send_message(self, **kwargs: Any) -> Any:
        self.sent.append((kwargs["QueueUrl"], kwargs.get("DelaySeconds")))
        return self.real.send_message(**kwargs)


def test_worker_requeue_delays_the_copy_by_what_the_outcome_says_within_sqs_bounds(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a message on its 10th receive while another worker holds a 20-minute lease on
    # its occurrence, and another whose completion loses the lease (no time to wait given)
    [held, lost] = due(aws, clock, 2)
    deliveries = by_occurrence(receive(aws))
    spy = SendSpy(aws.sqs)
    seen: dict[str, Result] = {}

    def long_job(job: Job) -> None:
        tenth = replace_receive_count(deliveries[held], REQUEUE_AFTER_RECEIVES)
        seen["held"] = worker(with_sqs(aws, spy), Calls()).process(tenth)

    worker(aws, long_job, lease_seconds=1200).process(deliveries[held])
    work = worker(with_sqs(aws, spy), Calls())

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ConditionFailed(Label.OCCURRENCE, None)

    work.runs.finish = refused  # type: ignore[method-assign]
    seen["lost"] = work.process(replace_receive_count(deliveries[lost], REQUEUE_AFTER_RECEIVES))
    # THEN each is replaced by a fresh copy (the original deleted): the first delayed by the
    # longest delay SQS allows (900 s, the lease had 1,200 s left), the second at once
    assert (seen["held"].outcome, seen["held"].visible_in) == (Outcome.IN_PROGRESS, 1200)
    assert (seen["lost"].outcome, seen["lost"].visible_in) == (Outcome.LEASE_LOST, None)
    assert seen["held"].requeued
    assert seen["lost"].requeued
    assert spy.sent == [(url_of(aws), 900), (url_of(aws), 0)]


def replace_receive_count(delivery: Delivery, count: int) -> Delivery:
    return Delivery(
        delivery.body, delivery.receipt_handle, delivery.queue_url, count, delivery.sent_at
    )


def test_queue_url_of_asks_for_the_queue_of_the_account_in_the_arn():
    # GIVEN an SQS client in the tenant's account (the queue is in Punctual's)
    asked: list[dict[str, str]] = []

    class Sqs:
        def get_queue_url(self, **kwargs: str) -> dict[str, str]:
            asked.append(kwargs)
            return {"QueueUrl": "https://sqs/999988887777/punctual-alice-default"}

    # WHEN the worker turns the event source's ARN into the queue URL
    url = queue_url_of(Sqs(), "arn:aws:sqs:us-east-1:999988887777:punctual-alice-default")
    # THEN it names the owner account: without it SQS looks in the caller's own account
    assert asked == [
        {"QueueName": "punctual-alice-default", "QueueOwnerAWSAccountId": "999988887777"}
    ]
    assert url == "https://sqs/999988887777/punctual-alice-default"


class EmptyReceives(SpySQS):
    """An SQS whose receives find nothing (SQS then leaves Messages out of the answer), the
    first ``failures`` of them failing; records each receive's arguments."""

    def __init__(self, real: Any, failures: int = 0) -> None:
        super().__init__(real)
        self.failures = failures
        self.receives: list[dict[str, Any]] = []

    def receive_message(self, **kwargs: Any) -> Any:
        self.receives.append(kwargs)
        if len(self.receives) <= self.failures:
            raise ClientError({"Error": {"Code": "InternalError"}}, "ReceiveMessage")
        if len(self.receives) == self.failures + 1:
            return {}
        return self.real.receive_message(**kwargs)


def test_consumer_long_polls_20_s_and_an_empty_receive_is_no_work(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a consumer with its default settings on an empty queue
    spy = EmptyReceives(aws.sqs)
    work = worker(with_sqs(aws, spy), Calls())
    # WHEN it polls once; THEN it long-polls for 20 s (the longest SQS allows: fewest empty
    # receives) and the empty answer is no results
    assert QueueConsumer(work, url_of(aws)).poll_once() == []
    assert spy.receives[0]["WaitTimeSeconds"] == 20


def test_consumer_run_polls_on_after_a_failed_receive_until_stopped(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence in the queue and an SQS whose first receive fails
    [occ] = due(aws, clock)
    spy = EmptyReceives(aws.sqs, failures=1)
    handled = threading.Event()
    work = worker(with_sqs(aws, spy), Calls(lambda job: handled.set()))
    stop = threading.Event()
    loop = threading.Thread(
        target=QueueConsumer(work, url_of(aws), wait_seconds=0, threads=1).run, args=(stop,)
    )
    # WHEN the consumer runs
    loop.start()
    ran = handled.wait(10)
    stop.set()
    loop.join(10)
    # THEN after the failure it waited and polled again, ran the occurrence, and stopped
    # when told
    assert ran
    assert not loop.is_alive()
    assert len(spy.receives) >= 3
    assert state(aws, occ) is S.SUCCEEDED


def test_worker_lambda_handler_passes_receive_count_and_sent_time_and_counts_outcomes(
    alice: Api, aws: Services, clock: Clock, capsys: pytest.CaptureFixture[str]
):
    # GIVEN an occurrence's message on its 10th receive by Lambda, whose handler fails
    [occ] = due(aws, clock)
    event = sqs_event(aws)
    [record] = event["Records"]
    record["attributes"]["ApproximateReceiveCount"] = str(REQUEUE_AFTER_RECEIVES)
    sent_at = int(record["attributes"]["SentTimestamp"]) // 1000

    def flaky(job: Job) -> None:
        raise Flaky("503")

    capsys.readouterr()
    # WHEN Lambda invokes the handler
    answer = sqs_lambda_handler(worker(aws, flaky))(event, LambdaContextStub())
    # THEN the claim recorded the message's SentTimestamp; the RETRY on the 10th receive was
    # replaced by a fresh copy, so the original is not reported kept (Lambda deletes it);
    # and one Retried metric (a Count) was emitted
    assert stored(aws, occ)[0].enqueued_at == sent_at
    assert answer == {"batchItemFailures": []}
    assert depth(aws) == 2  # the original (in flight, Lambda deletes it) and the copy
    units = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("{") and "_aws" in line:
            blob = json.loads(line)
            for directive in blob["_aws"]["CloudWatchMetrics"]:
                for metric in directive["Metrics"]:
                    units[metric["Name"]] = (metric["Unit"], blob[metric["Name"]])
    assert units == {"Retried": ("Count", [1.0])}


def test_consumer_takes_up_to_10_messages_a_poll_and_acks_them_in_one_batch(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three occurrences in alice's queue
    made = due(aws, clock, 3)
    acks: list[list[str]] = []

    class AckSpy(SpySQS):
        def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
            acks.append([e["Id"] for e in Entries])
            answer = super().delete_message_batch(QueueUrl=QueueUrl, Entries=Entries)
            # SQS's JSON protocol leaves an empty list out: no "Failed" when none failed
            return {k: v for k, v in answer.items() if v != []}

    handler = Calls()
    work = worker(with_sqs(aws, AckSpy(aws.sqs)), handler)
    # WHEN a consumer polls once
    results = consumer(work).poll_once()
    # THEN it received all three at once, ran each (the worker's counts say so), and
    # deleted them in one batch whose entry ids are distinct (SQS refuses repeated ids)
    assert [r.outcome for r in results] == [Outcome.SUCCEEDED] * 3
    assert dict(work.stats) == {Outcome.SUCCEEDED: 3}
    assert sorted(j.occurrence_id for j in handler.jobs) == sorted(made)
    [ids] = acks
    assert len(set(ids)) == 3
    assert depth(aws) == 0


def test_consumer_replaces_a_message_kept_on_its_10th_receive(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence's message already received 9 times (SQS counts them), whose
    # handler fails transiently
    [occ] = due(aws, clock)
    for _ in range(REQUEUE_AFTER_RECEIVES - 1):
        make_visible(aws, receive(aws)[0])

    def flaky(job: Job) -> None:
        raise Flaky("503")

    # WHEN the consumer receives it the 10th time
    spy = SendSpy(aws.sqs)
    [result] = consumer(worker(with_sqs(aws, spy), flaky)).poll_once()
    # THEN the consumer read the receive count from SQS: the kept message is replaced by a
    # fresh copy (receive count 0), delayed by the back-off, instead of nearing the queue's
    # redrive to the DLQ; the original is deleted
    assert result.outcome is Outcome.RETRY
    assert result.requeued
    assert spy.sent == [(url_of(aws), result.visible_in)]
    assert depth(aws) == 1
    assert state(aws, occ) is S.RETRY_WAIT


def test_worker_completion_throttled_every_time_is_tried_four_times_then_raised(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a run whose completion write is throttled every time it is tried
    [occ] = due(aws, clock)
    [delivery] = receive(aws)
    work = worker(aws, Calls())
    finishes: list[int] = []
    sleeps: list[float] = []

    def throttled(lease: Any, **kwargs: Any) -> None:
        finishes.append(lease.attempt_no)
        raise Retryable("throttled")

    work.runs.finish = throttled  # type: ignore[method-assign]
    monkeypatch.setattr(work, "services", dataclasses.replace(aws, sleep=sleeps.append))
    # WHEN the handler returns; THEN the same fenced completion is tried FINISH.tries times
    # with a jittered pause whose bound doubles, and the fault is raised (the message stays,
    # its lease runs out and a redelivery takes over): never reported done without the write
    with pytest.raises(Retryable):
        work.process(delivery)
    assert finishes == [1] * FINISH.tries
    assert len(sleeps) == FINISH.tries - 1
    assert all(0 <= pause <= FINISH.ceiling(n) for n, pause in enumerate(sleeps))
    assert state(aws, occ) is S.RUNNING


class Edge(random.Random):
    """A random generator whose uniform draws are always the low (or high) end."""

    def __init__(self, high: bool) -> None:
        super().__init__(7)
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


@pytest.mark.parametrize("high", [False, True])
def test_worker_backoff_is_full_jitter_from_zero_to_the_ceiling(
    alice: Api, aws: Services, clock: Clock, high: bool
):
    # GIVEN a handler that fails transiently, and draws at each end of the jitter's range
    due(aws, clock, retry={"backoff_base_seconds": 10})
    # WHEN it fails its first attempt
    [result] = consumer(worker(aws, fail_transiently, rng=Edge(high))).poll_once()
    # THEN the retry waits anywhere from 0 s (full jitter, not "equal jitter") to the
    # ceiling: 10 s after attempt 1
    assert result.outcome is Outcome.RETRY
    assert result.visible_in == (10 if high else 0)


@pytest.mark.parametrize(("after", "outcome"), [(60, Outcome.SUCCEEDED), (61, Outcome.DEAD)])
def test_worker_deadline_admits_an_attempt_starting_exactly_at_it(
    alice: Api, aws: Services, clock: Clock, after: int, outcome: Outcome
):
    # GIVEN an occurrence with a 60 s deadline from when it became receivable
    [occ] = due(aws, clock, retry={"deadline_seconds": 60})
    clock.now = stored(aws, occ)[0].available_at + after
    # WHEN a worker gets it ``after`` seconds after that; THEN an attempt may start at the
    # deadline itself ("no attempt starts after available_at + deadline"), not a second later
    [result] = consumer(worker(aws, Calls())).poll_once()
    assert result.outcome is outcome


def test_worker_refuses_the_occurrence_of_a_schedule_that_no_longer_exists(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an abandoned run whose schedule's item is gone (removed by an operator)
    occ, delivery = abandoned(aws, clock)
    sid = stored(aws, occ)[0].schedule_id
    aws.dynamodb.delete_item(
        TableName=aws.settings.schedules_table, Key=to_dynamo(current_key(sid))
    )
    clock.advance(61)
    handler = Calls()
    # WHEN the message comes back after the lease expired
    result = worker(aws, handler).process(redeliver(aws, delivery))
    # THEN it is refused as stale, saying why, and the handler never ran
    assert (result.outcome, result.detail) == (Outcome.STALE, "the schedule no longer exists")
    assert state(aws, occ) is S.CANCELED
    assert handler.count == 0


def test_worker_message_visibility_stays_within_the_12_hours_sqs_allows(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a worker whose leases are longer than SQS's longest visibility timeout
    due(aws, clock)
    [delivery] = receive(aws)
    spy = SpySQS(aws.sqs)
    # WHEN it claims and runs the occurrence; THEN the message is hidden for a minute less
    # than 12 hours from its receive (SQS refuses more), not for the lease
    result = worker(with_sqs(aws, spy), Calls(), lease_seconds=50_000).process(delivery)
    assert result.outcome is Outcome.SUCCEEDED
    assert spy.visibility == [(delivery.receipt_handle, MAX_VISIBILITY)]
    assert MAX_VISIBILITY == 43_200 - 60
