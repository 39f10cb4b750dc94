"""Every alarm of the synthesized template can fire: evaluated as CloudWatch evaluates it
(tests/infrastructure/cloudwatch.py) on synthetic series where one of its inputs fails and
the others publish nothing, as they do while nothing is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from aws_cdk.assertions import Template

from .cloudwatch import Series, alarm_state, evaluate, inputs, state

X, K = 10.0, 0.0  # breaching and not breaching (OK), for a threshold of 3


@pytest.mark.parametrize(
    ("points", "m", "not_breaching", "breaching"),
    [
        # The documentation's tables ("How alarm state is evaluated when data is missing"):
        # 3 of 3, then 2 of 3, each retrieving 5 datapoints.
        ([K, None, X, None, X], 3, "OK", "OK"),
        ([K, None, None, None, None], 3, "OK", "OK"),
        ([None] * 5, 3, "OK", "ALARM"),
        ([K, X, X, None, X], 3, "ALARM", "ALARM"),
        ([None, None, None, None, X], 3, "OK", "ALARM"),
        ([X, None, None, None, None], 3, "OK", "ALARM"),
        ([K, None, X, None, X], 2, "ALARM", "ALARM"),
        ([K, K, X, K, X], 2, "ALARM", "ALARM"),
        ([K, None, X, None, None], 2, "OK", "ALARM"),
        ([None, None, None, None, K], 2, "OK", "ALARM"),
        ([None, None, None, None, X], 2, "OK", "ALARM"),
    ],
)
def test_cloudwatch_model_matches_the_documented_evaluation(
    points: Series, m: int, not_breaching: str, breaching: str
):
    # GIVEN an alarm over 3 periods with threshold 3, needing m breaching datapoints
    def evaluated(treat: str) -> str:
        return state(
            points,
            threshold=3,
            comparison="GreaterThanThreshold",
            evaluation_periods=3,
            datapoints_to_alarm=m,
            treat_missing=treat,
        )

    # THEN the model reaches the state the documentation gives for each treatment
    assert (evaluated("notBreaching"), evaluated("breaching")) == (not_breaching, breaching)


def test_cloudwatch_model_a_sum_with_a_silent_term_has_no_datapoint_unless_filled():
    # GIVEN errors in the latest period while the other two metrics published nothing
    series: dict[str, Series] = {"errors": [None, 1.0], "failed": [None, None]}
    # THEN the plain sum has no datapoint there (the stricter reading), the filled one has
    assert evaluate("failed + errors", series, 2) == [None, None]
    assert evaluate("FILL(failed, 0) + FILL(errors, 0)", series, 2) == [0.0, 1.0]


def _alarms(service: Template) -> dict[str, dict[str, Any]]:
    """Each alarm's properties by its logical id ("ObservabilityMaterializerFailures...")."""
    return {
        logical_id: alarm["Properties"]
        for logical_id, alarm in service.find_resources("AWS::CloudWatch::Alarm").items()
    }


def _failure(alarm: dict[str, Any], failing: str) -> dict[str, Series]:
    """``failing`` above the threshold in as many of the latest periods as the alarm needs,
    silent before; every other input silent throughout."""
    periods = alarm["EvaluationPeriods"] + 2
    needed = alarm.get("DatapointsToAlarm", alarm["EvaluationPeriods"])
    breach = float(alarm["Threshold"]) + 1
    silent: Series = [None] * periods
    return {
        name: ([None] * (periods - needed) + [breach] * needed if name == failing else silent)
        for name in inputs(alarm)
    }


def test_alarms_each_fires_when_any_one_of_its_inputs_fails(service: Template):
    # GIVEN every alarm of the stack (the failure alarms sum several metrics)
    alarms = _alarms(service)
    assert len(alarms) >= 15
    for name, alarm in alarms.items():
        for failing in inputs(alarm):
            # WHEN only that input reports a failure and the others publish nothing
            # THEN the alarm goes to ALARM
            assert alarm_state(alarm, _failure(alarm, failing)) == "ALARM", (name, failing)


def test_alarms_stay_ok_while_nothing_is_published_or_all_is_zero(service: Template):
    for name, alarm in _alarms(service).items():
        periods = alarm["EvaluationPeriods"] + 2
        for value in (None, 0.0):
            # WHEN no input publishes anything, or every one reports 0
            series: dict[str, Series] = {i: [value] * periods for i in inputs(alarm)}
            # THEN the alarm is OK: silence is health for these measures
            assert alarm_state(alarm, series) == "OK", (name, value)


def test_alarms_materializer_failures_counts_each_kind_of_failure(service: Template):
    # GIVEN the materializer's failure alarm
    (alarm,) = [a for name, a in _alarms(service).items() if "MaterializerFailures" in name]
    # THEN it reads failed and timed-out ticks and the function's errors, each filled
    metrics = {
        q["Id"]: q["MetricStat"]["Metric"]["MetricName"]
        for q in alarm["Metrics"]
        if "MetricStat" in q
    }
    assert sorted(metrics.values()) == ["Errors", "ExecutionsFailed", "ExecutionsTimedOut"]
    (expression,) = [q["Expression"] for q in alarm["Metrics"] if "Expression" in q]
    for metric_id in metrics:
        assert f"FILL({metric_id}, 0)" in expression
