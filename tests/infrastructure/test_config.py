"""Deployment knobs: cdk.json's context is valid; a bad one fails synthesis with its field."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import AlarmThresholds, DeployConfig
from infra.offline import cdk_json_context


def test_config_committed_cdk_json_is_valid():
    # GIVEN the "punctual" context committed in cdk.json
    # WHEN it is validated
    config = DeployConfig.from_context(cdk_json_context()["punctual"])
    # THEN it is the documented default deployment: the shard count and lookahead the
    # capacity model chose for the 500k top-of-hour peak (docs/capacity.md)
    assert (config.shard_count, config.lookahead_seconds) == (128, 420)
    assert config.retain_data
    assert config.deletion_protection
    assert config.alarms == AlarmThresholds()


@pytest.mark.parametrize(
    ("context", "field"),
    [
        ({"shard_count": 0}, r"punctual\.shard_count"),
        ({"map_concurrency": 41}, r"punctual\.map_concurrency"),
        ({"lookahead_seconds": 900}, r"punctual\.lookahead_seconds"),
        ({"reconcile_minute": 60}, r"punctual\.reconcile_minute"),
        ({"operator_principals": ["alice"]}, r"punctual\.operator_principals\.0"),
        ({"alarm_emails": ["not-an-address"]}, r"punctual\.alarm_emails\.0"),
        ({"alarms": {"strict_lag_p99_seconds": 0}}, r"punctual\.alarms\.strict_lag_p99_seconds"),
        ({"alarms": {"api_5xx": -1}}, r"punctual\.alarms\.api_5xx"),
        ({"alarms": {"lag": 5}}, r"punctual\.alarms\.lag"),
        ({"shards": 64}, r"punctual\.shards"),
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
