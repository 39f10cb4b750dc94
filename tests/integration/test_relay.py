"""The relay on moto: delivery to the tenant's queue, crash after send, partial batch
failures, canceled occurrences, delays, tenant isolation, unknown targets, the handler."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.dal.tenants import TenantStore
from punctual.domain.errors import Retryable
from punctual.domain.occurrence import OccurrenceState
from punctual.domain.schedule import ScheduleDefinition
from punctual.integrations.queues import queue_name
from punctual.pipeline import relay as relay_module
from punctual.pipeline.relay import (
    QUEUE_CACHE_SECONDS,
    SEND,
    DelayTooLong,
    QueueDirectory,
    Relay,
    delay_seconds,
)
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB, FaultySQS, client_error
from tests.integration.conftest import BOB, Api, Clock, LambdaContextStub, bootstrap
from tests.integration.helpers import set_occurrence_state, table_items, wire


class Crash(Exception):
    pass


class SpySQS:
    """The real (moto) client, recording batches and failing chosen occurrence ids."""

    def __init__(self, real: Any, fail: dict[str, int] | None = None) -> None:
        self.real = real
        self.fail = dict(fail or {})  # occurrence id -> how many times to fail (-1: always)
        self.batches: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.batches.append({"QueueUrl": QueueUrl, "Entries": Entries})
        failed, passed = [], []
        for entry in Entries:
            occ = entry["MessageAttributes"]["occurrence_id"]["StringValue"]
            if self.fail.get(occ, 0) != 0:
                self.fail[occ] -= 1
                failed.append({"Id": entry["Id"], "SenderFault": False, "Code": "InternalError"})
            else:
                passed.append(entry)
        answer = self.real.send_message_batch(QueueUrl=QueueUrl, Entries=passed) if passed else {}
        # SQS's JSON protocol leaves an empty list out of the answer.
        found = {"Successful": answer.get("Successful", []), "Failed": failed}
        return {name: entries for name, entries in found.items() if entries}


def one_shot(aws: Services, clock: Clock, tenant: str = "alice", **fields: Any) -> str:
    """A one-shot 30 s ahead (the API materializes it); the clock then moves to its time."""
    at = datetime.fromtimestamp(clock.now + 30).astimezone().isoformat()
    definition = ScheduleDefinition.model_validate(
        {"target": "default", "spec": {"kind": "at", "at": at}, **fields}
    )
    saved = ControlPlane(aws).create(tenant, definition)
    return saved.materialized[0].occurrence_id


def record(aws: Services, occurrence_id: str, sequence: int) -> dict[str, Any]:
    raw = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occurrence_id)),
    )["Item"]
    return {
        "eventID": str(sequence),
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "dynamodb": {"NewImage": raw, "SequenceNumber": str(sequence), "Keys": {}},
    }


def state(aws: Services, occurrence_id: str) -> str:
    found = aws.occurrences.get_with_attempts(occurrence_id)
    assert found is not None
    return found[0].state.value


def reason(aws: Services, occurrence_id: str) -> str | None:
    found = aws.occurrences.get(occurrence_id)
    assert found is not None
    return found.reason


def messages(aws: Services, tenant: str) -> list[dict[str, Any]]:
    url = aws.sqs.get_queue_url(QueueName=queue_name("punctual", tenant, "default"))["QueueUrl"]
    got: list[dict[str, Any]] = []
    while True:
        batch = aws.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if not batch:
            return got
        got += [json.loads(m["Body"]) for m in batch]


def test_relay_delivers_to_the_tenants_queue_and_writes_nothing_back(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence inserted SCHEDULED, due now
    occ = one_shot(aws, clock, payload={"job": "report"})
    clock.advance(30)
    before = table_items(aws, aws.settings.occurrences_table)
    # WHEN the relay handles its stream record
    report = Relay(aws).relay([record(aws, occ, 1)])
    # THEN the message is in alice's queue with the documented body ...
    assert report.failures == {}
    [body] = messages(aws, "alice")
    assert body["occurrence_id"] == occ
    assert body["version"] == 1
    assert body["attempt"] == 1
    assert body["payload"] == {"job": "report"}
    # ... and the send cost no table write: the occurrence stays SCHEDULED until a worker
    # claims it (the claim records enqueued_at)
    assert table_items(aws, aws.settings.occurrences_table) == before
    assert state(aws, occ) == "SCHEDULED"


def test_relay_skips_only_the_records_it_does_not_send_never_the_rest_of_the_batch(
    alice: Api, bob: Api, aws: Services, clock: Clock
):
    # GIVEN one stream batch: a modification, two of bob's occurrences rewritten by his
    # worker to name alice, then alice's own occurrence
    own = one_shot(aws, clock)
    forged = [one_shot(aws, clock, tenant="bob") for _ in range(2)]
    for occ in forged:
        key = to_dynamo(occurrence_key(occ))
        aws.dynamodb.update_item(
            TableName=aws.settings.occurrences_table,
            Key=key,
            UpdateExpression="SET tenant_id = :t",
            ExpressionAttributeValues=to_dynamo({":t": "alice"}),
        )
    clock.advance(30)
    modified = record(aws, own, 1) | {"eventName": "MODIFY"}
    batch = [modified, record(aws, forged[0], 2), record(aws, forged[1], 3), record(aws, own, 4)]
    # WHEN the relay handles it
    report = Relay(aws).relay(batch)
    # THEN each record it does not send is skipped alone: both forgeries are refused and
    # counted, and alice's occurrence after them is sent, once
    assert (report.sent, report.refused, report.failures) == (1, 2, {})
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [own]
    assert messages(aws, "bob") == []


def test_relay_message_carries_the_documented_attributes(alice: Api, aws: Services, clock: Clock):
    # GIVEN an occurrence due now
    occ = one_shot(aws, clock)
    clock.advance(30)
    # WHEN the relay sends it
    Relay(aws).relay([record(aws, occ, 1)])
    # THEN its message has the attributes docs/message.md lists, each a String
    url = aws.sqs.get_queue_url(QueueName=queue_name("punctual", "alice", "default"))["QueueUrl"]
    [message] = aws.sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    attributes = {
        name: (value["DataType"], value["StringValue"])
        for name, value in message["MessageAttributes"].items()
    }
    schedule_id = json.loads(message["Body"])["schedule_id"]
    assert attributes == {
        "occurrence_id": ("String", occ),
        "schedule_id": ("String", schedule_id),
        "tenant_id": ("String", "alice"),
        "message_version": ("String", "1"),
    }


def test_relay_report_adds_up_every_queue_of_the_batch(
    alice: Api, bob: Api, aws: Services, clock: Clock
):
    # GIVEN one stream batch with two of alice's occurrences and one of bob's
    made = [one_shot(aws, clock), one_shot(aws, clock), one_shot(aws, clock, tenant="bob")]
    clock.advance(30)
    # WHEN the relay sends them (one queue each, concurrently)
    report = Relay(aws).relay([record(aws, occ, n) for n, occ in enumerate(made)])
    # THEN its report counts all three, with a lag for each
    assert report.sent == 3
    assert len(report.lags) == 3


def test_queue_directory_reads_a_target_once_per_cache_age_and_an_unknown_one_twice(
    alice: Api, aws: Services, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a directory, its reads of targets recorded, and its monotonic clock ours
    reads: list[tuple[str, str, bool]] = []
    real = TenantStore.get_target

    def get_target(store: TenantStore, tenant: str, name: str, *, consistent: bool = False) -> Any:
        reads.append((tenant, name, consistent))
        return real(store, tenant, name, consistent=consistent)

    monkeypatch.setattr(TenantStore, "get_target", get_target)
    now = [1_000.0]
    monkeypatch.setattr(relay_module.time, "monotonic", lambda: now[0])  # type: ignore[attr-defined]
    queues = QueueDirectory(aws)
    url = aws.sqs.get_queue_url(QueueName=queue_name("punctual", "alice", "default"))["QueueUrl"]
    # WHEN alice's target is looked up, again within the cache's age, then once it is over
    assert queues.url("alice", "default") == url
    now[0] += QUEUE_CACHE_SECONDS - 1
    assert queues.url("alice", "default") == url
    assert reads == [("alice", "default", False)]  # one read, eventually consistent
    now[0] += 1
    assert queues.url("alice", "default") == url
    assert len(reads) == 2
    # AND an unknown target is read again, strongly consistent, before it counts as
    # unknown, and is not cached
    assert queues.url("alice", "nope") is None
    assert queues.url("alice", "nope") is None
    assert reads[2:] == [("alice", "nope", False), ("alice", "nope", True)] * 2


def test_queue_directory_keeps_the_targets_used_last_when_it_is_full(
    alice: Api, aws: Services, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN three targets, and a directory holding two, its reads of targets counted
    reads: list[str] = []
    real = TenantStore.get_target

    def get_target(store: TenantStore, tenant: str, name: str, *, consistent: bool = False) -> Any:
        reads.append(name)
        return real(store, tenant, name, consistent=consistent)

    for name in ("second", "third"):
        assert alice.post("/v1/targets", {"name": name}).status == 201
    monkeypatch.setattr(TenantStore, "get_target", get_target)
    queues = QueueDirectory(aws, size=2)
    # WHEN three targets are used, the first one again before the third
    for name in ("default", "second", "default", "third"):
        assert queues.url("alice", name) is not None
    assert reads == ["default", "second", "third"]
    # THEN the one used least recently ("second") made room, the two others are kept
    for name in ("default", "third", "second"):
        queues.url("alice", name)
    assert reads == ["default", "second", "third", "second"]


def test_relay_crash_after_send_resends_the_same_occurrence_id(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a relay that crashes after SQS accepted the message, before the batch is done
    occ = one_shot(aws, clock)
    clock.advance(30)

    def crash(point: str) -> None:
        if point == "after_send":
            raise Crash(point)

    with pytest.raises(Crash):
        Relay(aws, crash=crash).relay([record(aws, occ, 1)])
    assert state(aws, occ) == "SCHEDULED"
    # WHEN the stream redelivers the record
    Relay(aws).relay([record(aws, occ, 1)])
    # THEN the same occurrence id was sent again (consumers dedupe), and nothing is lost
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [occ, occ]
    assert state(aws, occ) == "SCHEDULED"


def test_relay_partial_batch_failure_is_retried_alone(alice: Api, aws: Services, clock: Clock):
    # GIVEN two occurrences in one batch; SQS fails the first one's entry once
    first, second = one_shot(aws, clock), one_shot(aws, clock)
    clock.advance(30)
    spy = SpySQS(aws.sqs, fail={first: 1})
    relay = Relay(Services(aws.dynamodb, spy, aws.settings, aws.now))
    # WHEN the relay sends them
    report = relay.relay([record(aws, first, 1), record(aws, second, 2)])
    # THEN the failed entry was retried alone and both arrived once
    assert report.failures == {}
    assert [len(b["Entries"]) for b in spy.batches] == [2, 1]
    assert sorted(m["occurrence_id"] for m in messages(aws, "alice")) == sorted([first, second])


def test_relay_sends_at_most_ten_a_call_and_a_queues_strict_occurrences_first(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN eleven strict occurrences due now and two flexible ones receivable before them
    start = clock.now
    flexible: list[str] = []
    while len(flexible) < 2:  # (a jitter of 0 would make one strict: take another)
        at = datetime.fromtimestamp(start + 5).astimezone().isoformat()
        definition = ScheduleDefinition.model_validate(
            {"target": "default", "spec": {"kind": "at", "at": at}, "flexible_window_seconds": 20}
        )
        [made] = ControlPlane(aws).create("alice", definition).materialized
        if made.available_at > made.scheduled_for:
            flexible.append(made.occurrence_id)
    strict = [one_shot(aws, clock) for _ in range(11)]
    clock.advance(30)
    spy = SpySQS(aws.sqs)
    relay = Relay(Services(aws.dynamodb, spy, aws.settings, aws.now))
    # WHEN one stream batch brings them, the flexible ones first
    records = [record(aws, occ, n) for n, occ in enumerate(flexible + strict)]
    report = relay.relay(records)
    # THEN SQS's limit of ten entries a call holds, the first call carries only strict ones
    # (within a queue strict goes first) and every one is sent once
    assert report.failures == {}
    sizes = [len(b["Entries"]) for b in spy.batches]
    assert sizes == [10, 3]
    entries = spy.batches[0]["Entries"]
    assert {e["MessageAttributes"]["occurrence_id"]["StringValue"] for e in entries} <= set(strict)
    assert sorted(m["occurrence_id"] for m in messages(aws, "alice")) == sorted(flexible + strict)


class FailingSQS(SpySQS):
    """Every SendMessageBatch call fails as a whole (throttling)."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.batches.append({"QueueUrl": QueueUrl, "Entries": Entries})
        raise ClientError({"Error": {"Code": "ThrottlingException"}}, "SendMessageBatch")


def test_relay_batch_call_that_fails_reports_each_of_its_records_and_sends_nothing(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two occurrences, and SQS throttling every batch call
    first, second = one_shot(aws, clock), one_shot(aws, clock)
    clock.advance(30)
    relay = Relay(Services(aws.dynamodb, FailingSQS(aws.sqs), aws.settings, aws.now))
    # WHEN their stream records are relayed
    report = relay.relay([record(aws, first, 1), record(aws, second, 2)])
    # THEN both records are reported failed (the stream brings the batch back), none is
    # sent, and both occurrences are still SCHEDULED
    assert set(report.failures) == {"1", "2"}
    assert report.sent == 0
    assert messages(aws, "alice") == []
    assert (state(aws, first), state(aws, second)) == ("SCHEDULED", "SCHEDULED")


def test_relay_batch_call_that_fails_before_reaching_sqs_reports_its_records_and_resends(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two occurrences, and SendMessageBatch failing with no answer before SQS took the
    # request (a connection that timed out): none of the messages went in
    first, second = one_shot(aws, clock), one_shot(aws, clock)
    clock.advance(30)
    faults = Faults(FaultPlan(send_error=1.0), clock)
    relay = Relay(dataclasses.replace(aws, sqs=FaultySQS(aws.sqs, faults)))
    records = [record(aws, first, 1), record(aws, second, 2)]
    # WHEN their stream records are relayed
    report = relay.relay(records)
    # THEN both records are reported failed (the stream brings the batch back), none is
    # counted sent, and the queue holds nothing: no answer is not taken for delivered
    assert faults.injected["send_error"] == 1
    assert set(report.failures) == {"1", "2"}
    assert report.sent == 0
    assert messages(aws, "alice") == []
    assert (state(aws, first), state(aws, second)) == ("SCHEDULED", "SCHEDULED")
    # AND when the stream brings them back and SQS answers, each is sent, once
    faults.plan.send_error = 0.0
    again = relay.relay(records)
    assert (again.failures, again.sent) == ({}, 2)
    assert sorted(m["occurrence_id"] for m in messages(aws, "alice")) == sorted([first, second])


def test_relay_entry_that_keeps_failing_is_reported_and_stays_scheduled(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an entry SQS refuses every time, next to one it accepts
    bad, good = one_shot(aws, clock), one_shot(aws, clock)
    clock.advance(30)
    spy = SpySQS(aws.sqs, fail={bad: -1})
    slept: list[float] = []
    relay = Relay(Services(aws.dynamodb, spy, aws.settings, aws.now), sleep=slept.append)
    # WHEN the batch is relayed
    report = relay.relay([record(aws, bad, 7), record(aws, good, 8)])
    # THEN the bad record is reported (the stream will bring it back), the good one is done
    assert set(report.failures) == {"7"}
    assert str(report.failures["7"]) == "InternalError"  # SQS's code (no message given)
    # AND it was tried three times (SEND), after a jittered pause of at most 0.1 s, then 0.2 s
    assert SEND.tries == 3
    assert [len(b["Entries"]) for b in spy.batches] == [2, 1, 1]
    assert len(slept) == 2
    assert all(0 <= pause <= bound for pause, bound in zip(slept, [0.1, 0.2], strict=True))
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [good]
    assert state(aws, bad) == "SCHEDULED"


def test_relay_sends_a_canceled_occurrence_as_inserted_and_writes_nothing(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose schedule was canceled after the insert
    occ = one_shot(aws, clock)
    found = aws.occurrences.get_with_attempts(occ)
    assert found is not None
    event = record(aws, occ, 1)  # the stream image still says SCHEDULED
    ControlPlane(aws).cancel("alice", found[0].schedule_id)
    clock.advance(30)
    # WHEN its outbox record arrives
    report = Relay(aws).relay([event])
    # THEN the relay sends it without reading it (the worker drops a canceled occurrence's
    # message before the handler runs) and it stays CANCELED
    assert report.sent == 1
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [occ]
    assert state(aws, occ) == "CANCELED"


def test_relay_sends_a_fresh_occurrence_that_a_lagging_read_would_miss(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN eventually consistent reads that lag a minute behind the writes (AWS: a replica
    # behind), and an occurrence inserted a moment ago through that client
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    occ = one_shot(lagging, clock)
    event = record(aws, occ, 1)
    clock.advance(30)
    # WHEN its stream record reaches the relay
    report = Relay(lagging).relay([event])
    # THEN it is sent: nothing the relay reads can drop it
    assert report.sent == 1
    assert report.failures == {}
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [occ]


def test_relay_sends_a_retried_record_again_and_the_worker_decides(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence the relay sent, which a worker then finished
    occ = one_shot(aws, clock)
    clock.advance(30)
    event = record(aws, occ, 1)
    Relay(aws).relay([event])
    assert len(messages(aws, "alice")) == 1
    set_occurrence_state(aws, occ, "SUCCEEDED")
    # WHEN the stream brings the same record again (a batch retried after a later failure)
    report = Relay(aws).relay([event])
    # THEN it is sent again (at least once; the worker answers ALREADY_DONE) and the
    # occurrence is untouched
    assert report.sent == 1
    assert len(messages(aws, "alice")) == 1
    assert state(aws, occ) == "SUCCEEDED"


def test_relay_does_not_send_an_occurrence_inserted_missed(alice: Api, aws: Services, clock: Clock):
    # GIVEN a MISSED record inserted by a repair (never to be delivered)
    occ = one_shot(aws, clock)
    set_occurrence_state(aws, occ, "MISSED")
    event = record(aws, occ, 1)
    # WHEN its INSERT reaches the relay
    report = Relay(aws).relay([event])
    # THEN nothing is sent
    assert report.sent == 0
    assert messages(aws, "alice") == []


def test_relay_delay_is_clamped_between_0_and_900():
    # GIVEN receivable times around now; THEN SQS holds each message exactly until then
    assert delay_seconds(1000, now=1000) == 0
    assert delay_seconds(990, now=1000) == 0  # already late: at once
    assert delay_seconds(1250, now=1000) == 250
    assert delay_seconds(1900, now=1000) == 900
    with pytest.raises(DelayTooLong):
        delay_seconds(1901, now=1000)  # a planning bug: never sent early


def test_relay_delays_strict_and_flexible_until_available_at(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a strict and a flexible occurrence, relayed 100 s before their time
    strict = one_shot(aws, clock)
    flexible = one_shot(aws, clock, flexible_window_seconds=200)  # still inside the horizon
    occurrences = {o: aws.occurrences.get_with_attempts(o) for o in (strict, flexible)}
    clock.advance(30 - 100)
    spy = SpySQS(aws.sqs)
    Relay(Services(aws.dynamodb, spy, aws.settings, aws.now)).relay(
        [record(aws, strict, 1), record(aws, flexible, 2)]
    )
    # THEN each DelaySeconds is available_at - now: 100 for strict, 100 + jitter for flexible
    delays = {
        e["MessageAttributes"]["occurrence_id"]["StringValue"]: e["DelaySeconds"]
        for b in spy.batches
        for e in b["Entries"]
    }
    for occ, found in occurrences.items():
        assert found is not None
        assert delays[occ] == found[0].available_at - int(clock.now)
    assert delays[strict] == 100


def test_relay_two_tenants_each_message_in_its_own_queue(aws: Services, clock: Clock):
    # GIVEN occurrences of two tenants in one stream batch
    bootstrap("alice", "arn:aws:iam::111122223333:user/alice")
    bootstrap("bob", BOB)
    mine, theirs = one_shot(aws, clock, "alice"), one_shot(aws, clock, "bob")
    clock.advance(30)
    # WHEN relayed together
    Relay(aws).relay([record(aws, mine, 1), record(aws, theirs, 2)])
    # THEN each lands in its own tenant's queue, never the other's
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [mine]
    assert [m["occurrence_id"] for m in messages(aws, "bob")] == [theirs]


def test_relay_unknown_target_goes_dead_without_blocking_the_batch(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two occurrences whose target was deleted after they were planned
    lost, also_lost = one_shot(aws, clock), one_shot(aws, clock)
    aws.dynamodb.delete_item(
        TableName=aws.settings.tenants_table,
        Key=to_dynamo({"pk": "T#alice", "sk": "TARGET#default"}),
    )
    clock.advance(30)
    # WHEN relayed
    report = Relay(aws).relay([record(aws, lost, 1), record(aws, also_lost, 2)])
    # THEN both go DEAD with a reason, and the batch reports no failure to retry
    assert report.failures == {}
    assert report.dead == 2
    found = aws.occurrences.get_with_attempts(lost)
    assert found is not None
    assert found[0].state is OccurrenceState.DEAD
    assert found[0].reason == "the target does not exist (deleted or never created)"


@pytest.mark.parametrize("operation", ["get_item", "update_item"])
def test_relay_a_throttled_read_or_dead_write_fails_its_own_record_only(
    alice: Api, aws: Services, clock: Clock, operation: str
):
    # GIVEN three occurrences: one whose target was deleted (the relay reads the target,
    # then writes it DEAD), one for a fresh target, one for the cached default; and DynamoDB
    # throttling, past the SDK's retries, the first of those calls (the read or the write)
    # for the deleted target
    ControlPlane(aws).create_target("alice", "gone")
    ControlPlane(aws).create_target("alice", "fresh")
    lost = one_shot(aws, clock, target="gone")
    other, good = one_shot(aws, clock, target="fresh"), one_shot(aws, clock)
    aws.dynamodb.delete_item(
        TableName=aws.settings.tenants_table,
        Key=to_dynamo({"pk": "T#alice", "sk": "TARGET#gone"}),
    )
    clock.advance(30)
    faults = Faults(FaultPlan.none(), clock)
    throttled: list[str] = []

    def throttle(name: str, request: dict[str, Any]) -> None:
        if {"TARGET#gone", occurrence_key(lost)["sk"]} & {str(v) for v in keyed(request)}:
            throttled.append(name)
            raise client_error("ThrottlingException", name)

    def keyed(request: dict[str, Any]) -> list[str]:
        return [next(iter(v.values())) for v in request["Key"].values()]

    faults.before[operation] = throttle
    relay = Relay(dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults)))
    # WHEN the relay handles the batch
    report = relay.relay([record(aws, lost, 1), record(aws, other, 2), record(aws, good, 3)])
    # THEN only that record is a failure (it comes back), the others are sent: one tenant's
    # throttled key fails no other record of the batch
    assert throttled
    assert set(report.failures) == {"1"}
    assert (report.sent, report.dead) == (2, 0)
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [good]
    assert state(aws, lost) == "SCHEDULED"
    # AND on the retry, DynamoDB answering, it goes DEAD
    again = Relay(aws).relay([record(aws, lost, 1)])
    assert (again.failures, again.dead, state(aws, lost)) == ({}, 1, "DEAD")


def test_relay_handler_reports_undelivered_records_as_batch_item_failures(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN the Lambda handler and a record SQS keeps failing transiently (not the sender's
    # fault: it may go in on the mapping's retry)
    from relay import handler

    occ = one_shot(aws, clock)
    good = one_shot(aws, clock)
    clock.advance(30)
    wire(handler, dataclasses.replace(aws, sqs=SpySQS(aws.sqs, fail={occ: -1})), monkeypatch)
    # WHEN the handler runs on the batch
    answer = handler.lambda_handler(
        {"Records": [record(aws, occ, 11), record(aws, good, 12)]}, LambdaContextStub()
    )
    # THEN only the undelivered record is reported, by its sequence number
    assert answer == {"batchItemFailures": [{"itemIdentifier": "11"}]}
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [good]
    assert state(aws, occ) == "SCHEDULED"


def test_relay_handler_holds_back_a_record_due_past_sqss_delay_without_failing_the_batch(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN the Lambda handler and a record whose delay would exceed SQS's 900 s (a forged
    # available_at, or a planning bug)
    from relay import handler

    occ = one_shot(aws, clock)
    good = one_shot(aws, clock)
    clock.advance(30)
    late_record = record(aws, occ, 11)
    late_record["dynamodb"]["NewImage"]["available_at"] = {"N": str(int(clock.now) + 5000)}
    wire(handler, aws, monkeypatch)
    # WHEN the handler runs on the batch
    answer = handler.lambda_handler(
        {"Records": [late_record, record(aws, good, 12)]}, LambdaContextStub()
    )
    # THEN no record is reported: a retried batch would meet it again and again, holding
    # back every record after it on the stream shard; it is never sent early, stays
    # SCHEDULED, and the reconciler re-sends it once it is overdue (punctual.pipeline.redrive)
    assert answer == {"batchItemFailures": []}
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [good]
    assert state(aws, occ) == "SCHEDULED"


def test_relay_does_not_take_a_target_created_a_moment_ago_for_unknown(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN reads lagging a minute, a target created just now, and an occurrence for it
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    ControlPlane(lagging).create_target("alice", "fresh")
    occ = one_shot(lagging, clock, target="fresh")
    clock.advance(30)
    relay = Relay(lagging)
    # WHEN the relay handles it (twice: a miss must not be remembered either)
    first = relay.relay([record(aws, occ, 1)])
    second = relay.relay([record(aws, occ, 2)])
    # THEN it is sent both times, never declared DEAD for an unknown target
    assert (first.sent, first.dead, second.sent, second.dead) == (1, 0, 1, 0)
    assert state(aws, occ) == "SCHEDULED"


def test_relay_never_makes_a_message_receivable_early_on_a_fractional_clock(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN occurrences due 30, 31.x and 33 s ahead, and a clock with fractions, as Lambda's
    made = []
    for step in (0.0, 1.3, 2.0):
        clock.now = 1_795_000_000 + step
        made.append(one_shot(aws, clock))
    clock.now = 1_795_000_000.7
    spy = SpySQS(aws.sqs)
    # WHEN the relay sends them
    report = Relay(Services(aws.dynamodb, spy, aws.settings, aws.now)).relay(
        [record(aws, occ, n) for n, occ in enumerate(made, 1)]
    )
    # THEN each is held at least until its available_at: sent_at + DelaySeconds >= it
    assert report.sent == 3
    due = {
        o: aws.occurrences.get(o).available_at  # type: ignore[union-attr]
        for o in made
    }
    for entry in spy.batches[0]["Entries"]:
        occ = entry["MessageAttributes"]["occurrence_id"]["StringValue"]
        assert clock.now + entry["DelaySeconds"] >= due[occ]
        assert clock.now + entry["DelaySeconds"] < due[occ] + 1


class SenderFaults(SpySQS):
    """Answers chosen entries with a sender fault (always), others with a transient failure
    (first try only)."""

    def __init__(self, real: Any, sender: set[str], transient: set[str]) -> None:
        super().__init__(real)
        self.sender, self.transient = sender, set(transient)

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        self.batches.append({"QueueUrl": QueueUrl, "Entries": Entries})
        failed, passed = [], []
        for entry in Entries:
            occ = entry["MessageAttributes"]["occurrence_id"]["StringValue"]
            if occ in self.sender:
                failed.append(
                    {
                        "Id": entry["Id"],
                        "SenderFault": True,
                        "Code": "InvalidParameterValue",
                        "Message": "Message must be shorter than 262144 bytes.",
                    }
                )
            elif occ in self.transient:
                self.transient.discard(occ)
                failed.append({"Id": entry["Id"], "SenderFault": False, "Code": "InternalError"})
            else:
                passed.append(entry)
        answer = self.real.send_message_batch(QueueUrl=QueueUrl, Entries=passed) if passed else {}
        # SQS's JSON protocol leaves an empty list out of the answer.
        found = {"Successful": answer.get("Successful", []), "Failed": failed}
        return {name: entries for name, entries in found.items() if entries}


def test_relay_reports_a_senders_fault_at_once_and_retries_the_other_failures(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a batch of three in which SQS refuses the first as the sender's fault and the
    # other two once, transiently
    made = [one_shot(aws, clock) for _ in range(3)]
    clock.advance(30)
    sqs = SenderFaults(aws.sqs, sender={made[0]}, transient={made[1], made[2]})
    # WHEN the relay sends them
    report = Relay(Services(aws.dynamodb, sqs, aws.settings, aws.now), sleep=lambda _: None).relay(
        [record(aws, occ, n) for n, occ in enumerate(made, 1)]
    )
    # THEN the sender's fault is not tried again and is no failure of the batch (SQS would
    # refuse it every time, holding back every record after it on the stream shard): it is
    # DEAD with SQS's reason; the two transient failures were both retried and sent
    assert report.failures == {}
    assert report.undeliverable == 1
    assert state(aws, made[0]) == "DEAD"
    assert reason(aws, made[0]) == (
        "SQS refused the message: InvalidParameterValue: Message must be shorter than 262144 bytes."
    )
    tries = [
        [e["MessageAttributes"]["occurrence_id"]["StringValue"] for e in batch["Entries"]]
        for batch in sqs.batches
    ]
    assert tries == [made, made[1:]]
    assert sorted(m["occurrence_id"] for m in messages(aws, "alice")) == sorted(made[1:])


def test_relay_lag_is_to_receivable_and_strict_ones_past_the_slo_are_counted(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two strict occurrences whose time has passed: one by 4 s, one by 14 s (say a
    # materializer killed holding its lease)
    on_time = one_shot(aws, clock)
    clock.advance(10)
    late = one_shot(aws, clock)
    clock.advance(30 + 4)
    # AND one due 30 s from now, which the relay sends ahead with a delay
    ahead = one_shot(aws, clock)
    # WHEN the relay sends all three now
    records = [record(aws, on_time, 1), record(aws, late, 2), record(aws, ahead, 3)]
    report = Relay(aws).relay(records)
    # THEN the lag is from each one's time to when it becomes receivable (the delay
    # included: 0 for the one sent ahead), and only the one past the 5 s SLO counts as
    # late (the StrictLate metric)
    assert report.sent == 3
    assert sorted(round(lag) for _, lag in report.lags) == [0, 4, 14]
    assert report.late_strict == 1


# A payload whose message is over SQS's limit (Punctual stores 32 KiB at most: a forged item).
OVER_SIZE = {"M": {"blob": {"S": "x" * relay_module.MAX_BODY_BYTES}}}


def throttling(
    aws: Services, clock: Clock, operation: str, when: Callable[[dict[str, Any]], bool]
) -> FaultyDynamoDB:
    """``aws``'s DynamoDB, throttling (past the SDK's retries) the ``operation`` requests
    ``when`` picks."""
    faults = Faults(FaultPlan.none(), clock)

    def throttle(name: str, request: dict[str, Any]) -> None:
        if when(request):
            raise client_error("ThrottlingException", name)

    faults.before[operation] = throttle
    return FaultyDynamoDB(aws.dynamodb, faults)


def test_relay_counts_each_record_it_gives_up_or_holds_back_across_its_queues(
    alice: Api, bob: Api, aws: Services, clock: Clock
):
    # GIVEN alice's batch: a forged item whose message is over SQS's limit (first), two
    # forged due an hour ahead, one on time and one on the catch-up lane; and bob's: two
    # that SQS refuses as the sender's fault, one on the catch-up lane, and one over-size
    big, good, early, later, slow = (one_shot(aws, clock) for _ in range(5))
    refused, also_refused, bobs_slow, bobs_big = (
        one_shot(aws, clock, tenant="bob") for _ in range(4)
    )
    clock.advance(30)
    made = [big, good, early, later, slow, refused, also_refused, bobs_slow, bobs_big]
    records = {occ: record(aws, occ, n) for n, occ in enumerate(made, 1)}
    image = {occ: records[occ]["dynamodb"]["NewImage"] for occ in made}
    for occ in (big, bobs_big):
        image[occ]["payload"] = OVER_SIZE
    for occ in (early, later):
        image[occ]["available_at"] = {"N": str(int(clock.now) + 3600)}
    for occ in (slow, bobs_slow):
        image[occ]["lane"] = {"S": "CATCHUP"}
    sqs = SenderFaults(aws.sqs, sender={refused, also_refused}, transient=set())
    relay = Relay(Services(aws.dynamodb, sqs, aws.settings, aws.now), sleep=lambda _: None)
    # WHEN the relay handles it
    report = relay.relay(list(records.values()))
    # THEN every record is accounted for, each queue's added up: none is a failure to retry
    assert report.failures == {}
    assert (report.too_early, report.undeliverable, report.sent) == (2, 4, 3)
    assert sorted(report.sent_records) == sorted(
        str(made.index(occ) + 1) for occ in (good, slow, bobs_slow)
    )
    assert len(report.catchup_lags) == 2
    assert [strict for strict, _ in report.lags] == [True]
    # AND the over-size one is DEAD with its reason, and held back none after it
    assert (state(aws, big), reason(aws, big)) == ("DEAD", "its message is over SQS's 262144 bytes")
    assert sorted(m["occurrence_id"] for m in messages(aws, "alice")) == sorted([good, slow])
    assert [state(aws, occ) for occ in (early, later)] == ["SCHEDULED", "SCHEDULED"]


def test_relay_a_refused_message_whose_dead_write_is_throttled_fails_its_own_record(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a message SQS refuses as the sender's fault, a forged one over SQS's size limit,
    # and DynamoDB throttling (past the SDK's retries) the writes that make them DEAD
    refused, good, big = (one_shot(aws, clock) for _ in range(3))
    clock.advance(30)
    services = Services(
        throttling(aws, clock, "update_item", lambda request: True),
        SenderFaults(aws.sqs, sender={refused}, transient=set()),
        aws.settings,
        aws.now,
    )
    # WHEN the relay handles the batch
    records = [record(aws, refused, 1), record(aws, good, 2), record(aws, big, 3)]
    records[2]["dynamodb"]["NewImage"]["payload"] = OVER_SIZE
    report = Relay(services, sleep=lambda _: None).relay(records)
    # THEN those records come back, each with the throttling as its reason (they go DEAD on
    # their retry), the other is sent
    assert (set(report.failures), report.undeliverable, report.sent) == ({"1", "3"}, 0, 1)
    assert all(isinstance(e, Retryable) for e in report.failures.values())
    assert [state(aws, occ) for occ in (refused, big)] == ["SCHEDULED", "SCHEDULED"]


def test_relay_handler_reports_a_record_whose_target_read_is_throttled(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN the Lambda handler, and DynamoDB throttling (past the SDK's retries) the read of
    # one record's target
    from relay import handler

    ControlPlane(aws).create_target("alice", "busy")
    occ, good = one_shot(aws, clock, target="busy"), one_shot(aws, clock)
    clock.advance(30)
    busy = throttling(aws, clock, "get_item", lambda r: r["Key"]["sk"] == {"S": "TARGET#busy"})
    wire(handler, dataclasses.replace(aws, dynamodb=busy), monkeypatch)
    # WHEN the handler runs on the batch
    answer = handler.lambda_handler(
        {"Records": [record(aws, occ, 11), record(aws, good, 12)]}, LambdaContextStub()
    )
    # THEN that record is reported (the mapping retries it): never dropped
    assert answer == {"batchItemFailures": [{"itemIdentifier": "11"}]}
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [good]


def test_relay_counts_a_tenants_malformed_item_on_each_batch_that_holds_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN one relay (a warm Lambda) and a stream record of an item a tenant's worker wrote
    # under an occurrence key: only a state
    good = one_shot(aws, clock)
    clock.advance(30)
    forged = record(aws, good, 7)
    forged["dynamodb"]["NewImage"] = {
        "schedule_id": forged["dynamodb"]["NewImage"]["schedule_id"],
        "sk": forged["dynamodb"]["NewImage"]["sk"],
        "state": {"S": "SCHEDULED"},
    }
    relay = Relay(aws)
    # WHEN it comes in two batches, one after the other
    first = relay.relay([forged, record(aws, good, 8)])
    second = relay.relay([forged])
    # THEN each batch counts it once (the MalformedItems metric), skipped, no failure
    assert (first.malformed, first.failures, first.sent) == (1, {}, 1)
    assert (second.malformed, second.failures, second.sent) == (1, {}, 0)
