"""Re-drive Lambda: the relay's on-failure queue (stream batches the mapping discarded) ->
the records read back from the stream -> the relay again (punctual.pipeline.redrive)."""

from __future__ import annotations

import json
from typing import Any

import boto3
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from punctual.observability import add_clock_skew, logger, metrics
from punctual.pipeline.redrive import StreamRedrive, Trimmed
from punctual.pipeline.relay import Relay
from punctual.services import Services, Wiring

processor = BatchProcessor(event_type=EventType.SQS)


wiring = Wiring()
configure = wiring.configure  # tests and the local stack hand their services in


# The stream's shards have two readers already (the two lanes' mappings): AWS throttles a
# third with LimitExceededException, which botocore's legacy retry mode retries only for
# Kinesis. The standard mode retries it, with exponential back-off and jitter.
STREAMS_CONFIG = Config(retries={"mode": "standard", "total_max_attempts": 6})


def _redrive(services: Services) -> StreamRedrive:
    return StreamRedrive(
        boto3.client("dynamodbstreams", config=STREAMS_CONFIG),
        Relay(services),
        services.settings.relay_function,
        services.settings.catchup_relay_function,
    )


def record_handler(record: SQSRecord) -> None:
    failure = json.loads(record.body)
    try:
        report = wiring.built(_redrive).redrive(failure)
    except Trimmed:
        # Past the stream's 24 hours: the reconciler re-sends what no worker took, once it
        # checks that hour. Counted (alarmed), and the message is done.
        logger.error("discarded stream batch expired before its re-drive", extra=failure)
        metrics.add_metric(name="RedriveExpired", unit=MetricUnit.Count, value=1)
        return
    except Exception:
        # Counted (alarmed: RedriveFailures); the message comes back, and after
        # REDRIVE_RECEIVES tries waits in the dead-letter queue (RelayUndelivered).
        metrics.add_metric(name="RedriveFailures", unit=MetricUnit.Count, value=1)
        raise
    # Anything not sent raises SendFailed: the message comes back and is tried again.
    metrics.add_metric(name="Redriven", unit=MetricUnit.Count, value=report.sent)
    metrics.add_metric(name="MalformedItems", unit=MetricUnit.Count, value=report.malformed)


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    answer = dict(
        process_partial_response(
            event=event, record_handler=record_handler, processor=processor, context=context
        )
    )
    add_clock_skew("redrive", wiring.services().clock_offset())
    return answer
