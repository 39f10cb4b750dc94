"""The local SQS engine's fix for moto: pinned to the moto code it replaces, and equal to it."""

from __future__ import annotations

import json

import boto3
import moto
import pytest
from moto import mock_aws
from moto.sqs.models import Queue, sqs_backends

from punctual.local.sqs import (
    ATTRIBUTES_SOURCE_SHA256,
    MOTO_VERSION,
    LazyAttributes,
    attributes_source_digest,
)

ORIGINAL = Queue.attributes.fget  # type: ignore[attr-defined]


def test_fix_is_pinned_to_the_moto_version_and_source_it_replaces():
    # GIVEN the installed moto; WHEN compared with what the fix was written against
    # THEN both match: a moto upgrade that touches Queue.attributes fails here first
    assert moto.__version__ == MOTO_VERSION
    assert attributes_source_digest() == ATTRIBUTES_SOURCE_SHA256


@pytest.mark.parametrize(
    "attributes",
    [
        {},
        {"FifoQueue": "true", "ContentBasedDeduplication": "true"},
        {"KmsMasterKeyId": "alias/aws/sqs", "DelaySeconds": "5"},
        {"Policy": json.dumps({"Version": "2012-10-17", "Statement": []})},
    ],
    ids=["standard", "fifo", "kms", "policy"],
)
def test_lazy_attributes_equal_moto_attributes(monkeypatch: pytest.MonkeyPatch, attributes):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        fifo = attributes.get("FifoQueue") == "true"
        name, dlq_name = ("q.fifo", "dlq.fifo") if fifo else ("q", "dlq")
        dlq = sqs.create_queue(QueueName=dlq_name, Attributes={"FifoQueue": "true"} if fifo else {})
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq["QueueUrl"], AttributeNames=["QueueArn"])
        redrive = {"deadLetterTargetArn": dlq_arn["Attributes"]["QueueArn"], "maxReceiveCount": 3}
        url = sqs.create_queue(
            QueueName=name, Attributes={**attributes, "RedrivePolicy": json.dumps(redrive)}
        )["QueueUrl"]
        extra = {"MessageGroupId": "g"} if fifo else {"DelaySeconds": 60}
        sqs.send_message(QueueUrl=url, MessageBody="m", **extra)
        queue = sqs_backends["123456789012"]["us-east-1"].queues[name]
        # GIVEN a queue with messages; WHEN read through the fix and through moto
        lazy = LazyAttributes(queue)
        # THEN the keys, the values and single-key reads agree
        assert dict(lazy) == ORIGINAL(queue)
        assert lazy.get("MessageRetentionPeriod") == ORIGINAL(queue)["MessageRetentionPeriod"]
        assert lazy.get("NoSuchAttribute") is None
