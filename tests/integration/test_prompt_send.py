"""The relay's batching window and the API's prompt send (issue 21): with a window the
on-time mapping may hold a record that long, so what the API makes receivable within the
window (and a margin) it sends itself, at once, after its commit: a run now, a one-shot due
in a moment. What is due later, and a catch-up, it leaves to the relay; a failed prompt send
never fails the request (the outbox still sends it); without a window it sends nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.control.plane import PROMPT_MARGIN_SECONDS
from punctual.dal.tenants import TenantStore
from punctual.domain.ids import occurrence_id
from punctual.pipeline.relay import Relay
from punctual.services import Services
from punctual.settings import Settings
from tests.instants import iso
from tests.integration.conftest import OPERATOR, START, Api, Clock
from tests.integration.helpers import create, cron, make, one_shot
from tests.integration.reconciler.helpers import materialize_until, shards_of
from tests.integration.test_backfill import at, backfill, running_since_0940
from tests.integration.test_relay import messages, record
from tests.integration.test_trigger import trigger

WINDOW = 2


@pytest.fixture
def window() -> int:
    return WINDOW


@pytest.fixture
def settings(window: int) -> Settings:
    return Settings(
        operator_principals=frozenset({OPERATOR}), shard_count=8, relay_window_seconds=window
    )


@pytest.fixture
def sent(aws: Services) -> Iterator[list[dict[str, Any]]]:
    """Every entry handed to SendMessageBatch (then sent for real). Seen through botocore's
    events, not a wrapper of the method: the call stays the code's own (tests/aws_calls.py
    attributes it to the function that made it)."""
    entries: list[dict[str, Any]] = []

    def recording(params: dict[str, Any], **_: Any) -> None:
        entries.extend(params["Entries"])

    event = "before-parameter-build.sqs.SendMessageBatch"
    aws.sqs.meta.events.register(event, recording)
    yield entries
    aws.sqs.meta.events.unregister(event, recording)


def ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["MessageAttributes"]["occurrence_id"]["StringValue"] for e in entries]


def test_a_run_now_is_sent_by_the_api_at_once_and_again_by_the_relay_under_its_id(
    alice: Api, aws: Services, clock: Clock, sent: list[dict[str, Any]]
):
    sid = create(alice, cron("0 * * * *"))["schedule"]["schedule_id"]
    # WHEN its owner runs it now
    made = trigger(alice, sid).body["occurrence"]["occurrence_id"]
    # THEN the message is in the queue when the API answers, receivable at once: no relay
    # has seen the stream record yet
    assert ids(sent) == [made]
    assert sent[0]["DelaySeconds"] == 0
    # ... and the relay, when the record comes, sends the same occurrence id again (the
    # outbox is what guarantees it; the worker drops the duplicate)
    Relay(aws).relay([record(aws, made, 1)])
    assert ids(sent) == [made, made]


def test_a_one_shot_due_within_the_window_is_sent_at_once_never_receivable_early(
    alice: Api, aws: Services, clock: Clock, sent: list[dict[str, Any]]
):
    clock.now = START + 0.4  # Lambda's clocks are fractional
    due = START + WINDOW + PROMPT_MARGIN_SECONDS - 1
    saved = create(alice, one_shot(iso(due)))
    [made] = [o["occurrence_id"] for o in saved["materialized"]]
    assert ids(sent) == [made]
    # Receivable at its time, not before: the delay is rounded up
    assert clock.now + sent[0]["DelaySeconds"] >= due
    assert sent[0]["DelaySeconds"] == due - START


def test_a_one_shot_due_past_the_window_and_margin_is_left_to_the_relay(
    alice: Api, aws: Services, clock: Clock, sent: list[dict[str, Any]]
):
    # The first instant the outbox alone brings to the queue in time
    due = START + WINDOW + PROMPT_MARGIN_SECONDS
    saved = create(alice, one_shot(iso(due)))
    assert [o["occurrence_id"] for o in saved["materialized"]]  # made by the API ...
    assert sent == []  # ... but sent by the relay only


def test_a_catch_up_is_not_sent_by_the_api(
    alice: Api, aws: Services, clock: Clock, sent: list[dict[str, Any]]
):
    # GIVEN a */5 schedule whose 10:15 fire was lost; now is 10:31
    sid = running_since_0940(aws, clock, lost={at("10:15")})
    clock.now = at("10:31")
    sent.clear()  # the create's own first fire (09:40, due at its creation)
    # WHEN the owner backfills it: receivable now, but paced, in the catch-up lane
    answer = backfill(alice, sid, at("10:10"), at("10:20"))
    assert answer.status == 200, answer.body
    assert answer.body["created"] == 1
    # THEN the API sends nothing: the catch-up lane's relay does
    assert sent == []


def test_a_backfilled_fire_still_ahead_and_due_within_the_window_is_sent_at_once(
    alice: Api, aws: Services, clock: Clock, sent: list[dict[str, Any]]
):
    # GIVEN a */5 schedule the materializer walked to 10:40, passing 10:35 with no record
    clock.now = at("09:40")
    sid = make(aws, spec={"kind": "cron", "expression": "*/5 * * * *", "timezone": "UTC"})
    materialize_until(
        aws, clock, at("10:40"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:35")
    )
    clock.now = at("10:35") - 1
    sent.clear()
    # WHEN its owner backfills [10:30, 10:40): 10:35 is a second away, at its own time
    answer = backfill(alice, sid, at("10:30"), at("10:40"))
    assert answer.status == 200, answer.body
    assert answer.body["created"] == 1
    # THEN the API sends it at once, receivable at its time
    assert ids(sent) == [occurrence_id(sid, 1, at("10:35"))]
    assert sent[0]["DelaySeconds"] == 1


@pytest.mark.parametrize(
    "fault",
    ["SendMessageBatch throttled", "the target's read throttled"],
)
def test_a_failed_prompt_send_does_not_fail_the_request_and_the_relay_still_sends(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch, fault: str
):
    throttled = ClientError(
        {"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "Any"
    )

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise throttled

    sid = create(alice, cron("0 * * * *"))["schedule"]["schedule_id"]
    # (on the class: the services hand out a new tenant store on every use)
    owner: Any = aws.sqs if "SendMessage" in fault else TenantStore
    name = "send_message_batch" if "SendMessage" in fault else "get_target"
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, refuse)
    # WHEN a run now's prompt send fails after its commit (SQS refuses the batch, or the
    # read of the target's queue raises out of the send)
    answer = trigger(alice, sid)
    # THEN the request succeeded: the occurrence is made and stays SCHEDULED, and no
    # message went out ...
    assert answer.status == 201, answer.body
    made = answer.body["occurrence"]["occurrence_id"]
    assert alice.get(f"/v1/occurrences/{made}").body["state"] == "SCHEDULED"
    monkeypatch.setattr(owner, name, real)
    assert messages(aws, "alice") == []
    # ... and its stream record is what sends it
    report = Relay(aws).relay([record(aws, made, 1)])
    assert (report.sent, report.failures) == (1, {})
    assert [m["occurrence_id"] for m in messages(aws, "alice")] == [made]


@pytest.mark.parametrize("window", [0])
def test_without_a_window_the_api_sends_nothing(
    alice: Api, aws: Services, clock: Clock, sent: list[dict[str, Any]]
):
    sid = create(alice, cron("0 * * * *"))["schedule"]["schedule_id"]
    assert trigger(alice, sid).status == 201
    assert sent == []
