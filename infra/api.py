"""The HTTPS API: API Gateway REST with IAM (SigV4) auth on every method -> the API Lambda.

The resources and methods come from the committed OpenAPI document (docs/openapi.json,
generated from the routes and checked fresh by a test), so a path the code does not
serve is refused by API Gateway itself, unsigned requests never reach the function, and
no route is added in two places.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.checks import acknowledge
from infra.data import DataReferences
from infra.functions import FunctionDefaults, log_group, python_function
from infra.layer import ROOT
from infra.queues import TargetQueueAccess
from punctual.dal.tables import TENANT_INDEX

OPENAPI_DOCUMENT = ROOT / "docs" / "openapi.json"
STAGE = "prod"
# API Gateway gives up on an integration after 29 s; the function ends first, so that a
# request never goes on working after its caller was told it failed.
FUNCTION_TIMEOUT = Duration.seconds(28)


@dataclass(frozen=True)
class Operation:
    path: str  # "/v1/schedules/{schedule_id}"
    method: str  # "GET"
    has_body: bool


def operations(document: Path = OPENAPI_DOCUMENT) -> list[Operation]:
    spec = json.loads(document.read_text(encoding="utf-8"))
    return [
        Operation(path, method.upper(), "requestBody" in operation)
        for path, methods in spec["paths"].items()
        for method, operation in methods.items()
    ]


# Errors API Gateway answers itself (unsigned, denied, throttled, malformed body) take the
# API's one error shape and its codes' case: a refused caller is `forbidden` as the API's
# own 403, a throttled one `throttled`; any other takes API Gateway's response type in
# lower case (e.g. `request_too_large`).
def _error_template(code: str) -> str:
    return (
        '{"error": {"code": "' + code + '", "message": $context.error.messageString, '
        '"fields": [], "details": {"request_id": "$context.requestId"}}}'
    )


_AS_IS = "$context.error.responseType.toLowerCase()"  # (VTL calls Java's String methods)
_GATEWAY_ERRORS = {
    "BadRequestBody": (apigw.ResponseType.BAD_REQUEST_BODY, "invalid_input"),
    "AccessDenied": (apigw.ResponseType.ACCESS_DENIED, "forbidden"),
    "MissingAuthenticationToken": (apigw.ResponseType.MISSING_AUTHENTICATION_TOKEN, "forbidden"),
    "InvalidSignature": (apigw.ResponseType.INVALID_SIGNATURE, "forbidden"),
    "ExpiredToken": (apigw.ResponseType.EXPIRED_TOKEN, "forbidden"),
    "Throttled": (apigw.ResponseType.THROTTLED, "throttled"),
    "Default4xx": (apigw.ResponseType.DEFAULT_4_XX, _AS_IS),
    "Default5xx": (apigw.ResponseType.DEFAULT_5_XX, _AS_IS),
}

# One JSON line per request (every value quoted: API Gateway writes '-' for a missing
# one); the caller's principal is what tenancy is derived from.
_ACCESS_LOG = (
    "{"
    + ", ".join(
        f'"{name}": "{value}"'
        for name, value in {
            "requestId": "$context.requestId",
            "time": "$context.requestTime",
            "caller": "$context.identity.userArn",
            "sourceIp": "$context.identity.sourceIp",
            "method": "$context.httpMethod",
            "resource": "$context.resourcePath",
            "path": "$context.path",
            "status": "$context.status",
            "responseLength": "$context.responseLength",
            "latencyMs": "$context.responseLatency",
            "integrationLatencyMs": "$context.integrationLatency",
            "integrationStatus": "$context.integrationStatus",
            "errorType": "$context.error.responseType",
            "error": "$context.error.message",
            "xrayTraceId": "$context.xrayTraceId",
        }.items()
    )
    + "}"
)


def _caller_policy(accounts: Sequence[str]) -> iam.PolicyDocument | None:
    """Cross-account SigV4 callers need the API's consent besides their own identity
    policy; callers of this account keep needing only theirs (no explicit deny here)."""
    if not accounts:
        return None
    return iam.PolicyDocument(
        statements=[
            iam.PolicyStatement(
                actions=["execute-api:Invoke"],
                principals=[iam.AccountPrincipal(account) for account in accounts],
                resources=["execute-api:/*"],
            )
        ]
    )


class Api(Construct):
    """The API function, its grants, and the REST API in front of it."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataReferences,
        queues: TargetQueueAccess,
        defaults: FunctionDefaults,
        rate_limit: int,
        burst_limit: int,
        caller_accounts: Sequence[str],
        reserved_concurrency: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.function = self._api_function(defaults, reserved_concurrency)
        self._grant_tables(data)
        self._grant_queues(queues)
        self.rest_api = self._rest_api(
            defaults.log_retention, rate_limit, burst_limit, caller_accounts
        )
        self._add_gateway_responses()
        self._add_operations()
        self._acknowledge()

    def _api_function(
        self, defaults: FunctionDefaults, reserved_concurrency: int
    ) -> lambda_.Function:
        return python_function(
            self,
            "Function",
            handler="api.handler.lambda_handler",
            defaults=defaults,
            timeout=FUNCTION_TIMEOUT,
            # CPU scales with memory: a cron's next fires and its per-minute load across
            # its zone's offsets are computed per request, and cold starts import pydantic
            # and the zone rules; 1 GB keeps both well under a second.
            memory_mb=1024,
            description="Punctual's HTTPS API (control plane)",
            # Requests are served whatever the relay's backlog takes (DeployConfig).
            reserved_concurrency=reserved_concurrency,
        )

    def _grant_tables(self, data: DataReferences) -> None:
        """Exactly what the API's code calls (tests/infrastructure/inventory.txt)."""
        data.grant(
            self.function,
            {
                # Query: a schedule's versions (GET /v1/schedules/{id}/versions).
                # ConditionCheckItem: a backfill checks the schedule's version in its
                # transactions; UpdateItem: a run now's marks the schedule's latest one
                # (manual_through, read by the reconciler) on the same condition.
                ("schedules_table", None): (
                    "GetItem",
                    "BatchGetItem",
                    "PutItem",
                    "Query",
                    "ConditionCheckItem",
                    "UpdateItem",
                ),
                ("schedules_table", TENANT_INDEX): ("Query",),
                ("occurrences_table", None): ("GetItem", "Query", "PutItem", "UpdateItem"),
                # Scan: an operator's listing of the tenants (GET /v1/admin/tenants).
                ("tenants_table", None): ("GetItem", "Query", "Scan", "PutItem", "UpdateItem"),
                # Powertools' idempotent create; GetItem is its fallback when a refused put
                # returns no item, which the tests cannot provoke (test_inventory.py).
                ("idempotency_table", None): ("GetItem", "PutItem", "UpdateItem", "DeleteItem"),
                # GET /v1/admin/reconcile reads the reconciler's reports; a change checks
                # that the materializer's walk has not passed the bucket its cursor goes to,
                # and gives a shard its first watermark (a conditional put, once per shard).
                ("leases_table", None): ("BatchGetItem", "ConditionCheckItem", "PutItem"),
                # GET /v1/occurrences reads the tenant's ledger pages and the hours' marks.
                ("ledger_table", None): ("Query",),
            },
        )

    def _grant_queues(self, queues: TargetQueueAccess) -> None:
        """A target's queue and DLQ: look for them, create them tagged with their owner
        (TagQueue authorizes CreateQueue's tags), check the owner, read their ARNs, set the
        tenant's queue policy; and send an occurrence due within the relay's batching window
        at once (SendMessageBatch is authorized as SendMessage), as the relay does."""
        queues.grant(
            self.function,
            "SendMessage",
            "GetQueueUrl",
            "CreateQueue",
            "TagQueue",
            "ListQueueTags",
            "GetQueueAttributes",
            "SetQueueAttributes",
        )

    def _rest_api(
        self,
        log_retention: logs.RetentionDays,
        rate_limit: int,
        burst_limit: int,
        caller_accounts: Sequence[str],
    ) -> apigw.RestApi:
        """The regional REST API: one throttled, traced stage with access logs, SigV4 on
        every method."""
        access_logs = log_group(self, "AccessLogs", log_retention)
        return apigw.RestApi(
            self,
            "Rest",
            # The name the console lists and the alarms' ApiName dimension: the stack's.
            rest_api_name=Stack.of(self).stack_name,
            description="Punctual: schedules, occurrences, targets (SigV4)",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # API Gateway writes access and execution logs through one account-wide role.
            cloud_watch_role=True,
            deploy_options=apigw.StageOptions(
                stage_name=STAGE,
                throttling_rate_limit=rate_limit,
                throttling_burst_limit=burst_limit,
                access_log_destination=apigw.LogGroupLogDestination(access_logs),
                access_log_format=apigw.AccessLogFormat.custom(_ACCESS_LOG),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                # Bodies carry tenants' payloads: never into execution logs.
                data_trace_enabled=False,
                metrics_enabled=True,
                tracing_enabled=True,
            ),
            default_method_options=apigw.MethodOptions(
                authorization_type=apigw.AuthorizationType.IAM
            ),
            policy=_caller_policy(caller_accounts),
        )

    def _add_gateway_responses(self) -> None:
        """The API's error shape for what API Gateway refuses itself (_GATEWAY_ERRORS)."""
        for name, (response_type, code) in _GATEWAY_ERRORS.items():
            self.rest_api.add_gateway_response(
                name,
                type=response_type,
                templates={"application/json": _error_template(code)},
            )

    def _add_operations(self) -> None:
        """Every operation of the OpenAPI document, integrated with the function."""
        # A body that is not a JSON object is refused before the function runs; the
        # function validates the fields themselves and names each bad one.
        validator = self.rest_api.add_request_validator(
            "Validator", validate_request_body=True, validate_request_parameters=True
        )
        json_object = self.rest_api.add_model(
            "JsonObject",
            content_type="application/json",
            schema=apigw.JsonSchema(
                schema=apigw.JsonSchemaVersion.DRAFT4, type=apigw.JsonSchemaType.OBJECT
            ),
        )
        # One permission for the whole API instead of one per method: the function's
        # resource policy stays small as routes are added.
        integration = apigw.LambdaIntegration(
            self.function, scope_permission_to_method=False, timeout=Duration.seconds(29)
        )
        for operation in operations():
            self.rest_api.root.resource_for_path(operation.path).add_method(
                operation.method,
                integration,
                request_validator=validator,
                request_models={"application/json": json_object} if operation.has_body else None,
            )

    def _acknowledge(self) -> None:
        acknowledge(
            self.rest_api,
            "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs]",
            "API Gateway's account-wide logging role: the managed policy is the one AWS "
            "documents for it and allows writing API Gateway's own log groups only.",
        )
        acknowledge(
            self.rest_api,
            "APIG3",
            "Every method requires a SigV4 signature from a principal bound to a tenant, "
            "and the stage is throttled; a WAF web ACL would add cost and no check that "
            "IAM does not already make. An operator can still attach one to the stage.",
        )
        acknowledge(
            self.rest_api,
            "COG4",
            "Callers are AWS principals (SigV4, AWS_IAM authorization on every method) and "
            "the tenant is derived from the principal: there are no Cognito users.",
        )
