"""Relay Lambda: the occurrences stream (INSERTs of occurrence items) -> tenant SQS queues.

Two functions run this code, one per lane (infra/relay.py): each one's event source mapping
hands it its lane's records only."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from punctual.observability import add_clock_skew, logger, metrics
from punctual.pipeline.relay import Relay
from punctual.services import Wiring

processor = BatchProcessor(event_type=EventType.DynamoDBStreams)


wiring = Wiring()
configure = wiring.configure  # tests and the local stack hand their services in


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # The relay sends the whole batch grouped by queue (SendMessageBatch, queues in
    # parallel); Powertools then reports each record it could not deliver as a batch item
    # failure, so the event source mapping retries from there and nothing is dropped.
    # A new mapping's replay of the stream is not sent again (Settings.relay_started_at).
    started_at = wiring.services().settings.relay_started_at
    report = wiring.built(Relay).relay(event.get("Records", []), started_at=started_at)
    for strict, lag in report.lags:
        metrics.add_metric(
            name="EnqueueLagStrict" if strict else "EnqueueLagFlexible",
            unit=MetricUnit.Seconds,
            value=lag,
        )
    for lag in report.catchup_lags:
        metrics.add_metric(name="EnqueueLagCatchup", unit=MetricUnit.Seconds, value=lag)
    metrics.add_metric(name="Relayed", unit=MetricUnit.Count, value=report.sent)
    metrics.add_metric(name="RelaySendFailures", unit=MetricUnit.Count, value=len(report.failures))
    metrics.add_metric(name="DeadUnknownTarget", unit=MetricUnit.Count, value=report.dead)
    metrics.add_metric(name="StrictLate", unit=MetricUnit.Count, value=report.late_strict)
    metrics.add_metric(name="RelayRefused", unit=MetricUnit.Count, value=report.refused)
    metrics.add_metric(name="RelayUndeliverable", unit=MetricUnit.Count, value=report.undeliverable)
    metrics.add_metric(name="RelayTooEarly", unit=MetricUnit.Count, value=report.too_early)
    metrics.add_metric(name="MalformedItems", unit=MetricUnit.Count, value=report.malformed)
    metrics.add_metric(name="RelayReplaySkipped", unit=MetricUnit.Count, value=report.before_start)
    add_clock_skew("relay", wiring.services().clock_offset())
    if report.late_strict:
        logger.warning(
            "strict occurrences receivable past the SLO", extra={"late": report.late_strict}
        )

    def record_handler(record: DynamoDBRecord) -> None:
        failure = report.failures.get(
            str(record.dynamodb.sequence_number if record.dynamodb else "")
        )
        if failure is not None:
            logger.warning("not delivered; will be retried", extra={"error": str(failure)})
            raise failure

    return dict(
        process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
    )
