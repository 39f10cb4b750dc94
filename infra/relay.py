"""The relay: the occurrences stream (INSERTs of occurrence items only) -> the relay
Lambda -> tenant SQS queues; undeliverable batches end in an on-failure queue."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.data import Data
from infra.functions import python_function


class Relaying(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: Data,
        layer: lambda_.ILayerVersion,
        environment: dict[str, str],
        parallelization_factor: int,
    ) -> None:
        super().__init__(scope, construct_id)
        occurrences = data.tables["occurrences_table"]
        self.function = python_function(
            self,
            "Function",
            handler="relay.handler.lambda_handler",
            layer=layer,
            environment=environment,
            timeout=Duration.seconds(60),
            memory_mb=1024,
        )
        occurrences.grant_read_write_data(self.function)
        data.tables["tenants_table"].grant_read_data(self.function)
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["sqs:SendMessage"],
                resources=[f"arn:aws:sqs:*:*:{data.settings.queue_prefix}-*"],
            )
        )
        self.failures = sqs.Queue(
            self,
            "UndeliveredBatches",
            retention_period=Duration.days(14),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        self.function.add_event_source(
            sources.DynamoEventSource(
                occurrences,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=500,
                parallelization_factor=parallelization_factor,
                bisect_batch_on_error=True,
                retry_attempts=10,
                max_record_age=Duration.hours(6),
                report_batch_item_failures=True,
                on_failure=sources.SqsDlq(self.failures),
                filters=[
                    # The outbox: an occurrence item's INSERT. State changes and attempts
                    # never invoke the relay.
                    lambda_.FilterCriteria.filter(
                        {
                            "eventName": lambda_.FilterRule.is_equal("INSERT"),
                            "dynamodb": {
                                "NewImage": {"sk": {"S": lambda_.FilterRule.is_equal("OCC")}}
                            },
                        }
                    )
                ],
            )
        )
