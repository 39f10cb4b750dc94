"""The worker SDK's Lambda handler fed by SQS, on moto with the injected clock. It reports
exactly the messages it kept as the batch's item failures, and a batch of only kept messages
returns its failures."""

from __future__ import annotations

import json
from typing import Any

from punctual.services import Services
from punctual_client.worker import Job, Outcome, sqs_lambda_handler
from tests.integration.conftest import ALICE, Api, Clock, LambdaContextStub, bootstrap
from tests.integration.worker.helpers import (
    Calls,
    Flaky,
    S,
    by_occurrence,
    due,
    receive,
    sqs_event,
    state,
    url_of,
    worker,
)

# --- the Lambda feed -------------------------------------------------------------------------


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
