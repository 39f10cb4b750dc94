"""API Lambda: API Gateway REST (IAM auth) -> the control plane."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from api import errors
from api.body import JsonBodiesOnly, parse_body
from api.context import IDEMPOTENCY, require_operator, services
from api.routes import router
from punctual.observability import add_clock_skew, logger, metrics, tracer

ADMIN_PREFIX = "/v1/admin/"


class OperatorsFirst(JsonBodiesOnly):
    """An operator-only route answers a tenant 403 before its input is validated: a 400
    would describe fields the caller may not use (and which exist)."""

    def handler(self, app: Any, next_middleware: Any) -> Any:
        if app.current_event.path.startswith(ADMIN_PREFIX):
            require_operator(app)
        return super().handler(app, next_middleware)


app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=parse_body)
# Read before any route's middleware stack is built (on its first request).
app._request_validation_middleware = OperatorsFirst()
app.include_router(router)
errors.install(app)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    IDEMPOTENCY.register_lambda_context(context)
    answer = app.resolve(event, context)
    # The API's one metric, flushed when there is one (log_metrics would warn on every
    # request before DynamoDB first answered).
    if add_clock_skew("api", services().clock_offset()):
        metrics.flush_metrics()
    return answer
