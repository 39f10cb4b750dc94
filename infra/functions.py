"""One factory for every Punctual Lambda: same runtime, layer, code root, logs and settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.checks import acknowledge
from infra.layer import ARCHITECTURE, ROOT, RUNTIME

FUNCTIONS_ROOT = ROOT / "functions"


@dataclass(frozen=True)
class FunctionDefaults:
    """What every function shares: the layer, the PUNCTUAL_* settings and log retention."""

    layer: lambda_.ILayerVersion
    environment: Mapping[str, str]
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH


def log_group(
    scope: Construct,
    construct_id: str,
    retention: logs.RetentionDays,
    name: str | None = None,
) -> logs.LogGroup:
    # The stateless stack leaves nothing behind; retention bounds what it keeps meanwhile.
    return logs.LogGroup(
        scope,
        construct_id,
        log_group_name=name,
        retention=retention,
        removal_policy=RemovalPolicy.DESTROY,
    )


def _role_and_logs(
    scope: Construct, construct_id: str, retention: logs.RetentionDays, description: str
) -> tuple[logs.LogGroup, iam.Role]:
    """A function's own log group and role (``<id>Logs``, ``<id>Role``): instead of
    AWSLambdaBasicExecutionRole, it may write to its own log group only, not create log
    groups anywhere in the account."""
    logs_ = log_group(scope, f"{construct_id}Logs", retention)
    role = iam.Role(
        scope,
        f"{construct_id}Role",
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        description=description,
    )
    logs_.grant_write(role)
    return logs_, role


def inline_function(
    scope: Construct, construct_id: str, *, code: Path, description: str
) -> lambda_.Function:
    """A custom resource's handler: ``code`` (one file, standard library and boto3 only)
    inlined in the template, under a role that may write its own logs and nothing else
    until the caller grants more."""
    logs_, role = _role_and_logs(
        scope, construct_id, logs.RetentionDays.ONE_MONTH, f"Punctual: {description}"
    )
    return lambda_.Function(
        scope,
        construct_id,
        description=description,
        runtime=RUNTIME,
        architecture=ARCHITECTURE,
        handler="index.on_event",
        code=lambda_.Code.from_inline(code.read_text(encoding="utf-8")),
        role=role,
        timeout=Duration.seconds(60),
        memory_size=128,
        log_group=logs_,
    )


def role_of(function: lambda_.Function) -> iam.IRole:
    """Where findings about a function's permissions are acknowledged: its role's policy."""
    role = function.role
    if role is None:  # only imported functions lack one
        raise ValueError(f"{function.node.path} has no role")
    return role


def python_function(
    scope: Construct,
    construct_id: str,
    *,
    handler: str,
    defaults: FunctionDefaults,
    timeout: Duration,
    memory_mb: int,
    description: str,
    any_resource_reasons: tuple[str, ...] = (),
    reserved_concurrency: int | None = None,
) -> lambda_.Function:
    """``handler`` is relative to functions/, e.g. 'api.handler.lambda_handler'.

    ``reserved_concurrency``: its reserved concurrency (DeployConfig.reserved_concurrency),
    which is also its cap; None: it shares the account's unreserved pool.

    ``any_resource_reasons``: why the function's other actions on '*' must be on '*' (one
    acknowledgment covers every '*' statement of the role, so its reason names them all).
    """
    package = handler.split(".")[0]
    logs_, role = _role_and_logs(
        scope, construct_id, defaults.log_retention, f"Punctual {package} function"
    )
    function = lambda_.Function(
        scope,
        construct_id,
        description=description,
        runtime=RUNTIME,
        architecture=ARCHITECTURE,
        handler=handler,
        code=_package_code(package),
        layers=[defaults.layer],
        role=role,
        environment=_environment(defaults),
        timeout=timeout,
        memory_size=memory_mb,
        reserved_concurrent_executions=reserved_concurrency,
        tracing=lambda_.Tracing.ACTIVE,
        log_group=logs_,
        logging_format=lambda_.LoggingFormat.JSON,
        application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
        system_log_level_v2=lambda_.SystemLogLevel.WARN,
    )
    _acknowledge_any_resource(role, any_resource_reasons)
    return function


def _package_code(package: str) -> lambda_.Code:
    """The function's own package of functions/, and nothing else of it."""
    return lambda_.Code.from_asset(
        str(FUNCTIONS_ROOT),
        exclude=["*", f"!{package}", f"!{package}/**", "**/__pycache__"],
    )


def _environment(defaults: FunctionDefaults) -> dict[str, str]:
    """Powertools' settings, then the PUNCTUAL_* ones every function shares."""
    return {
        "POWERTOOLS_SERVICE_NAME": "punctual",
        "POWERTOOLS_METRICS_NAMESPACE": "Punctual",
        # Responses carry tenants' payloads: they stay out of X-Ray.
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        **defaults.environment,
    }


def _acknowledge_any_resource(role: iam.Role, reasons: tuple[str, ...]) -> None:
    """The role's statements on '*': active tracing's, and those ``reasons`` explain."""
    acknowledge(
        role,
        "IAM5[Resource::*]",
        " ".join(
            (
                "xray:PutTraceSegments and xray:PutTelemetryRecords (active tracing) have no "
                "resource-level permissions.",
                *reasons,
            )
        ),
    )
