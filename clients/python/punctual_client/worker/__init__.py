"""The worker SDK: consume a tenant's occurrences with leases, fencing, retries, overlap
control and idempotent effects (docs/worker.md)."""

from punctual.dal.effects import EffectLedger
from punctual.domain.message import Message
from punctual_client.worker.consume import QueueConsumer, sqs_lambda_handler
from punctual_client.worker.core import (
    Delivery,
    Handler,
    Job,
    Outcome,
    PermanentError,
    Result,
    Worker,
    backoff_ceiling,
)
from punctual_client.worker.wiring import WorkerClients, WorkerServices

__all__ = [
    "Delivery",
    "EffectLedger",
    "Handler",
    "Job",
    "Message",
    "Outcome",
    "PermanentError",
    "QueueConsumer",
    "Result",
    "Worker",
    "WorkerClients",
    "WorkerServices",
    "backoff_ceiling",
    "sqs_lambda_handler",
]
