"""How CloudWatch evaluates an alarm, for synthetic datapoint series: enough of the model
to tell whether an alarm of the synthesized template can ever fire.

A series is one value per period, oldest first; ``None`` is a period without a datapoint
(a metric that publishes nothing while nothing happens, as Lambda's Errors, Step
Functions' ExecutionsFailed or DynamoDB's throttle events do).

Metric math (docs: "Using metric math"): FILL(m, c) gives ``m`` a value in every period.
For ``+`` the documentation says missing values count as 0, while a series without any
datapoint in the range is reported to leave the whole expression without data; this model
takes the stricter reading, a missing operand makes the point missing, so that an alarm it
passes fires under either.

Alarm evaluation (docs: "Evaluating an alarm", "How alarm state is evaluated when data is
missing"): CloudWatch retrieves more datapoints than Evaluation Periods (the evaluation
range; its example retrieves 5 for 3). With at least N real datapoints it evaluates the N
most recent; with fewer it fills the rest by the alarm's TreatMissingData. ALARM when at
least Datapoints to Alarm of the N are breaching.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Series = list[float | None]

# The periods CloudWatch retrieves beyond Evaluation Periods (the documented example).
EXTRA_PERIODS = 2

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanThreshold": operator.gt,
    "GreaterThanOrEqualToThreshold": operator.ge,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}


def evaluate(expression: str, series: Mapping[str, Series], periods: int) -> Series:
    """The series ``expression`` yields over ``periods`` periods."""

    def value(node: ast.expr) -> Series | float:
        if isinstance(node, ast.Name):
            known = series.get(node.id, [None] * periods)
            assert len(known) == periods, node.id
            return list(known)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return _add(value(node.left), value(node.right), periods)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "FILL"
            and len(node.args) == 2
        ):
            filled, filler = value(node.args[0]), value(node.args[1])
            assert isinstance(filled, list), "FILL fills a time series"
            assert isinstance(filler, float), "FILL with a constant only in this model"
            return [filler if point is None else point for point in filled]
        raise NotImplementedError(
            f"metric math not modelled: {ast.unparse(node)} (tests/infrastructure/cloudwatch.py)"
        )

    result = value(ast.parse(expression, mode="eval").body)
    return result if isinstance(result, list) else [result] * periods


def _add(left: Series | float, right: Series | float, periods: int) -> Series:
    a = left if isinstance(left, list) else [left] * periods
    b = right if isinstance(right, list) else [right] * periods
    return [None if x is None or y is None else x + y for x, y in zip(a, b, strict=True)]


def state(
    points: Sequence[float | None],
    *,
    threshold: float,
    comparison: str,
    evaluation_periods: int,
    datapoints_to_alarm: int,
    treat_missing: str,
) -> str:
    """ALARM or OK for the alarm's series (its last points are the evaluation range)."""
    breaches = _COMPARE[comparison]
    window = list(points)[-(evaluation_periods + EXTRA_PERIODS) :]
    real = [point for point in window if point is not None]
    if len(real) >= evaluation_periods:
        evaluated = [breaches(point, threshold) for point in real[-evaluation_periods:]]
    else:
        if treat_missing not in ("notBreaching", "breaching"):
            raise NotImplementedError(f"TreatMissingData {treat_missing} is not modelled")
        filled = [treat_missing == "breaching"] * (evaluation_periods - len(real))
        evaluated = [breaches(point, threshold) for point in real] + filled
    return "ALARM" if sum(evaluated) >= datapoints_to_alarm else "OK"


def inputs(alarm: Mapping[str, Any]) -> list[str]:
    """The ids of the metrics an alarm reads ("m" for a single-metric alarm)."""
    if "Metrics" not in alarm:
        return ["m"]
    return [query["Id"] for query in alarm["Metrics"] if "MetricStat" in query]


def alarm_state(alarm: Mapping[str, Any], series: Mapping[str, Series]) -> str:
    """The state of a synthesized AWS::CloudWatch::Alarm (its Properties) for ``series``,
    keyed by ``inputs(alarm)``."""
    periods = len(next(iter(series.values())))
    if "Metrics" in alarm:
        (returned,) = [query for query in alarm["Metrics"] if query.get("ReturnData", True)]
        points = (
            evaluate(returned["Expression"], series, periods)
            if "Expression" in returned
            else series[returned["Id"]]
        )
    else:
        points = series["m"]
    return state(
        points,
        threshold=alarm["Threshold"],
        comparison=alarm["ComparisonOperator"],
        evaluation_periods=alarm["EvaluationPeriods"],
        datapoints_to_alarm=alarm.get("DatapointsToAlarm", alarm["EvaluationPeriods"]),
        treat_missing=alarm.get("TreatMissingData", "missing"),
    )
