"""Every alarm of the synthesized template can fire: evaluated as CloudWatch evaluates it
(tests/infrastructure/cloudwatch.py) on synthetic series where one of its inputs fails and
the others publish nothing, as they do while nothing is wrong."""

from __future__ import annotations

import json
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


def _heartbeat(alarm: dict[str, Any]) -> bool:
    """An alarm on what must happen (below its threshold, or absent, is the failure)."""
    return bool(alarm["ComparisonOperator"].startswith("LessThan"))


def test_alarms_each_fires_when_any_one_of_its_inputs_fails(service: Template):
    # GIVEN every alarm of the stack (the failure alarms sum several metrics; heartbeats
    # below)
    alarms = {name: a for name, a in _alarms(service).items() if not _heartbeat(a)}
    assert len(alarms) >= 15
    for name, alarm in alarms.items():
        for failing in inputs(alarm):
            # WHEN only that input reports a failure and the others publish nothing
            # THEN the alarm goes to ALARM
            assert alarm_state(alarm, _failure(alarm, failing)) == "ALARM", (name, failing)


def test_alarms_stay_ok_while_nothing_is_published_or_all_is_zero(service: Template):
    for name, alarm in _alarms(service).items():
        if _heartbeat(alarm):
            continue  # (silence is what it exists for: below)
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
    assert sorted(metrics.values()) == [
        "Errors",
        "ExecutionsFailed",
        "ExecutionsTimedOut",
        "Throttles",
    ]
    (expression,) = [q["Expression"] for q in alarm["Metrics"] if "Expression" in q]
    for metric_id in metrics:
        assert f"FILL({metric_id}, 0)" in expression


def test_alarms_materializer_stopped_fires_when_ticks_stop_not_on_one_missed_minute(
    service: Template,
):
    # GIVEN the materializer's heartbeat: successful ticks of the ticker per minute
    [alarm] = [a for name, a in _alarms(service).items() if "MaterializerStopped" in name]
    assert _heartbeat(alarm)
    assert alarm["MetricName"] == "ExecutionsSucceeded"
    [ticks] = inputs(alarm)
    periods = alarm["EvaluationPeriods"] + 2

    def after(*latest: float | None) -> str:
        series: Series = [1.0] * (periods - len(latest))
        return alarm_state(alarm, {ticks: [*series, *latest]})

    # THEN a ticker whose ticks all fail (0 succeeded) fires it in 3 minutes; one that
    # stopped (nothing published: the rule disabled, the machine gone) once its last
    # success leaves the 5 minutes CloudWatch reads back (cloudwatch.py), not before
    assert after(0.0, 0.0, 0.0) == "ALARM"
    assert after(None, None, None, None, None) == "ALARM"
    assert after(None, None, None, None) == "OK"
    # AND one tick a minute is healthy; so is one minute without a success (a tick late)
    assert after(1.0, 1.0, 1.0) == "OK"
    assert after(1.0, None, 1.0) == "OK"
    assert after(None, None, 1.0) == "OK"


def test_alarms_reconciler_stopped_fires_after_two_hours_without_a_run(service: Template):
    # GIVEN the reconciler's heartbeat: its state machine's successful runs per hour
    [alarm] = [a for name, a in _alarms(service).items() if "ReconcilerStopped" in name]
    assert _heartbeat(alarm)
    [metric] = [q["MetricStat"] for q in alarm["Metrics"] if "MetricStat" in q]
    assert (metric["Metric"]["MetricName"], metric["Period"]) == ("ExecutionsSucceeded", 3600)
    [runs] = inputs(alarm)

    def after(*latest: float | None) -> str:
        series: Series = [1.0] * (alarm["EvaluationPeriods"] + 2 - len(latest))
        return alarm_state(alarm, {runs: [*series, *latest]})

    # THEN runs that all fail, or no run at all (the rule disabled: nothing published),
    # fire it after two hours
    assert after(0.0, 0.0) == "ALARM"
    assert after(None, None) == "ALARM"
    # AND one run an hour is healthy; so is an hour whose run ended in the next one
    assert after(1.0, 1.0) == "OK"
    assert after(None, 2.0) == "OK"
    assert after(1.0, None) == "OK"


def test_alarms_a_rule_that_cannot_start_its_state_machine_fires(service: Template):
    # GIVEN the alarm on the schedule rules' failed invocations
    [alarm] = [a for name, a in _alarms(service).items() if "ScheduleRuleFailures" in name]
    metrics = [q["MetricStat"]["Metric"] for q in alarm["Metrics"] if "MetricStat" in q]
    # THEN it reads both rules' FailedInvocations (each fires it alone: the test above)
    assert [m["MetricName"] for m in metrics] == ["FailedInvocations"] * 2
    rules = {json.dumps(m["Dimensions"][0]["Value"]) for m in metrics}
    assert rules == {json.dumps({"Ref": r}) for r in service.find_resources("AWS::Events::Rule")}


def test_alarms_planning_behind_fires_when_backlog_persists_not_at_a_peaks_minute(
    service: Template,
):
    # GIVEN the alarm on the due buckets the materializer leaves for the next tick
    [alarm] = [a for name, a in _alarms(service).items() if "PlanningBehind" in name]
    assert (alarm["MetricName"], alarm["Statistic"]) == ("DueBacklog", "Maximum")
    [backlog] = inputs(alarm)

    def after(*latest: float | None) -> str:
        return alarm_state(alarm, {backlog: [0.0, 0.0, *latest]})

    # THEN buckets left tick after tick for 5 minutes fire it
    assert after(1.0, 2.0, 3.0, 5.0, 8.0) == "ALARM"
    # AND a top of the hour's minutes of backlog, caught up after, do not
    assert after(0.0, 3.0, 2.0, 0.0, 0.0) == "OK"
    assert after(2.0, 1.0, 1.0, 1.0, 0.0) == "OK"
