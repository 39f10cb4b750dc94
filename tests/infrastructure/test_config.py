"""Deployment knobs: cdk.json's context is valid; a bad one fails synthesis with its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from infra.config import (
    EVENTBRIDGE_INPUT_LIMIT,
    AlarmThresholds,
    DeployConfig,
    committed_context,
    rule_input_text,
)
from infra.offline import cdk_json_context, synthesize

from .conftest import Synthesized


def test_config_committed_cdk_json_is_valid():
    # GIVEN the "punctual" context committed in cdk.json
    # WHEN it is validated
    config = DeployConfig.from_context(cdk_json_context()["punctual"])
    # THEN it is the documented default deployment: the shard count and lookahead the
    # capacity model chose for the 500k top-of-hour peak (docs/capacity.md)
    assert (config.shard_count, config.lookahead_seconds) == (128, 420)
    # AND an operator role, and an hourly run that fits its hour (64 pairs, 32 at a time)
    assert config.operator_role
    assert (config.reconcile_group_size, config.reconcile_concurrency) == (2, 32)
    assert config.retain_data
    assert config.deletion_protection
    assert config.alarms == AlarmThresholds()


@pytest.mark.parametrize(
    ("context", "field"),
    [
        ({"shard_count": 0}, r"punctual\.shard_count"),
        ({"map_concurrency": 41}, r"punctual\.map_concurrency"),
        ({"lookahead_seconds": 900}, r"punctual\.lookahead_seconds"),
        ({"relay_batching_window_seconds": 61}, r"punctual\.relay_batching_window_seconds"),
        ({"reconcile_minute": 60}, r"punctual\.reconcile_minute"),
        ({"operator_principals": ["alice"]}, r"punctual\.operator_principals\.0"),
        ({"alarm_emails": ["not-an-address"]}, r"punctual\.alarm_emails\.0"),
        ({"alarms": {"strict_lag_p99_seconds": 0}}, r"punctual\.alarms\.strict_lag_p99_seconds"),
        ({"alarms": {"api_5xx": -1}}, r"punctual\.alarms\.api_5xx"),
        ({"alarms": {"lag": 5}}, r"punctual\.alarms\.lag"),
        ({"shards": 64}, r"punctual\.shards"),
        ({"warm_write_units": 3999}, r"punctual\.warm_write_units: 3999 is below the 4,000"),
    ],
)
def test_config_rejects_bad_context_naming_the_field(context: dict[str, Any], field: str):
    # GIVEN a context with one bad or unknown knob
    # WHEN it is validated
    # THEN the error names that knob, as the user wrote it under "punctual"
    with pytest.raises(ValueError, match=field):
        DeployConfig.from_context(context)


def test_config_environment_carries_the_knobs_the_functions_read():
    # GIVEN operators and a shard count
    config = DeployConfig(
        shard_count=32,
        reconcile_repair=False,
        operator_principals=[
            "arn:aws:iam::123456789012:role/b",
            "arn:aws:iam::123456789012:role/a",
        ],
    )
    # WHEN the functions' environment is built
    environment = config.environment()
    # THEN the PUNCTUAL_* settings parse back to the same values
    assert environment["PUNCTUAL_SHARD_COUNT"] == "32"
    assert environment["PUNCTUAL_RECONCILE_REPAIR"] == "false"
    assert environment["PUNCTUAL_OPERATOR_PRINCIPALS"] == (
        "arn:aws:iam::123456789012:role/a,arn:aws:iam::123456789012:role/b"
    )
    assert environment["PUNCTUAL_QUEUE_PREFIX"] == "punctual"
    # ... and the API knows the relay's batching window (what it sends at once)
    assert environment["PUNCTUAL_RELAY_WINDOW_SECONDS"] == "2"


def test_config_accepts_the_context_as_json_text_from_the_command_line():
    # GIVEN `cdk deploy -c punctual='{"shard_count": 128, "alarms": {"api_5xx": 1}}'`
    text = '{"shard_count": 128, "alarms": {"api_5xx": 1}}'
    # WHEN it is validated
    config = DeployConfig.from_context(text)
    # THEN it is read like the same object in cdk.json, and checked the same way
    assert config.shard_count == 128
    assert config.alarms.api_5xx == 1
    with pytest.raises(ValueError, match=r"punctual\.shard_count"):
        DeployConfig.from_context('{"shard_count": "many"}')


def test_config_from_the_command_line_is_laid_over_cdk_json_knob_by_knob():
    # GIVEN `cdk deploy -c punctual='{"alarm_emails": [...], "alarms": {"api_5xx": 1}}'`
    # (as docs/deploy.md shows), which the CDK hands over instead of cdk.json's object
    text = '{"alarm_emails": ["oncall@example.com"], "alarms": {"api_5xx": 1}}'
    # WHEN it is validated over cdk.json's object
    config = DeployConfig.from_context(text, base=committed_context())
    # THEN every knob it does not name is cdk.json's (128 shards, not the code's 64: the
    # schedules homed in shards 64-127 would never be materialized), alarm by alarm too
    committed = DeployConfig.from_context(committed_context())
    assert config.model_dump(exclude={"alarm_emails", "alarms"}) == committed.model_dump(
        exclude={"alarm_emails", "alarms"}
    )
    assert (config.shard_count, config.lookahead_seconds) == (128, 420)
    assert config.alarm_emails == ["oncall@example.com"]
    assert config.alarms == committed.alarms.model_copy(update={"api_5xx": 1})
    # AND text that is not a JSON object is refused in one line
    for bad in ("{shard_count: 1}", "[1]"):
        with pytest.raises(ValueError, match="invalid CDK context: punctual is not"):
            DeployConfig.from_context(bad, base=committed_context())


def test_config_override_reaches_the_synthesized_functions(tmp_path: Path):
    # GIVEN a synthesis with only the alarm address given on the command line
    assembly = synthesize(
        str(tmp_path),
        {**cdk_json_context(), "punctual": '{"alarm_emails": ["oncall@example.com"]}'},
    )
    service = Template.from_json(assembly.get_stack_by_name("Punctual").template)
    # WHEN its functions' environments are read
    shard_counts = {
        resource["Properties"]["Environment"]["Variables"].get("PUNCTUAL_SHARD_COUNT")
        for resource in service.find_resources("AWS::Lambda::Function").values()
        if "Environment" in resource["Properties"]
    }
    # THEN each has cdk.json's 128 shards
    assert shard_counts - {None} == {"128"}


@pytest.mark.parametrize(
    ("context", "arithmetic"),
    [
        # cdk.json's 128 shards in pairs, 8 at a time: the hourly run cannot end in its hour
        (
            {"shard_count": 128, "reconcile_group_size": 2, "reconcile_concurrency": 8},
            r"punctual\.reconcile_concurrency: the hourly run has 64 shard groups .* 8 waves x "
            r"900 s \+ 930 s for one retried group = 8130 s, past the run's 3300 s timeout; at "
            r"most 2 waves fit: reconcile_concurrency >= 32",
        ),
        # 1,900 shards: the rules' inputs list more shard groups than EventBridge takes
        (
            {"shard_count": 1900, "shard_group_size": 48, "reconcile_group_size": 64},
            r"punctual\.shard_count: the rule starting the ticker lists every shard group in its"
            r" input: 8,496 characters for 1900 shards in groups of 48 \(shard_group_size\), "
            r"over EventBridge's 8,192; at most 1839 shards fit in groups of 48",
        ),
        # 50 groups a tick, 40 at once: the last ten would start after the tick
        (
            {"shard_count": 400},
            r"punctual\.map_concurrency: a tick has 50 shard groups \(400 shards / "
            r"shard_group_size 8\) but runs 40 at once.*shard_group_size >= 10",
        ),
        # the materializer's fires reach the relay as little as 2 s before their time (a
        # tick plans lookahead ahead, the next a minute later and commits up to its groups'
        # 55 s into it): a 5 s window holds them late
        (
            {"lookahead_seconds": 117, "relay_batching_window_seconds": 5},
            r"punctual\.relay_batching_window_seconds: the materializer's fires reach the "
            r"relay as little as lookahead_seconds 117 - 60 - 55 \(a tick's groups\) = 2 s "
            r"before their time, less than the window 5 s \+ 3 s margin; lookahead_seconds "
            r">= 123 or relay_batching_window_seconds <= 0",
        ),
        # nobody could onboard a tenant after the deploy
        ({"operator_role": False}, r"punctual\.operator_principals: empty while operator_role"),
        # a new account's quota: the reservations leave less than Lambda's minimum
        (
            {"shard_count": 128, "account_concurrency": 600},
            r"punctual\.account_concurrency: the reservations \(64 materializer \+ 100 api \+ "
            r"400 relay \+ 50 catch-up relay\) leave 600 - 614 = -14 unreserved, fewer than "
            r"Lambda's minimum of 100 .*account_concurrency >= 714",
        ),
    ],
)
def test_config_rejects_what_cannot_work_with_the_arithmetic(
    context: dict[str, Any], arithmetic: str
):
    # GIVEN knobs each valid alone
    # WHEN they are validated together
    # THEN the error names the knob and shows the arithmetic that fails
    with pytest.raises(ValueError, match=arithmetic):
        DeployConfig.from_context(context)


def test_config_accepts_the_limits_themselves():
    # GIVEN the largest settings the checks allow: two reconcile waves, every tick's groups
    # at once, and an operator named instead of the role
    config = DeployConfig(
        shard_count=1280,
        shard_group_size=32,
        reconcile_group_size=16,
        reconcile_concurrency=40,
        operator_role=False,
        operator_principals=["arn:aws:iam::123456789012:role/ops"],
        # the materializer's fires come 5 s ahead: just the 2 s window and its 3 s margin
        lookahead_seconds=120,
    )
    # THEN it validates, and its rules' inputs fit EventBridge's limit
    assert len(rule_input_text("time", config.shard_count, 16)) <= EVENTBRIDGE_INPUT_LIMIT
    # ... and without a window no lookahead is too short for the relay
    DeployConfig(lookahead_seconds=0, relay_batching_window_seconds=0)


def test_config_checks_the_input_text_the_rules_really_carry(synthesized: Synthesized):
    # GIVEN the two scheduled rules of the synthesized test stack
    config = synthesized.config
    texts = {
        rule["Properties"]["ScheduleExpression"]: rule["Properties"]["Targets"][0][
            "InputTransformer"
        ]["InputTemplate"]
        for rule in synthesized.service.find_resources("AWS::Events::Rule").values()
    }
    # THEN the text whose length the config checks is exactly each rule's input
    assert texts["rate(1 minute)"] == rule_input_text(
        "tick", config.shard_count, config.shard_group_size
    )
    assert texts["cron(25 * * * ? *)"] == rule_input_text(
        "time", config.shard_count, config.reconcile_group_size
    )


def test_config_reserves_concurrency_for_planning_and_requests_and_caps_the_relay(
    synthesized: Synthesized,
):
    # GIVEN the synthesized stack and its config
    config = synthesized.config
    reserved = {
        f["Properties"]["Handler"]: f["Properties"].get("ReservedConcurrentExecutions")
        for f in synthesized.service.find_resources("AWS::Lambda::Function").values()
        if f["Properties"]["Handler"].endswith(".lambda_handler")
    }
    # THEN the materializer has every group of the ticks that may overlap (a tick retried
    # up to its timeout runs into the next ones), the API its share, and each relay lane a
    # cap below what its mapping could run (stream shards x parallelization factor)
    groups = -(-config.shard_count // config.shard_group_size)
    assert config.materializer_concurrency == 4 * min(groups, config.map_concurrency)
    assert reserved == {
        "materializer.handler.lambda_handler": config.materializer_concurrency,
        "api.handler.lambda_handler": config.api_concurrency,
        "relay.handler.lambda_handler": config.relay_concurrency,
        "relay.catchup.lambda_handler": config.catchup_concurrency,
        # the unreserved pool: the reconciler's groups, the re-drive, the dashboard's widget
        "reconciler.handler.lambda_handler": None,
        "relay.redrive.lambda_handler": None,
        "dashboard.drain.lambda_handler": None,
    }
    # AND the re-drive takes at most two of the unreserved slots
    [redrive] = [
        m["Properties"]
        for m in synthesized.service.find_resources("AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" not in m["Properties"]
    ]
    assert redrive["ScalingConfig"] == {"MaximumConcurrency": 2}
    # AND with cdk.json's knobs, what stays unreserved is Lambda's minimum or more
    committed = DeployConfig.from_context(committed_context())
    left = committed.account_concurrency - sum(committed.reserved_concurrency().values())
    assert left >= 100
