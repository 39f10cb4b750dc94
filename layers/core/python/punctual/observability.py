"""Logger, Tracer and Metrics: created once here, imported everywhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit

if TYPE_CHECKING:
    from punctual.skew import Offset

logger = Logger(service="punctual")
tracer = Tracer(service="punctual")
metrics = Metrics(namespace="Punctual", service="punctual")


def add_clock_skew(component: str, offset: Offset | None) -> bool:
    """``ClockSkew``: how far, for certain, this component's clock is from DynamoDB's (the
    bounds nearest zero, in seconds, either way; none before an answer bounded it), and a
    warning naming the component and the direction while it is off at all (docs/
    operations.md, *Clock skew*). False: nothing to add."""
    if offset is None:
        return False
    metrics.add_metric(name="ClockSkew", unit=MetricUnit.Seconds, value=abs(offset.least))
    if offset.least:
        logger.warning(
            "clock off DynamoDB's",
            extra={
                "component": component,
                "behind_by_at_least" if offset.least > 0 else "ahead_by_at_least": abs(
                    offset.least
                ),
                "offset_low": offset.low,
                "offset_high": offset.high,
                "samples": offset.samples,
            },
        )
    return True
