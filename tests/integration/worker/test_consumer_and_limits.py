"""The SQS consumer and the limits the worker SDK keeps to, on moto with the injected clock. The
consumer long-polls, polls on after a failed receive, takes up to ten messages a poll and
acknowledges them in one batch, and replaces a message kept on its tenth receive with a fresh
copy, delayed within what SQS allows. The queue's URL is asked for in the queue owner's
account, and the Lambda handler passes on the receive count and the sent time. A completion
throttled every time is tried four times, the back-off is full jitter from zero to its
ceiling, an attempt may start at the deadline itself, the occurrence of a schedule that no
longer exists is refused, and a message stays hidden no longer than the twelve hours SQS
allows."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.dal.common import ConditionFailed, Label, to_dynamo
from punctual.dal.tables import current_key
from punctual.domain.errors import Retryable
from punctual.services import Services
from punctual_client.worker import Delivery, Job, Outcome, QueueConsumer, Result, sqs_lambda_handler
from punctual_client.worker.core import FINISH, MAX_VISIBILITY, REQUEUE_AFTER_RECEIVES, queue_url_of
from tests.integration.conftest import Api, Clock, LambdaContextStub
from tests.integration.worker.helpers import (
    Calls,
    Flaky,
    S,
    SpySQS,
    abandoned,
    by_occurrence,
    consumer,
    depth,
    due,
    fail_transiently,
    make_visible,
    receive,
    redeliver,
    sqs_event,
    state,
    stored,
    url_of,
    with_sqs,
    worker,
)


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


def test_consumer_run_whose_polls_all_work_logs_nothing(
    alice: Api, aws: Services, clock: Clock, caplog: pytest.LogCaptureFixture
):
    # GIVEN an empty queue, and a consumer told to stop at its third poll
    stop = threading.Event()

    class ThreePolls(EmptyReceives):
        def receive_message(self, **kwargs: Any) -> Any:
            if len(self.receives) == 2:
                stop.set()
            return super().receive_message(**kwargs)

    spy = ThreePolls(aws.sqs)
    work = worker(with_sqs(aws, spy), Calls())
    # WHEN the consumer runs until stopped
    with caplog.at_level(logging.WARNING, logger="punctual"):
        QueueConsumer(work, url_of(aws), wait_seconds=0, threads=1).run(stop)
    # THEN it polled three times and said nothing: "polling works again" is said only after
    # polls failed, not at a consumer's first poll
    assert len(spy.receives) == 3
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


class AtOnce:
    """A handler that counts the jobs running at once: each waits (up to ``patience`` s) for
    ``enough`` of them to run together, so the pool's size is what limits the count."""

    def __init__(self, enough: int, patience: float) -> None:
        self.enough = enough
        self.patience = patience
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.ran = 0
        self.reached = threading.Event()

    def __call__(self, job: Job) -> None:
        with self.lock:
            self.running += 1
            self.ran += 1
            self.most = max(self.most, self.running)
            if self.running >= self.enough:
                self.reached.set()
        self.reached.wait(self.patience)
        with self.lock:
            self.running -= 1


class OneCallAtATime:
    """moto's DynamoDB with its calls made one at a time: its transactions deep-copy the
    tables and are not thread-safe (one copied while another thread writes raises
    RuntimeError); DynamoDB is. What runs side by side here is the handlers."""

    def __init__(self, real: Any) -> None:
        self.real, self.lock = real, threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.real, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return attribute(*args, **kwargs)

        return call


@pytest.mark.parametrize(
    ("threads", "most", "enough", "patience"),
    [(1, 1, 2, 0.2), (None, 4, 4, 60.0)],
    ids=["threads=1", "default"],
)
def test_consumer_runs_at_most_threads_handlers_at_once(
    alice: Api,
    aws: Services,
    clock: Clock,
    threads: int | None,
    most: int,
    enough: int,
    patience: float,
):
    # GIVEN six occurrences in alice's queue, and a handler that holds each job until
    # ``enough`` run together, or ``patience`` seconds passed. (The default pool: the first
    # four wait for each other, so exactly four run at once however slow the machine; one
    # thread: each waits for a second job that never comes, so one runs at a time, and a
    # larger pool would show in that time.)
    due(aws, clock, 6)
    handler = AtOnce(enough=enough, patience=patience)
    # WHEN a consumer with ``threads`` (or its default) polls once
    serial = Services(OneCallAtATime(aws.dynamodb), aws.sqs, aws.settings, aws.now)
    work = worker(serial, handler)
    consumer = (
        QueueConsumer(work, url_of(aws), wait_seconds=0)
        if threads is None
        else QueueConsumer(work, url_of(aws), wait_seconds=0, threads=threads)
    )
    consumer.poll_once()
    # THEN every job ran, never more than ``threads`` at once (4 by default; a handler that
    # is not thread-safe asks for 1), and that many did run together
    assert handler.ran == 6
    assert handler.most == most
