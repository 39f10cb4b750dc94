"""The local gateway's request mapping: principal from SigV4, the stage prefix."""

from __future__ import annotations

from punctual.local.gateway import api_path, principal_of, rest_event


def test_principal_is_named_by_the_sigv4_access_key_id():
    # GIVEN a SigV4 Authorization header; WHEN mapped; THEN the key id names the user
    header = (
        "AWS4-HMAC-SHA256 Credential=demo/20261130/us-east-1/execute-api/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=abc"
    )
    assert principal_of(header) == "arn:aws:iam::000000000000:user/demo"
    # AND an unsigned request has no principal (the gateway answers 403)
    assert principal_of(None) is None
    assert principal_of("Bearer token") is None


def test_deployed_stage_prefix_is_accepted_and_removed():
    # GIVEN a client built for the deployed URL (https://.../prod/v1/...)
    # THEN the local gateway routes it like /v1/..., and leaves other paths alone
    assert api_path("/prod/v1/schedules") == "/v1/schedules"
    assert api_path("/v1/schedules") == "/v1/schedules"
    assert api_path("/production/v1") == "/production/v1"


def test_rest_event_carries_the_caller_and_the_query():
    event = rest_event(
        "GET", "/v1/schedules", "arn:aws:iam::000000000000:user/demo", None, {"limit": ["5"]}
    )
    assert event["requestContext"]["identity"]["userArn"].endswith("user/demo")
    assert event["queryStringParameters"] == {"limit": "5"}
    assert event["multiValueQueryStringParameters"] == {"limit": ["5"]}
