"""The local SQS engine (roto) on its own: what local mode relies on it to keep through a
kill -9, concurrent consumers, and how it reports a missing queue."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from punctual.integrations.queues import QueueAdmin
from punctual_local.dynamodb import free_port, wait_listening
from punctual_local.engines import ACCOUNT, REGION
from punctual_local.sqs import launch_sqs, queue_exists

pytestmark = pytest.mark.e2e

COUNTS = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesDelayed",
    "ApproximateNumberOfMessagesNotVisible",
]


@dataclass
class RunningEngine:
    data: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.data.parent / "sqs.log").open("ab") as log:
            self.process = launch_sqs(self.port, self.data, ACCOUNT, log)
        wait_listening(self.port, self.process, 30)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def client(self) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=f"http://127.0.0.1:{self.port}",
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )


def everything(sqs: Any, url: str) -> dict[str, str]:
    found: dict[str, str] = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])[
        "Attributes"
    ]
    return found


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[RunningEngine]:
    running = RunningEngine(tmp_path / "sqs", free_port())
    running.start()
    try:
        yield running
    finally:
        if running.process is not None and running.process.poll() is None:
            running.kill()


def test_sqs_engine_keeps_queues_policies_and_every_message_through_kill_9(
    engine: RunningEngine,
):
    # GIVEN a target's queues as Punctual makes them (DLQ, redrive policy, worker policy)
    sqs = engine.client()
    queues = QueueAdmin(sqs, "punctual").create("acme", "jobs", [f"arn:aws:iam::{ACCOUNT}:user/w"])
    # ... 200 messages delayed by up to 900 s (the most SQS allows), 20 due, 5 of them taken
    for batch in range(20):
        sqs.send_message_batch(
            QueueUrl=queues.queue_url,
            Entries=[
                {"Id": str(i), "MessageBody": f"later-{batch}-{i}", "DelaySeconds": 900 - i}
                for i in range(10)
            ],
        )
    for i in range(20):
        sqs.send_message(QueueUrl=queues.queue_url, MessageBody=f"due-{i}")
    taken = sqs.receive_message(
        QueueUrl=queues.queue_url, MaxNumberOfMessages=5, VisibilityTimeout=600
    )["Messages"]
    assert len(taken) == 5
    before = [everything(sqs, url) for url in (queues.queue_url, queues.dlq_url)]
    assert {name: before[0][name] for name in COUNTS} == {
        "ApproximateNumberOfMessages": "15",
        "ApproximateNumberOfMessagesDelayed": "200",
        "ApproximateNumberOfMessagesNotVisible": "5",
    }
    assert {"Policy", "RedrivePolicy"} <= set(before[0])

    # WHEN the engine is killed with SIGKILL and started again on its data folder
    engine.kill()
    engine.start()

    # THEN queues, attributes, policies and every message are there as before
    sqs = engine.client()
    assert sorted(sqs.list_queues()["QueueUrls"]) == sorted([queues.queue_url, queues.dlq_url])
    assert [everything(sqs, url) for url in (queues.queue_url, queues.dlq_url)] == before
    # ... the taken ones are still in flight: their receipt handles still delete them
    deleted = sqs.delete_message_batch(
        QueueUrl=queues.queue_url,
        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(taken)],
    )
    assert (len(deleted.get("Successful", [])), deleted.get("Failed", [])) == (5, [])
    # ... and it keeps its data where it was told, nowhere else
    assert any(engine.data.iterdir())


def test_sqs_engine_serves_four_consumers_without_refusing_a_fresh_receipt_handle(
    engine: RunningEngine,
):
    # GIVEN 2,000 messages in one queue
    sqs = engine.client()
    url = sqs.create_queue(QueueName="busy")["QueueUrl"]
    for batch in range(200):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": f"{batch}-{i}"} for i in range(10)],
        )
    seen: Counter[str] = Counter()
    failed: list[dict[str, Any]] = []
    lock = threading.Lock()

    def consume() -> None:
        client = engine.client()
        while True:
            messages = client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            if not messages:
                return
            answer = client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )
            with lock:
                seen.update(m["Body"] for m in messages)
                failed.extend(answer.get("Failed", []))

    # WHEN four consumers receive and delete in batches at once (moto's server answered
    # ReceiptHandleIsInvalid for some just-received handles here)
    consumers = [threading.Thread(target=consume) for _ in range(4)]
    for consumer in consumers:
        consumer.start()
    for consumer in consumers:
        consumer.join(timeout=120)

    # THEN every delete succeeded and every message was received exactly once
    assert failed == []
    assert len(seen) == 2000
    assert set(seen.values()) == {1}
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=COUNTS)["Attributes"]
    assert set(counts.values()) == {"0"}


def test_a_missing_queue_is_recognized_although_the_engine_names_it_differently(
    engine: RunningEngine,
):
    # GIVEN one queue, and the URL of one that does not exist
    sqs = engine.client()
    url = sqs.create_queue(QueueName="here")["QueueUrl"]
    missing = url.replace("/here", "/gone")
    # WHEN a call names the missing queue
    with pytest.raises(sqs.exceptions.ClientError) as raised:
        sqs.get_queue_attributes(QueueUrl=missing, AttributeNames=["QueueArn"])
    # THEN the engine answers the query-protocol code, not QueueDoesNotExist (botocore maps
    # only that one to its modeled exception) ...
    code = raised.value.response["Error"]["Code"]
    assert code == "AWS.SimpleQueueService.NonExistentQueue"
    assert not isinstance(raised.value, sqs.exceptions.QueueDoesNotExist)
    # ... and queue_exists, which the bootstrap's restore asks, tells both apart all the same
    assert (queue_exists(sqs, url), queue_exists(sqs, missing)) == (True, False)
