"""One factory for every Punctual Lambda: same runtime, layer, code root and settings."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.layer import ARCHITECTURE, ROOT, RUNTIME

FUNCTIONS_ROOT = ROOT / "functions"


def python_function(
    scope: Construct,
    construct_id: str,
    *,
    handler: str,
    layer: lambda_.ILayerVersion,
    environment: dict[str, str],
    timeout: Duration,
    memory_mb: int = 512,
    reserved_concurrency: int | None = None,
) -> lambda_.Function:
    """``handler`` is relative to functions/, e.g. 'api.handler.lambda_handler'."""
    package = handler.split(".")[0]
    return lambda_.Function(
        scope,
        construct_id,
        runtime=RUNTIME,
        architecture=ARCHITECTURE,
        handler=handler,
        code=lambda_.Code.from_asset(
            str(FUNCTIONS_ROOT),
            exclude=["*", f"!{package}", f"!{package}/**", "**/__pycache__"],
        ),
        layers=[layer],
        environment={
            "POWERTOOLS_SERVICE_NAME": "punctual",
            "POWERTOOLS_METRICS_NAMESPACE": "Punctual",
            **environment,
        },
        timeout=timeout,
        memory_size=memory_mb,
        reserved_concurrent_executions=reserved_concurrency,
        tracing=lambda_.Tracing.ACTIVE,
        log_retention=logs.RetentionDays.ONE_MONTH,
    )
