"""The relay: the occurrences stream (INSERTs of occurrence items only) -> the relay
Lambda -> tenant SQS queues; undeliverable batches end in an on-failure queue."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.checks import acknowledge
from infra.data import DataReferences
from infra.functions import FunctionDefaults, python_function
from infra.queues import TargetQueueAccess
from punctual.dal.tables import OCCURRENCE_PREFIX


class Relaying(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataReferences,
        queues: TargetQueueAccess,
        defaults: FunctionDefaults,
        parallelization_factor: int,
    ) -> None:
        super().__init__(scope, construct_id)
        occurrences = data.tables["occurrences_table"]
        self.function = python_function(
            self,
            "Function",
            handler="relay.handler.lambda_handler",
            defaults=defaults,
            # A batch of 500 is one BatchGetItem per 100, SendMessageBatch per 10 with up
            # to 3 tries: seconds normally, a minute
            # leaves room for throttled retries before the mapping retries the batch.
            timeout=Duration.seconds(60),
            # Sends run on 8 threads; more memory is more CPU for the JSON and TLS work.
            memory_mb=1024,
            description="Sends inserted occurrences to their tenant's SQS queue",
            any_resource_reasons=(
                "dynamodb:ListStreams (the event source mapping) has no resource-level permission.",
            ),
        )
        # Exactly what the relay's code calls (tests/infrastructure/inventory.txt): it reads
        # the batch's occurrences and the targets' queue URLs, settles an occurrence whose
        # target is gone as DEAD, and sends (SendMessageBatch is authorized as SendMessage).
        # The event source mapping adds its stream reads below.
        data.grant(
            self.function,
            {
                ("occurrences_table", None): ("BatchGetItem", "UpdateItem"),
                ("tenants_table", None): ("GetItem",),
            },
        )
        queues.grant(self.function, "SendMessage")
        self.failures = sqs.Queue(
            self,
            "UndeliveredBatches",
            retention_period=Duration.days(14),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        acknowledge(
            self.failures,
            "SQS3",
            "This queue is itself the relay's on-failure destination: it holds the stream "
            "positions of batches given up, for an operator to replay; nothing consumes it.",
        )
        self.function.add_event_source(
            sources.DynamoEventSource(
                occurrences,
                starting_position=lambda_.StartingPosition.TRIM_HORIZON,
                batch_size=500,
                # Shards of the stream are read this many batches at a time; records of
                # one occurrence stay in order because they share a partition key.
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
                                "NewImage": {
                                    "sk": {"S": lambda_.FilterRule.begins_with(OCCURRENCE_PREFIX)}
                                }
                            },
                        }
                    )
                ],
            )
        )
