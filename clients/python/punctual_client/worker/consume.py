"""Two ways to feed a Worker, with the same semantics: a long-polling loop, or an
SQS-triggered Lambda (Powertools batch processing with partial batch failures)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from botocore.exceptions import ClientError

from punctual.backoff import Backoff
from punctual.observability import logger, metrics
from punctual_client.worker.core import (
    METRICS,
    Delivery,
    Outcome,
    Result,
    Worker,
    queue_url_of,
)

# The pause after a failed poll (SQS unreachable, credentials expired): 1 s, doubling up to
# 30 s while polls keep failing (``tries`` is not used: a consumer polls until stopped).
POLL_BACKOFF = Backoff(tries=1, base=1.0, cap=30.0)
# The host clock's offset from SQS's is logged when it moves by more than this.
SKEW_LOG_SECONDS = 0.1


def _failure_kind(error: Exception) -> str:
    """What a failed poll is, without what changes from one to the next (request ids)."""
    if isinstance(error, ClientError):
        return f"{type(error).__name__} {error.response.get('Error', {}).get('Code', '')}".strip()
    return type(error).__name__


class QueueConsumer:
    """Long polling: receive up to 10, process them on ``threads``, delete what is done."""

    def __init__(
        self,
        worker: Worker,
        queue_url: str,
        *,
        wait_seconds: int = 20,
        threads: int = 4,
        on_result: Callable[[Delivery, Result], None] | None = None,
        poll_backoff: Backoff = POLL_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        self.worker = worker
        self.queue_url = queue_url
        self.wait_seconds = wait_seconds
        self.threads = threads
        self.on_result = on_result or (lambda delivery, result: None)
        self.poll_backoff = poll_backoff
        self.rng = rng or random.Random()
        self._logged_offset = 0.0  # the offset last logged (0: none logged, none to say)

    def poll_once(self) -> list[Result]:
        sqs = self.worker.services.sqs
        called = self.worker.services.now()
        received = sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=self.wait_seconds,
            MessageSystemAttributeNames=[
                "ApproximateReceiveCount",
                "SentTimestamp",
                "ApproximateFirstReceiveTimestamp",
            ],
        ).get("Messages", [])
        self._measure_skew(received, called, self.worker.services.now())
        deliveries = [
            Delivery(
                body=m["Body"],
                receipt_handle=m["ReceiptHandle"],
                queue_url=self.queue_url,
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
                sent_at=_seconds(m.get("Attributes", {}).get("SentTimestamp")),
            )
            for m in received
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(self.threads, len(deliveries)))) as pool:
            results = list(pool.map(self._process, deliveries))
        done = [d for d, r in zip(deliveries, results, strict=True) if r.delete]
        if done:
            answer = sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": d.receipt_handle} for i, d in enumerate(done)
                ],
            )
            for failed in answer.get("Failed", []):
                # A lost ack: the message comes back and the claim sees it finished.
                logger.warning("delete failed; the re-delivery will be recognized", extra=failed)
        for delivery, result in zip(deliveries, results, strict=True):
            self.on_result(delivery, result)
        return results

    def _measure_skew(self, received: list[dict[str, Any]], called: float, answered: float) -> None:
        """Each first receive's stamp bounds the host clock's offset from SQS's (within
        this call: punctual.skew); the estimate is logged when it moves."""
        for m in received:
            attributes = m.get("Attributes", {})
            stamp = attributes.get("ApproximateFirstReceiveTimestamp")
            if stamp and attributes.get("ApproximateReceiveCount") == "1":
                self.worker.skew.observe(int(stamp) / 1000, called, answered)
        found = self.worker.skew.offset(answered)
        if found is not None and abs(found.low - self._logged_offset) > SKEW_LOG_SECONDS:
            self._logged_offset = found.low
            logger.info(
                "clock offset from SQS measured",
                extra={
                    "offset_low_ms": round(found.low * 1000, 1),
                    "offset_high_ms": round(found.high * 1000, 1),
                    "samples": found.samples,
                },
            )

    def _process(self, delivery: Delivery) -> Result:
        """One delivery; a failure of its own (DynamoDB or SQS unreachable past their
        retries) keeps its message (it comes back) without costing the rest of the received
        batch their deletes."""
        try:
            return self.worker.process(delivery)
        except Exception as error:
            logger.exception("processing failed; the message comes back")
            return Result(Outcome.FAILED, f"{type(error).__name__}: {error}")

    def run(self, stop: threading.Event) -> None:
        """Poll until ``stop``. While polls fail, each pause is longer (POLL_BACKOFF, with
        equal jitter: at least half the ceiling, so the pauses grow, and workers that lost
        SQS together do not come back in step); the log says when polls start failing (or
        fail another way) and when they work again, not once a poll."""
        failures = 0
        failing: str | None = None
        since = 0.0
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception as error:
                kind = _failure_kind(error)
                if failures == 0:
                    since = time.monotonic()
                if kind != failing:
                    logger.exception(
                        f"polling {self.queue_url} failed; polling again after growing pauses "
                        f"(at most {self.poll_backoff.cap:.0f} s), logged again once it works "
                        "or fails another way"
                    )
                    failing = kind
                ceiling = self.poll_backoff.ceiling(failures)
                failures += 1
                stop.wait(self.rng.uniform(ceiling / 2, ceiling))
                continue
            if failing is not None:
                logger.warning(
                    f"polling {self.queue_url} works again, after {failures} failed polls "
                    f"over {time.monotonic() - since:.0f} s"
                )
            failures, failing = 0, None


class KeepMessage(Exception):
    """Reported as a batch item failure, so Lambda leaves the message in the queue."""


def sqs_lambda_handler(worker: Worker) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """An SQS-triggered Lambda handler for ``worker``; enable ReportBatchItemFailures on the
    event source mapping. Done messages are deleted by Lambda, kept ones are reported."""
    # Every record kept is a normal answer (batchItemFailures), not an error of the batch.
    processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    urls: dict[str, str] = {}

    def record_handler(record: SQSRecord) -> None:
        arn = record.event_source_arn
        if arn not in urls:
            urls[arn] = queue_url_of(worker.services.sqs, arn)
        result = worker.process(
            Delivery(
                body=record.body,
                receipt_handle=record.receipt_handle,
                queue_url=urls[arn],
                receive_count=int(record.attributes.approximate_receive_count),
                sent_at=_seconds(record.attributes.sent_timestamp),
            )
        )
        metrics.add_metric(name=METRICS[result.outcome], unit=MetricUnit.Count, value=1)
        if not result.delete:
            raise KeepMessage(result.outcome.value)

    @metrics.log_metrics
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return dict(
            process_partial_response(
                event=event, record_handler=record_handler, processor=processor, context=context
            )
        )

    return handler


def _seconds(sent_timestamp: str | None) -> int | None:
    """SQS's SentTimestamp (epoch milliseconds) in whole seconds."""
    return int(sent_timestamp) // 1000 if sent_timestamp else None
