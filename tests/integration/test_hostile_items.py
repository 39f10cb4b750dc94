"""A hostile tenant's own writes, as its worker policy lets it make them (tests/hostile.py),
met by every reader of the tables it can write: its malformed item is that tenant's bad
data (counted, logged with its key, skipped), never a failure of a relay batch, a shard's
walk, a reconcile run or another tenant's work (docs/security.md, *What a tenant's
worker can write*)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from relay import redrive as redrive_handler

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import StoredOccurrence
from punctual.dal.tables import (
    BACKFILL_PREFIX,
    OCCURRENCE_PREFIX,
    backfill_sk,
    occurrence_key,
    occurrence_sk,
)
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.domain.message import message_body
from punctual.domain.schedule import ScheduleDefinition
from punctual.integrations.queues import queue_name
from punctual.pipeline.reconciler import Reconciler
from punctual.pipeline.redrive import StreamRedrive
from punctual.pipeline.relay import Relay, outbound
from punctual.services import Services
from punctual.settings import Settings
from punctual.timing import use_zone_source
from punctual_client.worker import Outcome, Worker
from tests.hostile import HostileWorker
from tests.integration.conftest import (
    ALICE,
    BOB,
    OPERATOR,
    Api,
    Clock,
    LambdaContextStub,
    bootstrap,
)
from tests.integration.helpers import cron_spec, make, set_occurrence_state, wire
from tests.integration.reconciler.helpers import _emitted_metrics, at, materialize_until, stored
from tests.integration.test_redrive import _on_failure_event
from tests.integration.test_relay import messages, one_shot, record
from tests.integration.test_tz_rules import OLD
from tests.integration.worker.helpers import receive

BOBS_QUEUE = queue_name("punctual", "bob", "default")
# The unreadable item of the issue: an occurrence's sort key, only ``state`` set.
ONLY_STATE = {"state": {"S": "SUCCEEDED"}}


@pytest.fixture
def settings() -> Settings:
    # One shard: alice's and bob's schedules share it, as tenants share shards on AWS.
    return Settings(operator_principals=frozenset({OPERATOR}), shard_count=1)


@pytest.fixture
def both(aws: Services) -> tuple[Api, Api]:
    return bootstrap("alice", ALICE), bootstrap("bob", BOB)


def bobs_worker(aws: Services) -> HostileWorker:
    return HostileWorker(aws.dynamodb, "bob", aws.settings)


def plant(aws: Services, schedule_id: str, instant: int, attributes: dict[str, Any]) -> str:
    """Bob's worker writes ``attributes`` at the occurrence key of (schedule, v1, instant),
    unconditionally: UpdateItem makes the item. The id that key names."""
    named = occurrence_id(schedule_id, 1, instant)
    bobs_worker(aws).write(
        aws.settings.occurrences_table, to_dynamo(occurrence_key(named)), attributes
    )
    return named


def inserted(aws: Services, schedule_id: str, instant: int, sequence: int) -> dict[str, Any]:
    """The stream record of an item bob's worker made: an INSERT with its image."""
    key = to_dynamo({"schedule_id": schedule_id, "sk": occurrence_sk(instant, 1)})
    image = aws.dynamodb.get_item(TableName=aws.settings.occurrences_table, Key=key)["Item"]
    return {
        "eventID": str(sequence),
        "eventName": "INSERT",
        "eventSource": "aws:dynamodb",
        "dynamodb": {"NewImage": image, "SequenceNumber": str(sequence), "Keys": key},
    }


def bobs_schedule(aws: Services, clock: Clock) -> str:
    definition = ScheduleDefinition.model_validate(
        {"target": "default", "spec": cron_spec("0 * * * *")}
    )
    return ControlPlane(aws).create("bob", definition).schedule.schedule_id


def test_worker_policy_lets_bobs_worker_make_an_item_under_his_own_keys_only(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN bob's worker credentials (its generated policy) and one of alice's schedules
    sid = bobs_schedule(aws, clock)
    hers = make(aws, tenant="alice", spec=cron_spec("0 * * * *"))
    # WHEN it writes an occurrence key of its own schedule that does not exist: it is made
    made = plant(aws, sid, at("12:00"), ONLY_STATE)
    item = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table, Key=to_dynamo(occurrence_key(made))
    )["Item"]
    assert item["state"] == {"S": "SUCCEEDED"}
    assert "occurrence_id" not in item
    # AND under alice's keys it is refused by IAM
    with pytest.raises(Exception, match="denied by IAM"):
        plant(aws, hers, at("12:00"), ONLY_STATE)


def test_relay_skips_a_tenants_malformed_insert_and_sends_the_rest_of_the_batch(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN an item bob's worker made under his own schedule's key (only a state), whose
    # INSERT reaches the relay first in a batch with one of alice's strict fires
    sid = bobs_schedule(aws, clock)
    plant(aws, sid, at("12:00"), ONLY_STATE)
    hers = one_shot(aws, clock, tenant="alice")
    clock.advance(30)
    # WHEN the relay takes the batch
    report = Relay(aws).relay([inserted(aws, sid, at("12:00"), 1), record(aws, hers, 2)])
    # THEN the batch has no failure (nothing holds the stream shard back), the bad item is
    # counted, and alice's fire is in her queue
    assert report.failures == {}
    assert (report.sent, report.malformed) == (1, 1)
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [hers]


class Stream:
    """DynamoDB Streams holding ``records`` on one shard, as the re-drive reads a discarded
    batch back (punctual.integrations.streams.read_range: an iterator, then GetRecords)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def get_shard_iterator(self, **request: Any) -> dict[str, Any]:
        assert request["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
        return {"ShardIterator": "0"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        return {"Records": self.records, "NextShardIterator": None}


def discarded_with_bobs_insert(aws: Services, clock: Clock) -> tuple[Stream, dict[str, Any], str]:
    """A stream batch the relay's mapping gave up on (its on-failure queue's message), whose
    range holds the item of only a state bob's worker made and then one of alice's strict
    fires; alice's occurrence id."""
    sid = bobs_schedule(aws, clock)
    plant(aws, sid, at("12:00"), ONLY_STATE)
    hers = one_shot(aws, clock, tenant="alice")
    clock.advance(30)
    stream = Stream([inserted(aws, sid, at("12:00"), 1), record(aws, hers, 2)])
    failure = {
        "requestContext": {"condition": "RetryAttemptsExhausted", "approximateInvokeCount": 11},
        "DDBStreamBatchInfo": {
            "shardId": "shard-1",
            "startSequenceNumber": "1",
            "endSequenceNumber": "2",
            "batchSize": 2,
            "streamArn": "arn:aws:dynamodb:us-east-1:123456789012:table/occ/stream/x",
        },
    }
    return stream, failure, hers


def test_stream_redrive_skips_a_tenants_malformed_insert_and_sends_the_rest_of_the_range(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN a discarded stream batch holding bob's item of only a state and alice's fire
    stream, failure, hers = discarded_with_bobs_insert(aws, clock)
    # WHEN the re-drive replays it
    report = StreamRedrive(stream, Relay(aws)).redrive(failure)
    # THEN it finishes (no SendFailed: the on-failure message is done), bob's item is counted
    # as malformed, and alice's fire is in her queue
    assert report.failures == {}
    assert (report.sent, report.malformed) == (1, 1)
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [hers]


def test_redrive_handler_lets_the_batch_go_and_counts_a_tenants_malformed_insert(
    both: tuple[Api, Api],
    aws: Services,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    # GIVEN the same batch as the re-drive Lambda's event (the on-failure queue's message)
    stream, failure, hers = discarded_with_bobs_insert(aws, clock)
    wire(redrive_handler, aws, monkeypatch)
    monkeypatch.setattr(
        redrive_handler, "_redrive", lambda services: StreamRedrive(stream, Relay(services))
    )
    capsys.readouterr()
    # WHEN the handler takes it
    answer = redrive_handler.lambda_handler(_on_failure_event(failure), LambdaContextStub())
    # THEN no record failed (the message is not kept to come back), alice's fire was sent,
    # and bob's item is counted
    assert answer == {"batchItemFailures": []}
    emitted = _emitted_metrics(capsys.readouterr().out)
    # (and how far its clock is from DynamoDB's: this test's clock is weeks from moto's)
    assert emitted.pop("ClockSkew") > 3600
    assert emitted == {"Redriven": 1, "MalformedItems": 1}
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [hers]


def test_relay_neither_fails_nor_sends_an_occurrence_forged_far_ahead_or_too_large(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN two well-formed occurrence items bob's worker forged under his own keys: one
    # receivable in a day (SQS holds a message at most 900 s), one with a 300 KB payload
    # (over SQS's 256 KiB); and one of alice's fires behind them in the batch
    sid = bobs_schedule(aws, clock)
    now = int(clock.now)

    def forged(instant: int, available: int, payload: dict[str, Any]) -> dict[str, Any]:
        return {
            "occurrence_id": {"S": occurrence_id(sid, 1, instant)},
            "tenant_id": {"S": "bob"},
            "schedule_version": {"N": "1"},
            "scheduled_for": {"N": str(instant)},
            "available_at": {"N": str(available)},
            "target": {"S": "default"},
            "state": {"S": "SCHEDULED"},
            "payload": {"M": payload},
        }

    plant(aws, sid, now + 7200, forged(now + 7200, now + 86400, {}))
    plant(aws, sid, now + 3600, forged(now + 3600, now, {"x": {"S": "x" * 300_000}}))
    hers = one_shot(aws, clock, tenant="alice")
    clock.advance(30)
    # WHEN the relay takes the batch
    report = Relay(aws).relay(
        [
            inserted(aws, sid, now + 7200, 1),
            inserted(aws, sid, now + 3600, 2),
            record(aws, hers, 3),
        ]
    )
    # THEN no record fails: the far one is held back (the reconciler re-sends what is
    # overdue), the large one is DEAD (SQS would refuse its batch whole, every time)
    assert report.failures == {}
    assert (report.too_early, report.undeliverable, report.sent) == (1, 1, 1)
    large = aws.occurrences.get(occurrence_id(sid, 1, now + 3600))
    assert large is not None
    assert large.state.value == "DEAD"
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [hers]


def test_reconciler_never_resends_bobs_occurrence_into_alices_queue_whatever_it_claims(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN bob's hourly occurrence of 10:00, never taken, whose item bob's worker changed to
    # name alice as its tenant (his policy lets him update his own occurrences)
    clock.now = at("09:50")
    bob_sid = make(aws, tenant="bob", spec=cron_spec("0 * * * *"))
    materialize_until(aws, clock, at("10:05"), [0])
    forged = occurrence_id(bob_sid, 1, at("10:00"))
    bobs_worker(aws).write(
        aws.settings.occurrences_table,
        to_dynamo(occurrence_key(forged)),
        {"tenant_id": {"S": "alice"}},
    )
    # WHEN the hourly run finds it overdue and re-sends what no worker took
    clock.now = at("12:05")
    [result] = Reconciler(aws, workers=1).run([0], at("10:00"), at("11:00"))
    # THEN nothing reaches alice's queue (the queue is the one its key's tenant owns, and a
    # tenant field that disagrees with the key is refused on every path that sends)
    assert result.redriven == []
    assert messages(aws, "alice") == []


def test_relay_and_worker_refuse_an_occurrence_of_bobs_that_names_alice(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN bob's occurrence, whose item bob's worker changed to name alice
    made = aws.occurrences.get(one_shot(aws, clock, tenant="bob"))
    assert made is not None
    key = to_dynamo(occurrence_key(made.occurrence_id))
    bobs_worker(aws).write(aws.settings.occurrences_table, key, {"tenant_id": {"S": "alice"}})
    forged = aws.occurrences.get(made.occurrence_id)
    assert forged is not None
    assert forged.tenant_id == "alice"
    clock.advance(30)
    # WHEN it is re-sent (the path of the reconciler's re-drive); THEN it is refused
    assert Relay(aws).send([outbound("1", StoredOccurrence(forged, {}))]).refused == 1
    assert messages(aws, "alice") == []
    # AND WHEN its message reached alice's queue anyway, alice's worker rejects it: bob's
    # occurrence is neither claimed nor run by alice's worker (on AWS her role could not
    # even read it; the key, not the item's field, says whose it is)
    alices = queue_name("punctual", "alice", "default")
    url = aws.sqs.get_queue_url(QueueName=alices)["QueueUrl"]
    aws.sqs.send_message(QueueUrl=url, MessageBody=message_body(forged, {}))
    [delivery] = receive(aws, alices)
    ran: list[str] = []
    result = Worker(aws, "alice", lambda job: ran.append(job.occurrence_id)).process(delivery)
    assert result.outcome is Outcome.REJECTED
    assert ran == []


def test_reconciler_counts_a_tenants_malformed_item_and_settles_the_shards_hour(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN alice's and bob's hourly schedules on one shard, made before the hour
    # [10:00, 11:00); alice's 10:30 fire was lost by the materializer, and bob's worker
    # stripped his 10:00 occurrence of its identity (UpdateItem REMOVE: his policy allows it)
    clock.now = at("08:50")
    alice_sid = make(aws, tenant="alice", spec=cron_spec("30 * * * *"))
    bob_sid = make(aws, tenant="bob", spec=cron_spec("0 * * * *"))
    materialize_until(
        aws, clock, at("11:10"), [0], skip=lambda s, t: s == alice_sid and t == at("10:30")
    )
    key = to_dynamo(occurrence_key(occurrence_id(bob_sid, 1, at("10:00"))))
    bobs_worker(aws).update_item(
        TableName=aws.settings.occurrences_table,
        Key=key,
        UpdateExpression="REMOVE occurrence_id, tenant_id, scheduled_for, available_at",
    )
    # WHEN the hourly run checks that hour
    clock.now = at("12:05")
    [result] = Reconciler(aws, workers=2).run([0], at("10:00"), at("11:00"))
    # THEN the run completes and stores its report: alice's gap is repaired, bob's item is
    # counted (not judged, not repaired: its key is taken)
    report = result.report
    assert report.complete
    assert report.malformed == 1
    assert result.fired == [occurrence_id(alice_sid, 1, at("10:30"))]
    assert occurrence_id(bob_sid, 1, at("10:00")) not in result.missing
    assert aws.reports.get_many(at("10:00"), at("11:00"), [0]) == [report]
    # AND once alice's repaired fire ran, a run an hour later finds the hour settled: bob's
    # item keeps nothing open (no hour left for ReconcileGaveUp)
    set_occurrence_state(aws, occurrence_id(alice_sid, 1, at("10:30")), "SUCCEEDED")
    clock.now = at("13:05")
    again = Reconciler(aws, workers=2).run([0], at("10:00"), at("11:00"))
    assert again[0].report.settled
    assert again[0].report.counts[Finding.MISSING] == 0


def test_materializer_replan_skips_a_tenants_malformed_item_and_walks_on(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN bob's daily 09:00 in Vancouver planned under tzdata 2025b, and an item of only a
    # state that bob's worker made among his occurrences; alice's every-minute schedule on
    # the same shard
    use_zone_source(OLD)
    try:
        clock.now = at("15:40", "2026-12-02")
        bob_sid = make(aws, tenant="bob", spec=cron_spec("0 9 * * *", "America/Vancouver"))
        materialize_until(aws, clock, at("16:41", "2026-12-02"), [0], every=600)
    finally:
        use_zone_source(None)
    plant(aws, bob_sid, at("16:30", "2026-12-02"), ONLY_STATE)
    alice_sid = make(aws, tenant="alice", spec=cron_spec("* * * * *"))
    # WHEN the pinned release is in use and the materializer walks on
    materialize_until(aws, clock, at("17:20", "2026-12-02"), [0], every=60)
    # THEN bob's schedule was re-planned (09:00 is 16:00Z now) and the walk went past: alice
    # fires every minute up to the walk's end
    item = aws.schedules.current(bob_sid)
    assert item is not None
    assert item.schedule.tzdata_version != "2025b"
    made = aws.occurrences.window(
        alice_sid, since=at("17:00", "2026-12-02"), until=at("17:20", "2026-12-02")
    )
    assert len(made.occurrences) == 21
    watermark = aws.leases.watermark(0)
    assert watermark is not None
    assert watermark > at("17:20", "2026-12-02")


def test_api_lists_and_gets_a_schedules_occurrences_without_a_malformed_one(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    _alice_api, bob_api = both
    # GIVEN bob's schedule with a real occurrence and an item of only a state beside it
    at_ = datetime.fromtimestamp(clock.now + 60).astimezone().isoformat()
    created = bob_api.post(
        "/v1/schedules", {"target": "default", "spec": {"kind": "at", "at": at_}}
    )
    assert created.status == 201, created.body
    sid = created.body["schedule"]["schedule_id"]
    bad = plant(aws, sid, int(clock.now) + 30, ONLY_STATE)
    # WHEN bob lists its occurrences and asks for the bad one
    listed = bob_api.get(f"/v1/schedules/{sid}/occurrences")
    got = bob_api.get(f"/v1/occurrences/{bad}")
    # THEN the list answers (the real one only) and the bad one is not found: no 500
    assert listed.status == 200, listed.body
    assert [o["occurrence_id"] for o in listed.body["occurrences"]] != []
    assert bad not in [o["occurrence_id"] for o in listed.body["occurrences"]]
    assert got.status == 404


def test_worker_rejects_a_message_whose_occurrence_item_is_unreadable(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN bob's real occurrence in his queue, whose item bob's worker then mangled (its
    # attempt count a string)
    made = one_shot(aws, clock, tenant="bob")
    clock.advance(30)
    assert Relay(aws).relay([record(aws, made, 1)]).sent == 1
    bobs_worker(aws).write(
        aws.settings.occurrences_table,
        to_dynamo(occurrence_key(made)),
        {"attempt_count": {"S": "many"}},
    )
    [delivery] = receive(aws, BOBS_QUEUE)
    # WHEN bob's worker SDK takes the message
    result = Worker(aws, "bob", lambda job: None).process(delivery)
    # THEN it is rejected (to the DLQ), not an error of the poll
    assert result.outcome is Outcome.REJECTED
    assert aws.bad_items.count >= 1


def test_every_write_the_worker_sdk_makes_to_an_occurrence_refuses_to_create_one(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN the worker SDK's writes of a full run and a dead one (claim, heartbeat, retry,
    # completion, refusal, the DLQ flag), recorded as they were sent
    made = [one_shot(aws, clock, tenant="bob") for _ in range(2)]
    clock.advance(30)
    assert Relay(aws).relay([record(aws, o, n) for n, o in enumerate(made, 1)]).sent == 2
    sent: list[dict[str, Any]] = []
    real = aws.dynamodb

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def update_item(self, **request: Any) -> Any:
            sent.append({"Update": request})
            return real.update_item(**request)

        def transact_write_items(self, **request: Any) -> Any:
            sent.extend(request["TransactItems"])
            return real.transact_write_items(**request)

    recording = Services(Recording(), aws.sqs, aws.settings, aws.now)

    def handler(job: Any) -> None:
        job.heartbeat()
        if job.occurrence_id == made[1]:
            raise ValueError("permanent")

    work = Worker(recording, "bob", handler, permanent=(ValueError,))
    for delivery in receive(aws, BOBS_QUEUE):
        work.process(delivery)
    writes = [
        body
        for action in sent
        for kind, body in action.items()
        if kind == "Update" and body["TableName"] == aws.settings.occurrences_table
    ]
    assert len(writes) >= 4
    # WHEN each is sent again for an occurrence key that holds no item
    table = aws.settings.occurrences_table
    for n, body in enumerate(writes):
        key = {"schedule_id": {"S": "sch_bob.none"}, "sk": {"S": f"{OCCURRENCE_PREFIX}{n:012d}#1"}}
        request = {k: v for k, v in body.items() if k != "ReturnValuesOnConditionCheckFailure"}
        with pytest.raises(Exception, match="ConditionalCheckFailed"):
            aws.dynamodb.update_item(**(request | {"Key": key}))
        # THEN its condition refuses it and no item is made
        assert "Item" not in aws.dynamodb.get_item(TableName=table, Key=key)


def test_reconciler_counts_a_tenants_forged_backfill_records_and_reads_only_its_own_schedule(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN alice's and bob's hourly schedules on one shard, every fire done, and bob's
    # worker making backfill records under his schedule's key (UpdateItem
    # makes them): one not a record's key, one a range that ends before it starts, one a
    # range of every instant there is
    clock.now = at("08:50")
    make(aws, tenant="alice", spec=cron_spec("30 * * * *"))
    bob_sid = make(aws, tenant="bob", spec=cron_spec("0 * * * *"))
    materialize_until(aws, clock, at("11:00"), [0])
    for item in stored(aws):
        set_occurrence_state(aws, item["occurrence_id"], "SUCCEEDED")
    for sk in (
        f"{BACKFILL_PREFIX}{at('10:30'):012d}#garbage",
        backfill_sk(at("10:30"), at("10:00"), at("09:00")),
        backfill_sk(at("10:30"), 0, 10**12 - 1),
    ):
        key = to_dynamo({"schedule_id": bob_sid, "sk": sk})
        bobs_worker(aws).write(aws.settings.occurrences_table, key, {"x": {"S": "y"}})
    # WHEN an operator checks [10:00, 11:00) right after it closed (every schedule's
    # backfill records are read: the index may not show a mark yet)
    clock.now = at("11:01")
    [result] = Reconciler(aws, workers=2).run([0], at("10:00"), at("11:00"))
    # THEN the run completes and settles: the two unreadable records counted, the range
    # read within bob's own schedule (his fires, done), nothing re-sent
    report = result.report
    assert (report.complete, report.settled, report.malformed) == (True, True, 2)
    assert report.counts[Finding.SUCCEEDED] == 2
    assert result.redriven == []
    assert messages(aws, "alice") == []


def test_schedule_figures_leave_out_what_bobs_worker_wrote_and_alices_are_untouched(
    both: tuple[Api, Api], aws: Services, clock: Clock
):
    # GIVEN bob's one-shot, due and relayed, whose item's attempt history bob's worker
    # replaced with a string, and a forged item under his schedule's key; and alice's one
    # fire, due and relayed
    made = one_shot(aws, clock, tenant="bob")
    hers = one_shot(aws, clock, tenant="alice")
    clock.advance(30)
    assert Relay(aws).relay([record(aws, made, 1), record(aws, hers, 2)]).sent == 2
    sid = occurrence_key(made)["schedule_id"]
    bobs_worker(aws).write(
        aws.settings.occurrences_table, to_dynamo(occurrence_key(made)), {"attempts": {"S": "x"}}
    )
    plant(aws, sid, int(clock.now) - 10, ONLY_STATE)
    alice_api, bob_api = both
    # WHEN each reads its schedule
    bobs = bob_api.get(f"/v1/schedules/{sid}")
    alices = alice_api.get(f"/v1/schedules/{occurrence_key(hers)['schedule_id']}")
    # THEN bob's answers, both items counted unreadable and no fire; alice's has her fire
    assert bobs.status == 200, bobs.body
    assert (bobs.body["recent"]["fires"], bobs.body["recent"]["unreadable"]) == (0, 2)
    assert alices.status == 200, alices.body
    assert (alices.body["recent"]["fires"], alices.body["recent"]["unreadable"]) == (1, 0)
    assert alices.body["recent"]["outcomes"]["open"] == 1


@pytest.mark.parametrize(
    "written",
    [
        {
            "attempts": {
                "L": [
                    {
                        "M": {
                            "attempt_no": {"N": "1"},
                            "started_at": {"N": "1795000000"},
                            "lease_expires_at": {"N": "1"},
                            "finished_at": {"N": "100000000000000"},
                            "outcome": {"S": "RETRY"},
                        }
                    }
                ]
            }
        },
        {"state": {"S": "DEAD"}, "available_at": {"N": "100000000000000"}},
        {"enqueued_at": {"N": "-100000000000000"}},
    ],
    ids=["attempt_far_ahead", "due_far_ahead", "sent_far_behind"],
)
def test_an_instant_no_date_can_show_makes_bobs_item_unreadable_not_his_answers_fail(
    both: tuple[Api, Api], aws: Services, clock: Clock, written: dict[str, Any]
):
    # GIVEN bob's real occurrence whose item bob's worker gave an instant out of any
    # calendar (its attempt's end, its due time, its send)
    made = one_shot(aws, clock, tenant="bob")
    clock.advance(30)
    bobs_worker(aws).write(aws.settings.occurrences_table, to_dynamo(occurrence_key(made)), written)
    _, bob_api = both
    sid = occurrence_key(made)["schedule_id"]
    # WHEN bob reads his schedule, its occurrences and that one
    got = bob_api.get(f"/v1/schedules/{sid}")
    listed = bob_api.get(f"/v1/schedules/{sid}/occurrences")
    one = bob_api.get(f"/v1/occurrences/{made}")
    # THEN each answers (no 500): the item counted unreadable and left out, not found (a
    # listing, which shows no attempts, reads the occurrence without them)
    assert got.status == 200, got.body
    assert (got.body["recent"]["fires"], got.body["recent"]["unreadable"]) == (0, 1)
    assert listed.status == 200, listed.body
    assert len(listed.body["occurrences"]) == (1 if "attempts" in written else 0)
    assert one.status == 404, one.body
