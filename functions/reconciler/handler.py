"""Reconciler Lambda: one Step Functions Map iteration of the hourly run,
{"time": ISO, "shards": [ints]}, optionally {"window_start": ISO, "window_end": ISO}."""

from __future__ import annotations

from typing import Any, Self

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from punctual.domain.errors import InvalidInput
from punctual.domain.validation import field_errors
from punctual.observability import add_clock_skew, logger, metrics
from punctual.pipeline.reconciler import Reconciler, metric_values
from punctual.services import Wiring
from punctual.timing import to_epoch

# Stop examining schedules with this much time left, so the shard's report is still saved.
SAFETY_MILLIS = 60_000

wiring = Wiring()
configure = wiring.configure  # tests and the local stack hand their services in


class ReconcileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    time: AwareDatetime = Field(description="When the run was scheduled (the EventBridge time).")
    shards: list[int] = Field(min_length=1, max_length=4096)
    window_start: AwareDatetime | None = None
    window_end: AwareDatetime | None = None

    @model_validator(mode="after")
    def _whole_window(self) -> Self:
        if (self.window_start is None) != (self.window_end is None):
            raise ValueError("give both window_start and window_end, or neither")
        return self

    def window(self) -> tuple[int, int] | None:
        """The window asked for (an operator's re-run), or None: the scheduled run."""
        if self.window_start is not None and self.window_end is not None:
            return to_epoch(self.window_start), to_epoch(self.window_end)
        return None


def parse(event: dict[str, Any]) -> ReconcileRequest:
    try:
        return ReconcileRequest.model_validate(event)
    except ValidationError as error:
        fields = field_errors(error)
        reasons = "; ".join(f"{f['field']}: {f['reason']}" for f in fields)
        raise InvalidInput(f"the reconciler event is not valid: {reasons}", fields) from None


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = parse(event)
    window = request.window()
    reconciler = Reconciler(
        wiring.services(),
        out_of_time=lambda: context.get_remaining_time_in_millis() < SAFETY_MILLIS,
    )
    if window is None:
        # The hourly run: the hour that ended an hour ago, and any earlier one left unchecked.
        results = reconciler.catch_up(request.shards, to_epoch(request.time))
    else:
        results = reconciler.run(request.shards, *window)
    for name, value in metric_values(results, len(reconciler.given_up)).items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    add_clock_skew("reconciler", wiring.services().clock_offset())
    for result in results:
        if result.report.missing or result.report.unexpected:
            logger.warning(
                "reconcile found gaps",
                extra={
                    "shard": result.report.shard,
                    "missing": result.missing[:20],
                    "unexpected": result.unexpected[:20],
                },
            )
    return {"shards": [r.report.model_dump(mode="json", exclude={"examples"}) for r in results]}
