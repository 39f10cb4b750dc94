"""Starting a handler on its occurrence's instant (docs/worker.md, *Starting on the instant*),
on moto with the injected clock: a target with early delivery gets its messages up to a
second ahead (the relay rounds the delay down), one without never ahead (rounded up); the
worker SDK holds a message received before its instant until then, by its clock corrected
by the offset from SQS's that it measures, and puts back one received far ahead."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.pipeline.relay import Relay, delay_seconds
from punctual.services import Services
from punctual_client.worker import Delivery, Job, Outcome, QueueConsumer
from punctual_client.worker.core import MAX_HOLD_SECONDS
from tests.integration.conftest import Api, Clock
from tests.integration.test_relay import one_shot, record
from tests.integration.worker.helpers import S, receive, state, url_of, worker


class Held:
    """A worker's hold that moves the injected clock (what a sleep does), recorded."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.waits = clock, list[float]()

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)


class Starts:
    """A handler recording the (true) instant each job started."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.at = clock, list[float]()

    def __call__(self, job: Job) -> None:
        self.at.append(self.clock.now)


class SpySends:
    """moto's SQS, recording each message's DelaySeconds."""

    def __init__(self, real: Any) -> None:
        self.real, self.delays = real, list[int]()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def send_message_batch(self, **request: Any) -> Any:
        self.delays += [e.get("DelaySeconds", 0) for e in request["Entries"]]
        return self.real.send_message_batch(**request)


@pytest.mark.parametrize(
    ("ahead", "early", "delay"),
    [
        (0.0, False, 0),
        (0.0, True, 0),
        (0.4, False, 1),  # up to a second late, never early
        (0.4, True, 0),  # up to a second early, never late
        (3.0, False, 3),
        (3.0, True, 3),
        (3.7, True, 3),
        (-2.0, True, 0),
    ],
)
def test_the_delay_is_rounded_up_unless_the_target_takes_messages_early(
    ahead: float, early: bool, delay: int
) -> None:
    assert delay_seconds(1000, 1000 - ahead, early=early) == delay


@pytest.mark.parametrize("early", [False, True])
def test_the_relay_sends_ahead_only_for_a_target_with_early_delivery(
    alice: Api, aws: Services, clock: Clock, early: bool
) -> None:
    # GIVEN alice's default target with early delivery on or off, and a one-shot due in
    # 20.4 s, made now
    answer = alice.call("PATCH", "/v1/targets/default", {"early_delivery": early})
    assert answer.status == 200, answer.body
    assert answer.body["early_delivery"] is early
    made = one_shot(aws, clock)
    clock.advance(30 - 20.4)
    # WHEN the relay sends it
    spy = SpySends(aws.sqs)
    relayed = Relay(Services(aws.dynamodb, spy, aws.settings, aws.now))
    assert relayed.relay([record(aws, made, 1)]).sent == 1
    # THEN it is receivable 0.4 s before its instant with early delivery, 0.6 s after without
    assert spy.delays == ([20] if early else [21])


def test_a_message_received_before_its_instant_is_held_until_then(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a message received 0.7 s before its instant
    _, delivery = received_ahead(aws, clock, 0.7)
    held, starts = Held(clock), Starts(clock)
    # WHEN the worker processes it
    result = worker(aws, starts, hold=held).process(delivery)
    # THEN it waited out the 0.7 s and started the handler on the instant
    assert result.outcome is Outcome.SUCCEEDED
    assert held.waits == [pytest.approx(0.7)]
    due = json.loads(delivery.body)["available_at"]
    assert starts.at == [pytest.approx(clock.now)]
    assert clock.now == pytest.approx(_epoch(due))


def test_a_message_received_far_ahead_is_put_back_unclaimed_until_its_instant(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a message received further ahead of its instant than a worker holds one (a
    # clock far behind, say)
    made, delivery = received_ahead(aws, clock, MAX_HOLD_SECONDS + 2.5)
    held, starts = Held(clock), Starts(clock)
    # WHEN the worker processes it
    result = worker(aws, starts, hold=held).process(delivery)
    # THEN it is left in the queue, visible again at its instant, unclaimed and not run
    assert (result.outcome, result.delete, result.visible_in) == (Outcome.EARLY, False, 8)
    assert result.detail == f"due in {MAX_HOLD_SECONDS + 2.5:.3f} s"
    assert held.waits == []
    assert starts.at == []
    assert state(aws, made) is S.SCHEDULED


class Short(Held):
    """A hold that ends short of what it was asked: ``left`` of each wait still to go, in
    turn, then none (a sleep on the monotonic clock while the wall clock is slewed back,
    say)."""

    def __init__(self, clock: Clock, left: list[float]) -> None:
        super().__init__(clock)
        self.left = left

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds - (self.left.pop(0) if self.left else 0.0))


@pytest.mark.parametrize(
    ("ahead", "waits"),
    [
        (0.0, []),  # due now: no hold
        (MAX_HOLD_SECONDS, [MAX_HOLD_SECONDS]),  # as far ahead as one is held: held
    ],
    ids=["due", "at-the-bound"],
)
def test_a_message_due_now_is_not_held_and_one_at_the_bound_is(
    alice: Api, aws: Services, clock: Clock, ahead: float, waits: list[float]
) -> None:
    _, delivery = received_ahead(aws, clock, ahead)
    held, starts = Held(clock), Starts(clock)
    result = worker(aws, starts, hold=held).process(delivery)
    assert result.outcome is Outcome.SUCCEEDED
    assert held.waits == [pytest.approx(w) for w in waits]
    assert len(starts.at) == 1


def test_a_hold_that_keeps_ending_short_puts_the_message_back_after_four(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a message 2 s ahead, and holds that each end 0.5 s short of what they waited
    made, delivery = received_ahead(aws, clock, 2)
    short, starts = Short(clock, left=[0.5] * 4), Starts(clock)
    # WHEN the worker processes it
    result = worker(aws, starts, hold=short).process(delivery)
    # THEN it held four times, each for what was left, and since it was still ahead put the
    # message back (visible again in a second at least), unclaimed and not run
    assert short.waits == [pytest.approx(w) for w in (2, 0.5, 0.5, 0.5)]
    assert (result.outcome, result.delete, result.visible_in) == (Outcome.EARLY, False, 1)
    assert result.detail == "due in 0.500 s"
    assert starts.at == []
    assert state(aws, made) is S.SCHEDULED


def received_ahead(aws: Services, clock: Clock, ahead: float) -> tuple[str, Delivery]:
    """A one-shot's occurrence and its message, received ``ahead`` seconds before its
    instant (sent then by the relay)."""
    made = one_shot(aws, clock)
    clock.advance(30 - ahead)
    _relay_now(aws, made)
    [delivery] = receive(aws)
    return made, delivery


class StampedSQS:
    """moto's SQS answering each first receive with SQS's stamp by the true clock (moto's
    own stamps are the wall clock's, not the test's)."""

    def __init__(self, real: Any, clock: Clock) -> None:
        self.real, self.clock = real, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def receive_message(self, **request: Any) -> Any:
        answer = self.real.receive_message(**request)
        for m in answer.get("Messages", []):
            m.setdefault("Attributes", {})["ApproximateFirstReceiveTimestamp"] = str(
                int(self.clock.now * 1000)
            )
        return answer


@pytest.mark.parametrize("host_off", [-2.0, 2.0])
def test_a_host_clock_off_by_seconds_still_starts_the_handler_on_the_instant(
    alice: Api, aws: Services, clock: Clock, host_off: float
) -> None:
    # GIVEN a worker whose host clock is off by 2 s (behind or ahead), consuming through
    # the long-poll consumer, and a target with early delivery: its message received 0.5 s
    # before its instant
    alice.call("PATCH", "/v1/targets/default", {"early_delivery": True})
    made = one_shot(aws, clock)
    clock.advance(30 - 0.5)
    assert Relay(aws).relay([record(aws, made, 1)]).sent == 1
    sqs = StampedSQS(aws.sqs, clock)
    host = Services(aws.dynamodb, sqs, aws.settings, lambda: clock.now + host_off)
    held, starts = Held(clock), Starts(clock)
    consumer = QueueConsumer(worker(host, starts, hold=held), url_of(aws), wait_seconds=0)
    # WHEN it polls and processes the message
    [result] = consumer.poll_once()
    # THEN it measured its offset from SQS's from the message's first receive, held the
    # message 0.5 s (not 2.5 s, nor none), and the handler started on the instant
    assert result.outcome is Outcome.SUCCEEDED
    offset = consumer.worker.skew.offset(clock.now + host_off)
    assert offset is not None
    assert offset.low == pytest.approx(-host_off, abs=0.002)
    # (a second, tiny hold: the estimate's bounds widened by the drift while it waited)
    assert sum(held.waits) == pytest.approx(0.5, abs=0.002)
    assert len(held.waits) <= 2
    assert starts.at[0] >= clock.now - 0.002
    assert state(aws, made) is S.SUCCEEDED


def test_targets_take_early_delivery_at_creation_and_refuse_bad_input(
    alice: Api, aws: Services
) -> None:
    made = alice.post("/v1/targets", {"name": "fast", "early_delivery": True})
    assert made.status == 201, made.body
    assert made.body["early_delivery"] is True
    listed = {t["name"]: t["early_delivery"] for t in alice.get("/v1/targets").body["targets"]}
    assert listed == {"default": False, "fast": True}
    assert ControlPlane(aws).tenants.get_target("alice", "fast", consistent=True) is not None
    for body, field in (
        ({"early_delivery": "yes"}, "early_delivery"),
        ({"early_delivery": 1}, "early_delivery"),
        ({}, "early_delivery"),
        ({"early_delivery": True, "name": "x"}, "name"),
    ):
        answer = alice.call("PATCH", "/v1/targets/fast", body)
        assert answer.status == 400, (body, answer.body)
        assert [f["field"] for f in answer.body["error"]["fields"]] == [field], answer.body
    missing = alice.call("PATCH", "/v1/targets/nope", {"early_delivery": True})
    assert missing.status == 404, missing.body
    assert ControlPlane(aws).tenants.get_target("alice", "nope", consistent=True) is None
    bad = alice.post("/v1/targets", {"name": "slow", "early_delivery": "no"})
    assert bad.status == 400
    assert [f["field"] for f in bad.body["error"]["fields"]] == ["early_delivery"]


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _relay_now(aws: Services, made: str) -> None:
    """The relay sends it at once (its clock 10 s ahead: no delay), as a relay whose clock
    runs ahead would; moto keeps a delay in real time."""
    ahead = Services(aws.dynamodb, aws.sqs, aws.settings, lambda: aws.now() + 10)
    assert Relay(ahead).relay([record(aws, made, 1)]).sent == 1


def test_a_tenant_turns_on_early_delivery_of_its_own_targets_only(
    alice: Api, bob: Api, aws: Services
) -> None:
    # GIVEN alice's target "fast", and bob with none of that name
    assert alice.post("/v1/targets", {"name": "fast"}).status == 201
    # WHEN bob turns early delivery on for "fast"
    answer = bob.call("PATCH", "/v1/targets/fast", {"early_delivery": True})
    # THEN it names no target of his (a tenant's targets are under its own key), and
    # alice's is as it was; nothing was made under bob's key either
    assert answer.status == 404, answer.body
    tenants = ControlPlane(aws).tenants
    hers = tenants.get_target("alice", "fast", consistent=True)
    assert hers is not None
    assert hers.early_delivery is False
    assert tenants.get_target("bob", "fast", consistent=True) is None


class FirstStamped(StampedSQS):
    """As StampedSQS, the stamp being each message's first receive, as SQS keeps it."""

    def __init__(self, real: Any, clock: Clock) -> None:
        super().__init__(real, clock)
        self.first: dict[str, str] = {}

    def receive_message(self, **request: Any) -> Any:
        answer = self.real.receive_message(**request)
        for m in answer.get("Messages", []):
            stamp = self.first.setdefault(m["MessageId"], str(int(self.clock.now * 1000)))
            m.setdefault("Attributes", {})["ApproximateFirstReceiveTimestamp"] = stamp
        return answer


def test_a_redelivered_message_says_nothing_of_the_clock(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a due message received once (its first receive stamped then), and received
    # again 40 s later by a consumer with no estimate yet
    made = one_shot(aws, clock)
    clock.advance(30)
    _relay_now(aws, made)
    sqs = FirstStamped(aws.sqs, clock)
    [first] = sqs.receive_message(QueueUrl=url_of(aws), MaxNumberOfMessages=1)["Messages"]
    clock.advance(40)
    sqs.change_message_visibility(
        QueueUrl=url_of(aws), ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    host = Services(aws.dynamodb, sqs, aws.settings, aws.now)
    starts = Starts(clock)
    consumer = QueueConsumer(worker(host, starts, hold=Held(clock)), url_of(aws), wait_seconds=0)
    # WHEN it processes the redelivery
    [result] = consumer.poll_once()
    # THEN the old first-receive stamp was not taken for this call's (it would say the host
    # clock is 40 s ahead, and put the message back as early): it ran
    assert consumer.worker.skew.offset(clock.now) is None
    assert result.outcome is Outcome.SUCCEEDED


def test_a_hold_that_ends_on_the_instant_at_its_last_try_runs_the_handler(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a message 2 s ahead, and holds that end 0.5 s short three times, then on time
    _, delivery = received_ahead(aws, clock, 2)
    short, starts = Short(clock, left=[0.5] * 3), Starts(clock)
    # WHEN the worker processes it; THEN the fourth hold reached the instant: it runs
    result = worker(aws, starts, hold=short).process(delivery)
    assert short.waits == [pytest.approx(w) for w in (2, 0.5, 0.5, 0.5)]
    assert result.outcome is Outcome.SUCCEEDED
    assert starts.at == [pytest.approx(clock.now)]
