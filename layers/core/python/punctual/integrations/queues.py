"""Target queues: one standard SQS queue per tenant target, with its dead-letter queue.

Names are unambiguous by construction: ``<prefix>-<tenant>_<target>`` and the DLQ
``<prefix>-<tenant>__<target>``. A tenant id has no ``_`` (so the first ``_`` ends it) and a
target name cannot begin with ``_`` (so a second one marks the DLQ): no two (tenant, target,
role) triples share a name, whatever names tenants pick. Each queue is also tagged with its
owner, and the tags are checked before any grant: a queue of another owner is refused even
if a name were ever reused.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from punctual.backoff import Backoff
from punctual.domain.errors import Conflict
from punctual.domain.principals import principal_patterns
from punctual.domain.schedule import TARGET_NAME_PATTERN
from punctual.domain.tenancy import TENANT_ID_PATTERN

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


OWNER_TAG = "punctual:tenant"
TARGET_TAG = "punctual:target"
ROLE_TAG = "punctual:role"
MAX_NAME = 80  # SQS's limit on a queue name
# SQS's CreateQueue: a queue can be used about a second after it was created; until then a
# call on it may say it does not exist. Waits of 0.25, 0.5, 1, 2 and 2 s: about 6 s in all.
NEW_QUEUE = Backoff(tries=6, base=0.25, cap=2.0)
_MISSING = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")

T = TypeVar("T")


def queue_name(prefix: str, tenant_id: str, target: str, *, dlq: bool = False) -> str:
    name = f"{prefix}-{tenant_id}{'__' if dlq else '_'}{target}"
    if len(name) > MAX_NAME:
        raise ValueError(f"queue name {name!r} is longer than SQS's {MAX_NAME} characters")
    return name


def queue_owner(prefix: str, name: str) -> tuple[str, str, bool] | None:
    """The (tenant, target, is the DLQ) a queue name stands for, ``queue_name`` read back;
    None for a name it cannot have made (another application's queue in the account)."""
    if not name.startswith(f"{prefix}-"):
        return None
    tenant, separator, rest = name[len(prefix) + 1 :].partition("_")
    dlq = rest.startswith("_")
    target = rest[1:] if dlq else rest
    if not (
        separator
        and re.fullmatch(TENANT_ID_PATTERN, tenant)
        and re.fullmatch(TARGET_NAME_PATTERN, target)
    ):
        return None
    return tenant, target, dlq


class QueueAdmin:
    def __init__(self, sqs: Any, prefix: str, sleep: Callable[[float], None] = time.sleep) -> None:
        self._sqs = sqs
        self._prefix = prefix
        self._sleep = sleep

    def _settled(self, call: Callable[[], T]) -> T:
        """``call`` on a queue created a moment ago, tried again while SQS says the queue
        does not exist yet (NEW_QUEUE); any other error, or the last try's, is raised."""
        for attempt in range(NEW_QUEUE.tries):
            try:
                return call()
            except ClientError as error:
                if _code(error) not in _MISSING or attempt == NEW_QUEUE.tries - 1:
                    raise
            self._sleep(NEW_QUEUE.ceiling(attempt))
        raise AssertionError("unreachable: the last try returns or raises")

    def _arn(self, url: str) -> str:
        attributes = self._settled(
            lambda: self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
        )
        return str(attributes["Attributes"]["QueueArn"])

    def create(self, tenant_id: str, target: str, principals: list[str]) -> TargetQueues:
        """Idempotent: CreateQueue with the same attributes returns the existing queue. The
        tenant's principals are granted what a worker needs (``grant``)."""
        dlq_url = self._create(
            tenant_id,
            target,
            "dlq",
            {"MessageRetentionPeriod": str(DLQ_RETENTION_SECONDS), "SqsManagedSseEnabled": "true"},
        )
        dlq_arn = self._arn(dlq_url)
        queue_url = self._create(
            tenant_id,
            target,
            "queue",
            {
                "MessageRetentionPeriod": str(QUEUE_RETENTION_SECONDS),
                "SqsManagedSseEnabled": "true",
                "RedrivePolicy": json.dumps(
                    {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(MAX_RECEIVE_COUNT)}
                ),
            },
        )
        queues = TargetQueues(queue_url, self._arn(queue_url), dlq_url, dlq_arn)
        self.grant(queues, principals, tenant_id=tenant_id)
        return queues

    def _create(self, tenant_id: str, target: str, role: str, attributes: dict[str, str]) -> str:
        """The queue, created tagged with its owner; one that exists already must carry this
        tenant's tag (looked at first: CreateQueue may not report or change an existing
        queue's tags)."""
        name = queue_name(self._prefix, tenant_id, target, dlq=role == "dlq")
        existing = self._url(name)
        if existing is not None:
            self._check_owner(existing, tenant_id)
            return existing
        try:
            url = str(
                self._sqs.create_queue(
                    QueueName=name,
                    Attributes=attributes,
                    tags={OWNER_TAG: tenant_id, TARGET_TAG: target, ROLE_TAG: role},
                )["QueueUrl"]
            )
        except ClientError as error:
            if _code(error) not in ("QueueAlreadyExists", "QueueNameExists"):
                raise
            raise Conflict(f"a queue named {name} exists with other settings") from None
        self._settled(lambda: self._check_owner(url, tenant_id))
        return url

    def _url(self, name: str) -> str | None:
        try:
            return str(self._sqs.get_queue_url(QueueName=name)["QueueUrl"])
        except ClientError as error:
            # SQS says QueueDoesNotExist; some engines the older code name.
            if _code(error) in _MISSING:
                return None
            raise

    def _check_owner(self, url: str, tenant_id: str) -> None:
        """A queue that exists already (CreateQueue returns it) must be this tenant's."""
        tags = self._sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
        if tags.get(OWNER_TAG) != tenant_id:
            raise Conflict(f"queue {url} is not tenant {tenant_id}'s; nothing was granted")

    def grant(self, queues: TargetQueues, principals: list[str], *, tenant_id: str) -> None:
        """Queue policies: the tenant's principals consume their queue and copy dead
        messages to its DLQ (the worker SDK); nobody else gets anything from a policy.
        Without principals there is no policy (same-account IAM policies still apply).
        Each principal is matched by ``aws:PrincipalArn`` with any path (its account root is
        the policy's Principal): a role session's ARN does not carry its role's path."""
        if not principals:
            return
        for url in (queues.queue_url, queues.dlq_url):
            self._settled(partial(self._check_owner, url, tenant_id))
        roots: set[str] = set()
        patterns: set[str] = set()
        for principal in principals:
            root, arns = principal_patterns(principal)
            roots.add(root)
            patterns.update(arns)
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
                        "Principal": {"AWS": sorted(roots)},
                        "Action": actions,
                        "Resource": arn,
                        "Condition": {"ArnLike": {"aws:PrincipalArn": sorted(patterns)}},
                    }
                ],
            }
            attributes = {"Policy": json.dumps(policy)}
            self._settled(
                partial(self._sqs.set_queue_attributes, QueueUrl=url, Attributes=attributes)
            )


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))
