"""The Punctual stacks: they compose the capability constructs, nothing else.

Two stacks: `PunctualData` holds the tables (stateful, retained, deletion-protected) and
`Punctual` everything else (stateless: functions, API, state machines, alarms), so that
redeploying or even deleting the service never touches data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
from constructs import Construct

from infra.api import Api
from infra.checks import add_security_checks
from infra.config import DeployConfig, committed_context
from infra.data import Data, DataReferences
from infra.functions import FunctionDefaults
from infra.layer import CoreLayer
from infra.materializer import Materialization
from infra.observability import Observability, Watched
from infra.operators import OperatorRole
from infra.queues import TargetQueueAccess
from infra.reconciler import Reconciliation
from infra.relay import Relaying
from punctual.settings import Settings


class PunctualDataStack(cdk.Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: DeployConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.data = Data(
            self,
            "Data",
            settings=config.settings(),
            retain=config.retain_data,
            deletion_protection=config.deletion_protection,
            warm_write_units=config.warm_write_units,
        )


class PunctualStack(cdk.Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: DeployConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self._config = config
        settings = config.settings()
        data = DataReferences(self, "Data", settings=settings)
        queues = TargetQueueAccess(self, "TargetQueues", prefix=settings.queue_prefix)
        operator = OperatorRole(self, "Operator") if config.operator_role else None
        defaults = self._function_defaults(data, operator)
        self.api = self._api(data, queues, defaults)
        self.materialization = self._materialization(data, defaults)
        self.relaying = self._relaying(data, queues, defaults)
        self.reconciliation = self._reconciliation(data, queues, defaults)
        self.observability = self._observability(settings, defaults)
        self._outputs(operator)

    def _function_defaults(
        self, data: DataReferences, operator: OperatorRole | None
    ) -> FunctionDefaults:
        """What every function shares: the core layer and the PUNCTUAL_* settings."""
        environment = {
            **data.environment(),
            **self._config.environment(),
            # Where the tables and queues live: the workers' IAM policy names them.
            "PUNCTUAL_ACCOUNT_ID": cdk.Aws.ACCOUNT_ID,
            "PUNCTUAL_PARTITION": cdk.Aws.PARTITION,
        }
        if operator is not None:
            environment["PUNCTUAL_OPERATOR_PRINCIPALS"] = ",".join(
                [operator.role.role_arn, *sorted(self._config.operator_principals)]
            )
        return FunctionDefaults(layer=CoreLayer(self, "Core").layer, environment=environment)

    def _api(
        self, data: DataReferences, queues: TargetQueueAccess, defaults: FunctionDefaults
    ) -> Api:
        return Api(
            self,
            "Api",
            data=data,
            queues=queues,
            defaults=defaults,
            rate_limit=self._config.api_rate_limit,
            reserved_concurrency=self._config.api_concurrency,
            burst_limit=self._config.api_burst_limit,
            caller_accounts=self._config.caller_accounts,
        )

    def _materialization(self, data: DataReferences, defaults: FunctionDefaults) -> Materialization:
        return Materialization(
            self,
            "Materialization",
            data=data,
            defaults=defaults,
            group_size=self._config.shard_group_size,
            max_concurrency=self._config.map_concurrency,
            reserved_concurrency=self._config.materializer_concurrency,
        )

    def _relaying(
        self, data: DataReferences, queues: TargetQueueAccess, defaults: FunctionDefaults
    ) -> Relaying:
        return Relaying(
            self,
            "Relay",
            data=data,
            queues=queues,
            defaults=defaults,
            parallelization_factor=self._config.relay_parallelization_factor,
            catchup_parallelization_factor=self._config.catchup_parallelization_factor,
            batching_window_seconds=self._config.relay_batching_window_seconds,
            reserved_concurrency=self._config.relay_concurrency,
            catchup_reserved_concurrency=self._config.catchup_concurrency,
        )

    def _reconciliation(
        self, data: DataReferences, queues: TargetQueueAccess, defaults: FunctionDefaults
    ) -> Reconciliation:
        return Reconciliation(
            self,
            "Reconciliation",
            data=data,
            queues=queues,
            defaults=defaults,
            group_size=self._config.reconcile_group_size,
            max_concurrency=self._config.reconcile_concurrency,
            minute=self._config.reconcile_minute,
        )

    def _observability(self, settings: Settings, defaults: FunctionDefaults) -> Observability:
        """The alarms and the dashboard, on what the other constructs made."""
        return Observability(
            self,
            "Observability",
            watched=Watched(
                api=self.api.rest_api,
                api_function=self.api.function,
                materializer=self.materialization.function,
                ticker=self.materialization.state_machine,
                relay=self.relaying.function,
                catchup_relay=self.relaying.catchup,
                relay_failures=self.relaying.failures,
                relay_failures_dead=self.relaying.dead_failures,
                reconciler=self.reconciliation.function,
                reconciler_machine=self.reconciliation.state_machine,
                ticker_rule=self.materialization.rule,
                reconciler_rule=self.reconciliation.rule,
            ),
            settings=settings,
            thresholds=self._config.alarms,
            emails=self._config.alarm_emails,
            defaults=defaults,
        )

    def _outputs(self, operator: OperatorRole | None) -> None:
        """The API's URL, the operator role (allowed to call the API), the alarm topic."""
        cdk.CfnOutput(self, "ApiUrl", value=self.api.rest_api.url, description="Base URL")
        if operator is not None:
            operator.allow(self.api.rest_api)
            cdk.CfnOutput(
                self,
                "OperatorRoleArn",
                value=operator.role.role_arn,
                description="Assume it to onboard tenants (/v1/admin)",
            )
        cdk.CfnOutput(
            self,
            "AlarmTopicArn",
            value=self.observability.topic.topic_arn,
            description="Subscribe here to receive the alarms",
        )


@dataclass(frozen=True)
class Deployment:
    data: PunctualDataStack
    service: PunctualStack


def compose(app: cdk.App, config: DeployConfig, name: str = "Punctual") -> Deployment:
    """Both stacks, the service deployed after its tables, with the security checks on."""
    data = PunctualDataStack(
        app, f"{name}Data", config=config, description="Punctual: tables (stateful)"
    )
    service = PunctualStack(
        app, name, config=config, description="Punctual: API, materializer, relay, reconciler"
    )
    # Nothing references the data stack's outputs (tables by name, the stream through SSM),
    # so the order is stated here.
    service.add_stack_dependency(data, "the functions use its tables and stream")
    add_security_checks(app)
    return Deployment(data, service)


def build(app: cdk.App) -> Deployment:
    """What app.py deploys, configured by the app's "punctual" context: cdk.json's, with
    `-c punctual='{...}'` (a JSON string) laid over it knob by knob."""
    given = app.node.try_get_context("punctual") or {}
    return compose(app, DeployConfig.from_context(given, base=committed_context()))
