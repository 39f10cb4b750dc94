"""Messages the worker SDK rejects, on moto with the injected clock. Whatever is in the tenant's
queue that is not one of its occurrence messages (a body that is not JSON or is of another
version, another tenant's message, an id that names no occurrence or another instant) is
rejected into the DLQ with its reason, without running the handler or touching any
occurrence."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from punctual.dal.runs import RunStore
from punctual.domain.ids import occurrence_id
from punctual.integrations.queues import queue_name
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.timing import utc_text
from punctual_client.worker import Outcome
from tests.integration.conftest import START, Api, Clock
from tests.integration.helpers import table_items
from tests.integration.test_relay import one_shot, record
from tests.integration.worker.helpers import (
    Calls,
    S,
    consumer,
    dead_letters,
    depth,
    due,
    receive,
    stored,
    url_of,
    worker,
)

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


def test_dlq_sent_for_an_occurrence_whose_item_is_gone_makes_no_item(aws: Services) -> None:
    # GIVEN an occurrence whose item is gone (its retention ended) before its DLQ copy was sent
    gone = occurrence_id("sch_alice.gone", 1, START)
    # WHEN the worker SDK clears its dlq_pending flag
    RunStore(aws.dynamodb, aws.settings).dlq_sent(gone)
    # THEN no item is made: an update without its condition would create a key-only
    # occurrence item, which every reader would then count as a tenant's bad data
    assert table_items(aws, aws.settings.occurrences_table) == []
