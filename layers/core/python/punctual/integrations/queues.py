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

    def create(self, tenant_id: str, target: str, principals: list[str]) -> TargetQueues:
        """Idempotent: CreateQueue with the same attributes returns the existing queue. The
        tenant's principals are granted what a worker needs (``grant``)."""
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
        queues = TargetQueues(queue_url, self._arn(queue_url), dlq_url, dlq_arn)
        self.grant(queues, principals)
        return queues

    def grant(self, queues: TargetQueues, principals: list[str]) -> None:
        """Queue policies: the tenant's principals consume their queue and copy dead
        messages to its DLQ (the worker SDK); nobody else gets anything from a policy.
        Without principals there is no policy (same-account IAM policies still apply)."""
        if not principals:
            return
        consume = [
            "sqs:ReceiveMessage",
            "sqs:DeleteMessage",
            "sqs:ChangeMessageVisibility",
            "sqs:GetQueueAttributes",
            "sqs:GetQueueUrl",
        ]
        for url, arn, actions in (
            (queues.queue_url, queues.queue_arn, [*consume, "sqs:SendMessage"]),
            (queues.dlq_url, queues.dlq_arn, [*consume, "sqs:SendMessage"]),
        ):
            policy = {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "TenantWorkers",
                        "Effect": "Allow",
                        "Principal": {"AWS": sorted(principals)},
                        "Action": actions,
                        "Resource": arn,
                    }
                ],
            }
            self._sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(policy)})
