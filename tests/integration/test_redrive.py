"""Re-driving lost deliveries: the reconciler re-sends what no worker took long after it was
due, and the on-failure queue's stream batches are read back and relayed again."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError
from botocore.exceptions import ClientError

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import StoredOccurrence, occurrence_to_item
from punctual.dal.tables import occurrence_key
from punctual.domain.ids import MANUAL_MARK, backfill_tag, occurrence_id, shard_of
from punctual.domain.occurrence import Lane, Occurrence, OccurrenceState
from punctual.domain.schedule import ScheduleDefinition
from punctual.integrations.queues import queue_name
from punctual.integrations.streams import ANY_LANE
from punctual.pipeline.reconciler import Reconciler
from punctual.pipeline.redrive import REDRIVE_AFTER, StreamRedrive, Trimmed, failed_lane, overdue
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.settings import Settings
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock, LambdaContextStub
from tests.integration.helpers import set_occurrence_state, wire
from tests.integration.reconciler.helpers import _emitted_metrics
from tests.integration.test_reconciler_races import lagging
from tests.integration.test_relay import messages

HOUR = 3600


def _one_shot(aws: Services, clock: Clock, seconds: int = 30, target: str = "default") -> str:
    at = datetime.fromtimestamp(int(clock.now) + seconds).astimezone().isoformat()
    definition = ScheduleDefinition.model_validate(
        {"target": target, "spec": {"kind": "at", "at": at}}
    )
    return ControlPlane(aws).create("alice", definition).materialized[0].occurrence_id


def _window_of(instant: int) -> tuple[int, int]:
    return instant - instant % HOUR, instant - instant % HOUR + HOUR


def test_reconciler_resends_an_occurrence_no_worker_took_and_counts_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three occurrences of one hour: one whose message never reached the queue (the
    # relay never saw it), one a worker finished, one a worker holds under a live lease
    lost, done, running = (_one_shot(aws, clock, 30 + i) for i in range(3))
    set_occurrence_state(aws, done, "SUCCEEDED")
    set_occurrence_state(aws, running, "RUNNING")
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(running)),
        UpdateExpression="SET lease_expires_at = :far",
        ExpressionAttributeValues={":far": {"N": str(int(clock.now) + 10 * HOUR)}},
    )
    # WHEN the reconciler checks that hour, an hour after it ended
    start, end = _window_of(int(clock.now) + 30)
    clock.now = end + HOUR + 60
    results = Reconciler(aws).run(list(range(aws.settings.shard_count)), start, end)
    # THEN exactly the lost one is re-sent, same id, and the run says so
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [lost]
    assert sum(r.report.redriven for r in results) == 1
    assert [o for r in results for o in r.redriven] == [lost]


def test_reconciler_counts_as_resent_only_what_sqs_took_of_a_schedules_occurrences(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule whose first occurrences (made by the API at 00:10 of an hour)
    # no worker took, and SQS refusing the message of one of them
    clock.now = (int(clock.now) // HOUR + 1) * HOUR + 600
    definition = ScheduleDefinition.model_validate(
        {
            "target": "default",
            "spec": {"kind": "cron", "expression": "* * * * *", "timezone": "UTC"},
        }
    )
    made = [o.occurrence_id for o in ControlPlane(aws).create("alice", definition).materialized]
    assert len(made) >= 2
    refused = made[0]

    class RefusingOne:
        def __getattr__(self, name: str) -> Any:
            return getattr(aws.sqs, name)

        def send_message_batch(self, **request: Any) -> Any:
            def named(entry: dict[str, Any]) -> str:
                return str(entry["MessageAttributes"]["occurrence_id"]["StringValue"])

            kept = [e for e in request["Entries"] if named(e) != refused]
            answer = aws.sqs.send_message_batch(**(request | {"Entries": kept})) if kept else {}
            failed = [
                {"Id": e["Id"], "SenderFault": False, "Code": "InternalError"}
                for e in request["Entries"]
                if named(e) == refused
            ]
            return {"Successful": answer.get("Successful", []), "Failed": failed}

    services = dataclasses.replace(aws, sqs=RefusingOne())
    # WHEN the reconciler checks that hour, an hour after it ended
    start, end = _window_of(int(clock.now))
    clock.now = end + HOUR + 60
    result = Reconciler(services).run_shard(_shard(aws, refused), start, end)
    # THEN the others were re-sent and counted; the refused one is not counted as re-sent
    # (the next run tries it again)
    assert sorted(result.redriven) == sorted(made[1:])
    assert sorted(m["occurrence_id"] for m in messages(aws, "alice")) == sorted(made[1:])


def test_reconciler_resends_a_retry_whose_message_was_lost(alice: Api, aws: Services, clock: Clock):
    # GIVEN an occurrence waiting for a retry at T + 60, whose message never came back
    occ = _one_shot(aws, clock)
    set_occurrence_state(aws, occ, "RETRY_WAIT")
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occ)),
        UpdateExpression="SET retry_at = :at",
        ExpressionAttributeValues={":at": {"N": str(int(clock.now) + 60)}},
    )
    start, end = _window_of(int(clock.now) + 30)
    # WHEN the reconciler runs, first too early to call it lost, then an hour after the hour
    clock.now = int(clock.now) + 60 + REDRIVE_AFTER - 1
    assert (
        Reconciler(aws).run_shard(_shard(aws, occ), start, min(end, int(clock.now))).redriven == []
    )
    clock.now = end + HOUR
    result = Reconciler(aws).run_shard(_shard(aws, occ), start, end)
    # THEN only the second one re-sends it
    assert result.redriven == [occ]
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [occ]


def test_reconciler_checks_an_hour_again_while_it_is_open_and_resends_a_later_loss(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence a worker holds under a lease that outlives the hour's first check
    occ = _one_shot(aws, clock)
    _, end = _window_of(int(clock.now) + 30)
    first = end + HOUR + 300  # the scheduled run that checks that hour by default
    set_occurrence_state(aws, occ, "RUNNING")
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occ)),
        UpdateExpression="SET lease_expires_at = :at",
        ExpressionAttributeValues={":at": {"N": str(first + 60)}},
    )
    shards = [_shard(aws, occ)]
    # WHEN the scheduled run checks the hour while the occurrence is still in flight
    clock.now = first
    [checked] = [r for r in Reconciler(aws).catch_up(shards, first) if r.report.window_end == end]
    # THEN it is fully checked but not settled, and nothing is re-sent yet
    assert (checked.report.complete, checked.report.settled, checked.redriven) == (True, False, [])
    # WHEN the worker dies and its message is lost, and the next scheduled run comes
    clock.now = first + HOUR
    again = [
        r for r in Reconciler(aws).catch_up(shards, first + HOUR) if r.report.window_end == end
    ]
    # THEN it checks that hour again and re-sends the occurrence, now long overdue
    assert [r.redriven for r in again] == [[occ]]
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [occ]
    # AND once it is done the hour is settled and no later run checks it again
    set_occurrence_state(aws, occ, "SUCCEEDED")
    clock.now = first + 2 * HOUR
    [last] = [
        r for r in Reconciler(aws).catch_up(shards, first + 2 * HOUR) if r.report.window_end == end
    ]
    assert last.report.settled
    clock.now = first + 3 * HOUR
    later = Reconciler(aws).catch_up(shards, first + 3 * HOUR)
    assert end not in {r.report.window_end for r in later}


def test_reconciler_does_not_resend_what_a_worker_took_a_moment_ago_on_a_lagging_replica(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an occurrence whose first message was lost, long overdue, that a worker took a
    # moment ago (its message sent again by the stream re-drive): RUNNING under a live
    # lease, written through replicas that lag 5 s (and an index that lags as much)
    occ = _one_shot(aws, clock)
    start, end = _window_of(int(clock.now) + 30)
    clock.now = end + HOUR + 60
    replicas = lagging(aws, clock)
    set_occurrence_state(replicas, occ, "RUNNING")
    replicas.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occ)),
        UpdateExpression="SET lease_expires_at = :live",
        ExpressionAttributeValues={":live": {"N": str(int(clock.now) + 300)}},
    )
    # WHEN the reconciler checks that hour a second later, on the same replicas (its read of
    # the hour still shows the occurrence SCHEDULED, an hour overdue)
    clock.now += 1
    result = Reconciler(replicas).run_shard(_shard(aws, occ), start, end)
    # THEN it reads the occurrence again, consistently, before re-sending: the worker holds
    # it, so nothing is sent a second time
    assert result.redriven == []
    assert messages(aws, "alice") == []


def _shard(aws: Services, occurrence_id: str) -> int:
    schedule_id = occurrence_key(occurrence_id)["schedule_id"]
    return shard_of(schedule_id, aws.settings.shard_count)


# --- the on-failure queue ---------------------------------------------------------------------


def _discarded_batch(aws: Services, streams: Any) -> dict[str, Any]:
    """What the event source mapping puts in the on-failure queue for the whole stream so far."""
    arn = aws.dynamodb.describe_table(TableName=aws.settings.occurrences_table)["Table"][
        "LatestStreamArn"
    ]
    [shard] = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
    iterator = streams.get_shard_iterator(
        StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = streams.get_records(ShardIterator=iterator, Limit=1000)["Records"]
    return {
        "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 11},
        "version": "1.0",
        "DDBStreamBatchInfo": {
            "shardId": shard["ShardId"],
            "startSequenceNumber": records[0]["dynamodb"]["SequenceNumber"],
            "endSequenceNumber": records[-1]["dynamodb"]["SequenceNumber"],
            "batchSize": len(records),
            "streamArn": arn,
        },
    }


def test_stream_redrive_relays_a_discarded_batch_again(
    local_aws: Services, streams: Any, clock: Clock
):
    # GIVEN a tenant whose two occurrences' stream batch the relay's mapping gave up on
    from tests.integration.conftest import ALICE, bootstrap

    bootstrap("alice", ALICE)
    made = [_one_shot(local_aws, clock, 30 + i) for i in range(2)]
    failure = _discarded_batch(local_aws, streams)
    clock.advance(40)
    # WHEN the re-drive handles the on-failure queue's message
    report = StreamRedrive(streams, Relay(local_aws)).redrive(failure)
    # THEN both occurrences are in the tenant's queue, once each
    assert report.sent == 2
    assert sorted(m["occurrence_id"] for m in messages(local_aws, "alice")) == sorted(made)


@pytest.mark.parametrize(
    ("function", "lanes"),
    [
        ("punctual-RelayFunction", {"on time"}),
        ("punctual-RelayCatchup", {"catch-up"}),
        (None, {"on time", "catch-up"}),  # the failure does not say: both, nothing lost
        ("punctual-RelayRetired", {"on time", "catch-up"}),  # neither lane's now: both
    ],
)
def test_stream_redrive_resends_only_the_failed_lanes_records(
    local_aws: Services, streams: Any, clock: Clock, function: str | None, lanes: set[str]
):
    # GIVEN a discarded stream batch whose range holds an on-time occurrence and a
    # catch-up one (both lanes' mappings read the same shard)
    from tests.integration.conftest import ALICE, bootstrap

    bootstrap("alice", ALICE)
    on_time = _one_shot(local_aws, clock)
    catchup = _one_shot(local_aws, clock, 40)
    stored = local_aws.occurrences.get(catchup)
    assert stored is not None
    tag = backfill_tag(stored.schedule_id)
    late = stored.model_copy(
        update={"occurrence_id": f"{catchup}{MANUAL_MARK}{tag}", "lane": Lane.CATCHUP}
    )
    local_aws.dynamodb.put_item(
        TableName=local_aws.settings.occurrences_table,
        Item=to_dynamo(occurrence_to_item(late, {})),
    )
    failure = _discarded_batch(local_aws, streams)
    if function is not None:
        arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function}"
        failure["requestContext"]["functionArn"] = arn
    clock.advance(45)
    # WHEN the re-drive, told which function is which lane's, handles it
    StreamRedrive(
        streams, Relay(local_aws), "punctual-RelayFunction", "punctual-RelayCatchup"
    ).redrive(failure)
    # THEN only the failed lane's records are sent again: the other lane sent its own
    sent = {m["occurrence_id"] for m in messages(local_aws, "alice")}
    expected = {"on time": {on_time, catchup}, "catch-up": {late.occurrence_id}}
    assert sent == set().union(*(expected[lane] for lane in lanes))


def test_stream_redrive_does_not_take_a_target_created_a_moment_ago_for_unknown(
    local_aws: Services, streams: Any, clock: Clock
):
    # GIVEN replicas (and indexes) that lag a minute, a target created through them just
    # now, and an occurrence for it whose stream batch the relay's mapping gave up on
    from tests.integration.conftest import ALICE, bootstrap

    bootstrap("alice", ALICE)
    plan = FaultPlan(stale=1.0, stale_seconds=60, index_lag=1.0, index_lag_seconds=60)
    replicas = dataclasses.replace(
        local_aws, dynamodb=FaultyDynamoDB(local_aws.dynamodb, Faults(plan, clock))
    )
    ControlPlane(replicas).create_target("alice", "fresh")
    occ = _one_shot(replicas, clock, target="fresh")
    failure = _discarded_batch(local_aws, streams)
    clock.advance(40)
    # WHEN the re-drive handles the on-failure queue's message, on the same replicas
    report = StreamRedrive(streams, Relay(replicas)).redrive(failure)
    # THEN the occurrence is sent to the new target's queue, never declared DEAD for an
    # unknown target
    assert (report.sent, report.dead) == (1, 0)
    stored = local_aws.occurrences.get(occ)
    assert stored is not None
    assert stored.state is OccurrenceState.SCHEDULED
    url = local_aws.sqs.get_queue_url(QueueName=queue_name("punctual", "alice", "fresh"))
    got = local_aws.sqs.receive_message(QueueUrl=url["QueueUrl"], MaxNumberOfMessages=10)
    assert [json.loads(m["Body"])["occurrence_id"] for m in got["Messages"]] == [occ]


def _on_failure_event(failure: dict[str, Any]) -> dict[str, Any]:
    """The re-drive's SQS event: one message from the on-failure queue."""
    record = {
        "messageId": "m1",
        "receiptHandle": "r1",
        "body": json.dumps(failure),
        "attributes": {},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
    }
    return {"Records": [record]}


def test_stream_redrive_handler_keeps_the_message_until_the_batch_is_sent(
    local_aws: Services,
    streams: Any,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    # GIVEN a discarded batch, and SQS refusing every send for now
    from relay import redrive as handler

    from tests.integration.conftest import ALICE, bootstrap

    bootstrap("alice", ALICE)
    _one_shot(local_aws, clock)
    failure = _discarded_batch(local_aws, streams)

    class Refusing:
        def __getattr__(self, name: str) -> Any:
            return getattr(local_aws.sqs, name)

        def send_message_batch(self, **request: Any) -> Any:
            raise ClientError({"Error": {"Code": "ServiceUnavailable"}}, "SendMessageBatch")

    refusing = Services(local_aws.dynamodb, Refusing(), local_aws.settings, local_aws.now)
    wire(handler, refusing, monkeypatch)
    monkeypatch.setattr(
        handler, "_redrive", lambda services: StreamRedrive(streams, Relay(services))
    )
    event = _on_failure_event(failure)
    # WHEN the handler runs; THEN the invocation fails (every record of the batch failed),
    # so SQS keeps the message and delivers it again: the batch is not dropped
    capsys.readouterr()
    with pytest.raises(BatchProcessingError, match="All records failed"):
        handler.lambda_handler(event, LambdaContextStub())
    # AND the failure is counted (alarmed: RedriveFailures; after 3 tries the message waits
    # in the dead-letter queue, RelayUndelivered)
    assert _emitted_metrics(capsys.readouterr().out) == {"RedriveFailures": 1}


def test_stream_redrive_handler_counts_a_batch_the_stream_dropped_and_lets_it_go(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a stream that no longer holds the batch (older than 24 hours)
    from relay import redrive as handler

    class Trimming:
        def get_shard_iterator(self, **_: Any) -> Any:
            raise ClientError({"Error": {"Code": "TrimmedDataAccessException"}}, "GetShardIterator")

    failure = {
        "DDBStreamBatchInfo": {
            "shardId": "s",
            "startSequenceNumber": "1",
            "endSequenceNumber": "2",
            "streamArn": "arn",
        }
    }
    redrive = StreamRedrive(Trimming(), Relay.__new__(Relay))
    # WHEN it is re-driven; THEN Trimmed
    with pytest.raises(Trimmed):
        redrive.redrive(failure)
    # AND the handler counts it as RedriveExpired (alarmed; the reconciler re-sends what no
    # worker took) and lets the message go: no record failed, nothing comes back
    wire(handler, Services(None, None, Settings(), time.time), monkeypatch)
    monkeypatch.setattr(handler, "_redrive", lambda _: redrive)
    event = _on_failure_event(failure)
    capsys.readouterr()
    assert handler.lambda_handler(event, LambdaContextStub()) == {"batchItemFailures": []}
    assert _emitted_metrics(capsys.readouterr().out) == {"RedriveExpired": 1}


# --- which open occurrences the reconciler re-sends ------------------------------------


def _stored(state: OccurrenceState, retry_at: int | None = None, **fields: Any) -> StoredOccurrence:
    occurrence = Occurrence(
        occurrence_id=occurrence_id("sch_acme.x", 1, 1_000),
        tenant_id="acme",
        schedule_id="sch_acme.x",
        schedule_version=1,
        scheduled_for=1_000,
        available_at=1_060,
        target="default",
        state=state,
        **fields,
    )
    return StoredOccurrence(occurrence, {}, retry_at)


@pytest.mark.parametrize(
    ("stored", "since"),
    [
        (_stored(OccurrenceState.SCHEDULED), 1_060),  # since it became receivable
        (_stored(OccurrenceState.RETRY_WAIT, retry_at=5_000), 5_000),  # since its retry
        (_stored(OccurrenceState.RETRY_WAIT), 1_060),  # no retry_at: since receivable
        (_stored(OccurrenceState.RUNNING, lease_expires_at=9_000), 9_000),  # since the lease
    ],
)
def test_an_open_occurrence_is_overdue_strictly_after_redrive_after_past_its_start(
    stored: StoredOccurrence, since: int
):
    # THEN it is not overdue at since + REDRIVE_AFTER, and is one second later
    assert not overdue(stored, since + REDRIVE_AFTER)
    assert overdue(stored, since + REDRIVE_AFTER + 1)


@pytest.mark.parametrize(
    "state",
    [
        OccurrenceState.SUCCEEDED,
        OccurrenceState.DEAD,
        OccurrenceState.MISSED,
        OccurrenceState.CANCELED,
        OccurrenceState.SKIPPED_OVERLAP,
    ],
)
def test_a_final_occurrence_is_never_overdue(state: OccurrenceState):
    assert not overdue(_stored(state), 10**9)


def test_a_running_occurrence_without_a_lease_is_not_overdue():
    assert not overdue(_stored(OccurrenceState.RUNNING), 10**9)


@pytest.mark.parametrize(
    "failure", [{}, {"requestContext": {}}, {"requestContext": {"functionArn": "not-an-arn"}}]
)
def test_a_failure_that_names_no_function_is_re_driven_on_both_lanes(failure: dict[str, Any]):
    # GIVEN an on-failure message that names no function (or not as an ARN)
    # THEN its batch is re-sent on both lanes: duplicates, never a lane's records left out
    assert failed_lane(failure, "punctual-RelayFunction", "punctual-RelayCatchup") == ANY_LANE


def test_stream_redrive_reads_the_stream_with_a_client_that_backs_off_when_throttled(
    monkeypatch: pytest.MonkeyPatch,
):
    # GIVEN the re-drive's stream client, the third reader of each shard (AWS throttles it
    # with LimitExceededException)
    from botocore.retries.standard import ThrottledRetryableChecker
    from relay import redrive as handler

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = handler._redrive(Services(None, None, Settings(), time.time))._streams
    # THEN its retry mode is the standard one, which takes that error for throttling and
    # backs off (the legacy mode retries it only for Kinesis), a few times within the
    # re-drive's minute
    assert client.meta.config.retries["mode"] == "standard"
    assert client.meta.config.retries["total_max_attempts"] == 6
    assert "LimitExceededException" in ThrottledRetryableChecker._THROTTLED_ERROR_CODES
