"""The local SQS engine's rates (`make bench-sqs`): delayed sends in batches of 10, due
messages received and deleted while 20,000 delayed ones wait, four consumers at once,
and a restart after kill -9 with everything kept. Durable (fsync per call, as `local up`
runs it) and, for comparison, without fsync."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import boto3

from punctual_local.dynamodb import free_port, wait_listening
from punctual_local.engines import ACCOUNT, REGION
from punctual_local.sqs import sqs_command

COUNTS = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]


def start(port: int, data: Path, durable: bool) -> subprocess.Popen[bytes]:
    command = sqs_command(port, data, ACCOUNT)
    if not durable:
        command.remove("--durable")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, process, 30)
    return process


def client(port: int) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name=REGION,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def send(sqs: Any, url: str, batches: int, delay: int) -> float:
    """Messages per second, batches of 10."""
    started = time.monotonic()
    for batch in range(batches):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "MessageBody": f"{batch}-{i}", "DelaySeconds": delay}
                for i in range(10)
            ],
        )
    return batches * 10 / (time.monotonic() - started)


def drain(port: int, url: str, consumers: int) -> float:
    """Due messages received and deleted per second by ``consumers`` threads."""
    done = [0] * consumers

    def consume(me: int) -> None:
        sqs = client(port)
        while messages := sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", []):
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )
            done[me] += len(messages)

    started = time.monotonic()
    threads = [threading.Thread(target=consume, args=(me,)) for me in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started - 1)  # the last, empty, 1 s poll


def run(durable: bool, delayed_batches: int, due_batches: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="punctual-bench-sqs-")) / "sqs"
    port = free_port()
    process = start(port, data, durable)
    try:
        sqs = client(port)
        url = sqs.create_queue(QueueName="bench")["QueueUrl"]
        delayed = send(sqs, url, delayed_batches, 900)
        due = send(sqs, url, due_batches, 0)
        one = drain(port, url, 1)
        send(sqs, url, due_batches, 0)
        four = drain(port, url, 4)
        before = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=COUNTS)["Attributes"]
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        started = time.monotonic()
        process = start(port, data, durable)
        restart = time.monotonic() - started
        after = client(port).get_queue_attributes(QueueUrl=url, AttributeNames=COUNTS)
        kept = after["Attributes"] == before
    finally:
        process.terminate()
        process.wait()
    print(
        f"{'durable (fsync per call)' if durable else 'no fsync':<25} "
        f"delayed sends {delayed:6.0f}/s, due sends {due:6.0f}/s, receive+delete with "
        f"{delayed_batches * 10} delayed: 1 consumer {one:5.0f}/s, 4 consumers {four:5.0f}/s; "
        f"kill -9 and restart {restart:.2f} s, everything kept: {kept}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delayed-batches", type=int, default=2000)
    parser.add_argument("--due-batches", type=int, default=200)
    args = parser.parse_args()
    for durable in (True, False):
        run(durable, args.delayed_batches, args.due_batches)


if __name__ == "__main__":
    main()
