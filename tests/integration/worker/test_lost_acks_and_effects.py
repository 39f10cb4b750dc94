"""Lost acknowledgements and idempotent effects in the worker SDK, on moto with the injected
clock. A redelivery after a lost ack finds the occurrence done and does not repeat its
effect. The effect ledger, kept in a table of the tenant's own, applies an occurrence's
effect once, tells a failing business write from a duplicate, and sees an effect recorded in
the tenant's own transaction or a moment ago on a lagging replica. A worker that crashes or
dies after the effect leaves nothing for the rerun or the takeover to repeat."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from punctual.dal.common import ConditionFailed, Label, from_dynamo
from punctual.domain.occurrence import AttemptOutcome
from punctual.services import Services
from punctual_client.worker import Delivery, EffectLedger, Job, Outcome, Result
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import table_items
from tests.integration.worker.helpers import (
    Calls,
    Flaky,
    S,
    SpySQS,
    WorkerDied,
    consumer,
    depth,
    due,
    make_visible,
    outcomes,
    receive,
    redeliver,
    state,
    with_sqs,
    worker,
)

# --- the tenant's own table for idempotent effects ----------------------------------------


EFFECTS = "alice-effects"  # a table of the tenant's own, key "pk"


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
