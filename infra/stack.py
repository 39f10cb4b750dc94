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
        settings = config.settings()
        data = DataReferences(self, "Data", settings=settings)
        queues = TargetQueueAccess(self, "TargetQueues", prefix=settings.queue_prefix)
        environment = {
            **data.environment(),
            **config.environment(),
            # Where the tables and queues live: the workers' IAM policy names them.
            "PUNCTUAL_ACCOUNT_ID": cdk.Aws.ACCOUNT_ID,
            "PUNCTUAL_PARTITION": cdk.Aws.PARTITION,
        }
        operator = OperatorRole(self, "Operator") if config.operator_role else None
        if operator is not None:
            environment["PUNCTUAL_OPERATOR_PRINCIPALS"] = ",".join(
                [operator.role.role_arn, *sorted(config.operator_principals)]
            )
        defaults = FunctionDefaults(layer=CoreLayer(self, "Core").layer, environment=environment)
        self.api = Api(
            self,
            "Api",
            data=data,
            queues=queues,
            defaults=defaults,
            rate_limit=config.api_rate_limit,
            reserved_concurrency=config.api_concurrency,
            burst_limit=config.api_burst_limit,
            caller_accounts=config.caller_accounts,
        )
        self.materialization = Materialization(
            self,
            "Materialization",
            data=data,
            defaults=defaults,
            group_size=config.shard_group_size,
            max_concurrency=config.map_concurrency,
            reserved_concurrency=config.materializer_concurrency,
        )
        self.relaying = Relaying(
            self,
            "Relay",
            data=data,
            queues=queues,
            defaults=defaults,
            parallelization_factor=config.relay_parallelization_factor,
            catchup_parallelization_factor=config.catchup_parallelization_factor,
            batching_window_seconds=config.relay_batching_window_seconds,
            reserved_concurrency=config.relay_concurrency,
            catchup_reserved_concurrency=config.catchup_concurrency,
        )
        self.reconciliation = Reconciliation(
            self,
            "Reconciliation",
            data=data,
            queues=queues,
            defaults=defaults,
            group_size=config.reconcile_group_size,
            max_concurrency=config.reconcile_concurrency,
            minute=config.reconcile_minute,
        )
        self.observability = Observability(
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
            thresholds=config.alarms,
            emails=config.alarm_emails,
            defaults=defaults,
        )
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
