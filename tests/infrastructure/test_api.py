"""The HTTPS API: IAM auth on every method, validation, throttling, logs, permissions."""

from __future__ import annotations

import json
import re
from typing import Any

import aws_cdk as cdk
from aws_cdk.assertions import Match, Template

from infra.api import STAGE, operations
from infra.config import DeployConfig
from infra.offline import NO_BUNDLING
from infra.stack import PunctualStack

from .conftest import actions_of, render, resources_of, role_statements

HANDLER = "api.handler.lambda_handler"


def _resource_paths(template: Template) -> dict[str, str]:
    """Logical id of each API Gateway resource -> its full path ("/v1/schedules")."""
    resources = template.find_resources("AWS::ApiGateway::Resource")
    paths: dict[str, str] = {}

    def path_of(logical_id: str) -> str:
        if logical_id not in paths:
            properties = resources[logical_id]["Properties"]
            parent = properties["ParentId"]
            prefix = path_of(parent["Ref"]) if "Ref" in parent else ""
            paths[logical_id] = f"{prefix}/{properties['PathPart']}"
        return paths[logical_id]

    for logical_id in resources:
        path_of(logical_id)
    return paths


def _methods(template: Template) -> dict[tuple[str, str], dict[str, Any]]:
    paths = _resource_paths(template)
    return {
        (paths[m["Properties"]["ResourceId"]["Ref"]], m["Properties"]["HttpMethod"]): m[
            "Properties"
        ]
        for m in template.find_resources("AWS::ApiGateway::Method").values()
    }


def test_api_every_route_is_a_method_and_every_method_requires_iam(service: Template):
    # GIVEN the routes of the committed OpenAPI document
    expected = {(op.path, op.method) for op in operations()}
    assert ("/v1/schedules", "POST") in expected
    assert ("/v1/admin/tenants/{tenant_id}/principals", "POST") in expected
    # WHEN the API is synthesized
    methods = _methods(service)
    # THEN API Gateway has exactly those methods, no more (no proxy, no OPTIONS)
    assert set(methods) == expected
    # AND every one of them requires a SigV4-signed IAM principal
    assert {m["AuthorizationType"] for m in methods.values()} == {"AWS_IAM"}


def test_api_methods_proxy_to_the_api_function(service: Template):
    # THEN every method is a Lambda proxy integration to the API function, and one
    # permission (not one per method) lets API Gateway invoke it
    function = next(
        iter(service.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": HANDLER}}))
    )
    for method in _methods(service).values():
        integration = method["Integration"]
        assert integration["Type"] == "AWS_PROXY"
        assert function in json.dumps(integration["Uri"])
    permissions = service.find_resources(
        "AWS::Lambda::Permission",
        {"Properties": {"FunctionName": {"Fn::GetAtt": [function, "Arn"]}}},
    )
    assert len(permissions) == 1


def test_api_bodies_must_be_json_objects_where_an_operation_takes_one(service: Template):
    # GIVEN the operations that take a body
    with_body = {(op.path, op.method) for op in operations() if op.has_body}
    assert ("/v1/schedules", "POST") in with_body
    # THEN those methods validate the body against a JSON-object model; the others carry
    # no model, and every method uses the validator
    model = next(iter(service.find_resources("AWS::ApiGateway::Model")))
    service.has_resource_properties(
        "AWS::ApiGateway::Model",
        {"ContentType": "application/json", "Schema": Match.object_like({"type": "object"})},
    )
    service.has_resource_properties(
        "AWS::ApiGateway::RequestValidator",
        {"ValidateRequestBody": True, "ValidateRequestParameters": True},
    )
    for key, method in _methods(service).items():
        assert "RequestValidatorId" in method
        if key in with_body:
            assert method["RequestModels"] == {"application/json": {"Ref": model}}
        else:
            assert "RequestModels" not in method


def test_api_stage_is_throttled_with_access_logs_and_tracing(service: Template):
    # THEN the stage applies the configured rate and burst to every method, writes JSON
    # access logs with the caller's ARN, traces, and never logs request bodies
    service.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {
            "StageName": STAGE,
            "TracingEnabled": True,
            "AccessLogSetting": {
                "DestinationArn": Match.any_value(),
                "Format": Match.string_like_regexp(r"\$context\.identity\.userArn"),
            },
            "MethodSettings": [
                Match.object_like(
                    {
                        "HttpMethod": "*",
                        "ResourcePath": "/*",
                        "ThrottlingRateLimit": 300,
                        "ThrottlingBurstLimit": 600,
                        "DataTraceEnabled": False,
                        "LoggingLevel": "ERROR",
                        "MetricsEnabled": True,
                    }
                )
            ],
        },
    )


def test_api_access_log_format_is_one_json_object(service: Template):
    # GIVEN the access log format
    stage = next(iter(service.find_resources("AWS::ApiGateway::Stage").values()))
    log_format = stage["Properties"]["AccessLogSetting"]["Format"]
    # WHEN API Gateway writes '-' for every variable of a request that has none
    line = re.sub(r"\$context\.[A-Za-z.]+", "-", log_format)
    # THEN the line is still one JSON object, with the caller and the error
    record = json.loads(line)
    assert {"caller", "status", "error", "latencyMs"} <= set(record)
    assert json.loads(log_format)["caller"] == "$context.identity.userArn"


def test_api_gateway_errors_use_the_one_error_shape(service: Template):
    # THEN errors API Gateway answers itself are shaped like the API's own errors
    responses = service.find_resources("AWS::ApiGateway::GatewayResponse")
    codes = {}
    for response in responses.values():
        template = response["Properties"]["ResponseTemplates"]["application/json"]
        body = json.loads(template.replace("$context.error.messageString", '"a message"'))
        assert set(body["error"]) == {"code", "message", "fields", "details"}
        codes[response["Properties"]["ResponseType"]] = body["error"]["code"]
    # AND their codes are the API's, in its case: a refused caller is `forbidden` as the
    # API's own 403, any other takes the response type in lower case (snake case)
    lower = "$context.error.responseType.toLowerCase()"
    assert codes == {
        "BAD_REQUEST_BODY": "invalid_input",
        "ACCESS_DENIED": "forbidden",
        "MISSING_AUTHENTICATION_TOKEN": "forbidden",
        "INVALID_SIGNATURE": "forbidden",
        "EXPIRED_TOKEN": "forbidden",
        "THROTTLED": "throttled",
        "DEFAULT_4XX": lower,
        "DEFAULT_5XX": lower,
    }
    service.has_resource_properties(
        "AWS::ApiGateway::GatewayResponse",
        {
            "ResponseType": "BAD_REQUEST_BODY",
            "ResponseTemplates": {
                "application/json": Match.string_like_regexp('"code": "invalid_input"')
            },
        },
    )


def test_api_function_manages_queues_only_under_the_prefix(service: Template):
    # THEN the API function's SQS permissions create a target's queues (tagged with their
    # owner), find and check an existing one's owner, read their ARNs and set their
    # policies, and send an occurrence due within the relay's batching window, on queues
    # named punctual-* in this account and region only; it never reads messages
    sqs = [s for s in role_statements(service, HANDLER) if actions_of(s)[0].startswith("sqs:")]
    assert len(sqs) == 1
    assert sorted(actions_of(sqs[0])) == [
        "sqs:CreateQueue",
        "sqs:GetQueueAttributes",
        "sqs:GetQueueUrl",
        "sqs:ListQueueTags",
        "sqs:SendMessage",
        "sqs:SetQueueAttributes",
        "sqs:TagQueue",
    ]
    assert [render(r) for r in resources_of(sqs[0])] == [
        "arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:punctual-*"
    ]


def test_api_function_reads_the_leases_and_only_puts_a_shards_first_item(service: Template):
    # THEN the API reaches schedules, occurrences, tenants and idempotency, and of the
    # leases table: batches (GET /v1/admin/reconcile), a shard's watermark checked inside a
    # schedule change's transaction, and the put that opens a shard (conditional, in the
    # code); it never takes, renews or moves a lease (no UpdateItem)
    statements = [
        s for s in role_statements(service, HANDLER) if actions_of(s)[0].startswith("dynamodb:")
    ]
    resources = " ".join(render(r) for s in statements for r in resources_of(s))
    for table in ("schedules", "occurrences", "tenants", "idempotency"):
        assert f"table/punctual-{table}" in resources
    leases = [s for s in statements if "punctual-leases" in render(resources_of(s)[0])]
    assert [sorted(actions_of(s)) for s in leases] == [
        ["dynamodb:BatchGetItem", "dynamodb:ConditionCheckItem", "dynamodb:PutItem"]
    ]


def test_api_function_answers_before_api_gateway_gives_up(service: Template):
    # THEN the function's timeout is under the integration's 29 s
    service.has_resource_properties(
        "AWS::Lambda::Function", {"Handler": HANDLER, "Timeout": 28, "MemorySize": 1024}
    )
    for method in _methods(service).values():
        assert method["Integration"]["TimeoutInMillis"] == 29_000


def test_api_admits_other_accounts_only_when_configured(service: Template):
    # GIVEN no caller_accounts in the test context
    # THEN the API has no resource policy: only principals of the deploying account,
    # with an identity policy allowing execute-api:Invoke, can call it
    api = next(iter(service.find_resources("AWS::ApiGateway::RestApi").values()))
    assert "Policy" not in api["Properties"]


def test_api_caller_accounts_become_the_resource_policy():
    # GIVEN a deployment that admits callers of two tenant accounts
    app = cdk.App(context=NO_BUNDLING)
    config = DeployConfig(caller_accounts=["111111111111", "222222222222"])
    # WHEN the service stack is synthesized (no security checks: one resource is enough)
    template = Template.from_stack(PunctualStack(app, "Callers", config=config))
    # THEN the API's resource policy lets exactly those accounts invoke it, nothing more
    api = next(iter(template.find_resources("AWS::ApiGateway::RestApi").values()))
    (statement,) = api["Properties"]["Policy"]["Statement"]
    assert statement["Effect"] == "Allow"
    assert statement["Action"] == "execute-api:Invoke"
    assert statement["Resource"] == "execute-api:/*"
    assert [render(principal) for principal in statement["Principal"]["AWS"]] == [
        "arn:<AWS::Partition>:iam::111111111111:root",
        "arn:<AWS::Partition>:iam::222222222222:root",
    ]
