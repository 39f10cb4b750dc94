"""SQS on a simulated clock: what the simulation's queues do, hours in seconds.

Standard queues as SQS documents them, for the calls Punctual makes: per-message
DelaySeconds (at most 900 s), visibility timeouts, receive counts and the redrive policy's
move to the dead-letter queue, receipt handles that change with every receive (a stale
handle cannot delete), SentTimestamp, ApproximateReceiveCount and
ApproximateFirstReceiveTimestamp (by the simulation's true clock: what a worker measures
its clock's offset against). Time is the injected clock's, so a DelaySeconds of 900 passes
as soon as the simulation moves its clock.
Unordered delivery and duplicate receipts, which SQS allows, are left to the faults layer.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from tests.faults import Clock

ACCOUNT = "000000000000"


def _error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, operation)


@dataclass
class _Message:
    message_id: str
    body: str
    attributes: dict[str, Any]
    sent_at: float
    visible_at: float
    receives: int = 0
    handle: str | None = None
    first_received: float | None = None  # ApproximateFirstReceiveTimestamp


@dataclass
class _Queue:
    name: str
    attributes: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)
    messages: dict[str, _Message] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://sqs.sim/{ACCOUNT}/{self.name}"

    @property
    def arn(self) -> str:
        return f"arn:aws:sqs:us-east-1:{ACCOUNT}:{self.name}"


class SimSQS:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._queues: dict[str, _Queue] = {}  # by URL
        self._ids = itertools.count(1)

    # --- queues ---------------------------------------------------------------------------

    def create_queue(
        self,
        QueueName: str,
        Attributes: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> Any:
        for queue in self._queues.values():
            if queue.name == QueueName:
                return {"QueueUrl": queue.url}  # as SQS: an existing queue's tags stay
        queue = _Queue(QueueName, dict(Attributes or {}), dict(tags or {}))
        self._queues[queue.url] = queue
        return {"QueueUrl": queue.url}

    def get_queue_url(self, QueueName: str, **_: Any) -> Any:
        for queue in self._queues.values():
            if queue.name == QueueName:
                return {"QueueUrl": queue.url}
        raise _error("AWS.SimpleQueueService.NonExistentQueue", "GetQueueUrl")

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> Any:
        queue = self._queue(QueueUrl)
        now = self._clock()
        every = {
            **queue.attributes,
            "QueueArn": queue.arn,
            "ApproximateNumberOfMessages": str(
                sum(1 for m in queue.messages.values() if m.visible_at <= now)
            ),
            "ApproximateNumberOfMessagesDelayed": str(
                sum(1 for m in queue.messages.values() if m.visible_at > now and not m.receives)
            ),
        }
        wanted = (
            every
            if "All" in AttributeNames
            else {k: every[k] for k in AttributeNames if k in every}
        )
        return {"Attributes": wanted}

    def list_queue_tags(self, QueueUrl: str) -> Any:
        return {"Tags": dict(self._queue(QueueUrl).tags)}

    def set_queue_attributes(self, QueueUrl: str, Attributes: dict[str, str]) -> Any:
        self._queue(QueueUrl).attributes.update(Attributes)
        return {}

    def queues(self) -> list[str]:
        return sorted(self._queues)

    def _queue(self, url: str) -> _Queue:
        if url not in self._queues:
            raise _error("AWS.SimpleQueueService.NonExistentQueue", "Queue")
        return self._queues[url]

    # --- messages -------------------------------------------------------------------------

    def send_message(
        self,
        QueueUrl: str,
        MessageBody: str,
        DelaySeconds: int = 0,
        MessageAttributes: dict[str, Any] | None = None,
    ) -> Any:
        if not 0 <= DelaySeconds <= 900:
            raise _error("InvalidParameterValue", "SendMessage")
        queue = self._queue(QueueUrl)
        now = self._clock()
        message = _Message(
            f"m{next(self._ids)}",
            MessageBody,
            dict(MessageAttributes or {}),
            now,
            now + DelaySeconds,
        )
        queue.messages[message.message_id] = message
        return {"MessageId": message.message_id}

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        if not 1 <= len(Entries) <= 10:
            raise _error("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "SendMessageBatch")
        successful = []
        for entry in Entries:
            sent = self.send_message(
                QueueUrl,
                entry["MessageBody"],
                entry.get("DelaySeconds", 0),
                entry.get("MessageAttributes"),
            )
            successful.append({"Id": entry["Id"], "MessageId": sent["MessageId"]})
        return {"Successful": successful, "Failed": []}

    def receive_message(
        self,
        QueueUrl: str,
        MaxNumberOfMessages: int = 1,
        VisibilityTimeout: int | None = None,
        WaitTimeSeconds: int = 0,
        MessageSystemAttributeNames: list[str] | None = None,
        **_: Any,
    ) -> Any:
        queue = self._queue(QueueUrl)
        now = self._clock()
        timeout = (
            VisibilityTimeout
            if VisibilityTimeout is not None
            else int(queue.attributes.get("VisibilityTimeout", 30))
        )
        redrive = json.loads(queue.attributes.get("RedrivePolicy", "null") or "null")
        got: list[dict[str, Any]] = []
        for message in sorted(queue.messages.values(), key=lambda m: m.visible_at):
            if len(got) == MaxNumberOfMessages or message.visible_at > now:
                break
            if redrive and message.receives >= int(redrive["maxReceiveCount"]):
                self._dead_letter(queue, message, redrive["deadLetterTargetArn"])
                continue
            message.receives += 1
            if message.first_received is None:
                message.first_received = now
            message.visible_at = now + timeout
            message.handle = f"{message.message_id}:{message.receives}"
            got.append(
                {
                    "MessageId": message.message_id,
                    "ReceiptHandle": message.handle,
                    "Body": message.body,
                    "MessageAttributes": message.attributes,
                    "Attributes": {
                        "SentTimestamp": str(int(message.sent_at * 1000)),
                        "ApproximateReceiveCount": str(message.receives),
                        "ApproximateFirstReceiveTimestamp": str(int(message.first_received * 1000)),
                    },
                }
            )
        return {"Messages": got} if got else {}

    def _dead_letter(self, queue: _Queue, message: _Message, dlq_arn: str) -> None:
        del queue.messages[message.message_id]
        dlq = next(q for q in self._queues.values() if q.arn == dlq_arn)
        message.receives, message.handle, message.visible_at = 0, None, self._clock()
        dlq.messages[message.message_id] = message

    def _by_handle(self, url: str, handle: str, operation: str) -> _Message:
        message_id = handle.split(":")[0]
        message = self._queue(url).messages.get(message_id)
        if message is None or message.handle != handle:
            raise _error("ReceiptHandleIsInvalid", operation)
        return message

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> Any:
        message_id = ReceiptHandle.split(":")[0]
        message = self._queue(QueueUrl).messages.get(message_id)
        # As SQS: a delete with the handle of an earlier receive succeeds but deletes nothing
        # (the message was received again since), and deleting twice is not an error.
        if message is not None and message.handle == ReceiptHandle:
            del self._queue(QueueUrl).messages[message_id]
        return {}

    def delete_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> Any:
        for entry in Entries:
            self.delete_message(QueueUrl, entry["ReceiptHandle"])
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}

    def change_message_visibility(
        self, QueueUrl: str, ReceiptHandle: str, VisibilityTimeout: int
    ) -> Any:
        message = self._by_handle(QueueUrl, ReceiptHandle, "ChangeMessageVisibility")
        message.visible_at = self._clock() + VisibilityTimeout
        return {}

    # --- for the simulation's checks --------------------------------------------------------

    def all_messages(self, url: str) -> list[_Message]:
        return list(self._queue(url).messages.values())

    def lose(self, url: str, message_id: str) -> None:
        """A message lost after it was accepted (a purge, a crashed local engine)."""
        self._queue(url).messages.pop(message_id, None)
