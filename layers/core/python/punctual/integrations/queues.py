"""Target queues: one standard SQS queue per tenant target, with its dead-letter queue."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Receives before SQS moves a message to the DLQ: above the largest retry policy
# (max_attempts <= 20), so only poison messages and crash loops end there early.
MAX_RECEIVE_COUNT = 25
DLQ_RETENTION_SECONDS = 14 * 86400
QUEUE_RETENTION_SECONDS = 4 * 86400


@dataclass(frozen=True, slots=True)
class TargetQueues:
    queue_url: str
    queue_arn: str
    dlq_url: str
    dlq_arn: str


def queue_name(prefix: str, tenant_id: str, target: str) -> str:
    return f"{prefix}-{tenant_id}-{target}"


class QueueAdmin:
    def __init__(self, sqs: Any, prefix: str) -> None:
        self._sqs = sqs
        self._prefix = prefix

    def _arn(self, url: str) -> str:
        attributes = self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        return str(attributes["Attributes"]["QueueArn"])

    def create(self, tenant_id: str, target: str) -> TargetQueues:
        """Idempotent: CreateQueue with the same attributes returns the existing queue."""
        name = queue_name(self._prefix, tenant_id, target)
        dlq_url = self._sqs.create_queue(
            QueueName=f"{name}-dlq",
            Attributes={
                "MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS),
                "SqsManagedSseEnabled": "true",
            },
        )["QueueUrl"]
        dlq_arn = self._arn(dlq_url)
        queue_url = self._sqs.create_queue(
            QueueName=name,
            Attributes={
                "MessageRetentionPeriod": str(QUEUE_RETENTION_SECONDS),
                "SqsManagedSseEnabled": "true",
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVE_COUNT)}
                ),
            },
        )["QueueUrl"]
        return TargetQueues(queue_url, self._arn(queue_url), dlq_url, dlq_arn)
