"""The relay: the occurrences stream (INSERTs of occurrence items only) -> the relay
Lambda -> tenant SQS queues; a batch the mapping gives up on lands in an on-failure queue,
which the re-drive Lambda consumes: it reads the batch back from the stream and relays it
again (punctual.pipeline.redrive)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import REDRIVE_CONCURRENCY
from infra.data import DataReferences, TableGrants
from infra.functions import FunctionDefaults, inline_function, python_function
from infra.layer import ROOT
from infra.queues import TargetQueueAccess
from punctual.dal.tables import OCCURRENCE_PREFIX
from punctual.domain.occurrence import Lane
from punctual.integrations.streams import CATCHUP_WINDOW_SECONDS

# A new mapping reads the stream from its oldest record (LATEST would skip what was
# inserted while no mapping read it); the relay does not send again what was inserted and
# due before the mappings were made (relay_start).
STARTING_POSITION = lambda_.StartingPosition.TRIM_HORIZON
START_CODE = ROOT / "infra" / "start_handler.py"
REDRIVE_TIMEOUT_SECONDS = 60
# Tries of one discarded batch's re-drive before it waits in the dead-letter queue: SQS
# stops counting a message in ApproximateAgeOfOldestMessage after its third receive, so
# the alarm reads the dead-letter queue's depth instead.
REDRIVE_RECEIVES = 3
# What the relay's code calls in the tables (tests/infrastructure/inventory.txt), in either
# lane and in the re-drive: it reads the batch's occurrences and the targets' queue URLs,
# and settles an occurrence whose target is gone as DEAD.
SENDING: TableGrants = {
    ("occurrences_table", None): ("UpdateItem",),
    ("tenants_table", None): ("GetItem",),
}


class Relaying(Construct):
    """The relay's two lanes and the re-drive of the batches either lane's mapping gives up
    on. The catch-up lane (domain.occurrence.Lane) has the on-time lane's code and grants, and
    its own function, role and mapping. Both mappings read every shard of the stream, each
    at its own position, so a catch-up of any size never sits ahead of fires due now; its
    few batches at once bound the Lambda concurrency it takes."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        data: DataReferences,
        queues: TargetQueueAccess,
        defaults: FunctionDefaults,
        parallelization_factor: int,
        catchup_parallelization_factor: int,
        batching_window_seconds: int,
        reserved_concurrency: int,
        catchup_reserved_concurrency: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self._data = data
        self._queues = queues
        self._defaults = defaults
        self._occurrences = data.tables["occurrences_table"]
        self.function = self._relay_function(
            "Function", "relay.handler.lambda_handler", "occurrences", reserved_concurrency
        )
        self.dead_failures = self._dead_failure_queue()
        self.failures = self._failure_queue(self.dead_failures)
        self.redrive = self._redrive_function()
        self._add_lane(
            self.function,
            parallelization_factor,
            # The on-time lane: no lane. On the leaf (lane.S): Lambda's `exists` matches
            # leaves only, so on `lane` itself it would take every record.
            {"S": lambda_.FilterRule.not_exists()},
            # Fuller batches, fewer invocations and log lines (docs/capacity.md); what the
            # API makes due within the window it sends at once as well
            # (ControlPlane._send_promptly), and the materializer's fires come at least
            # lookahead - 115 s early (DeployConfig._window).
            # (0 written out: a property left out may keep a window deployed before)
            batching_window=Duration.seconds(batching_window_seconds),
        )
        self.catchup = self._relay_function(
            "Catchup",
            "relay.catchup.lambda_handler",
            "catch-up occurrences",
            catchup_reserved_concurrency,
        )
        self._add_lane(
            self.catchup,
            catchup_parallelization_factor,
            {"S": lambda_.FilterRule.is_equal(Lane.CATCHUP.value)},
            # Paced occurrences, receivable seconds to minutes ahead: fuller batches.
            batching_window=Duration.seconds(CATCHUP_WINDOW_SECONDS),
        )
        self.start = relay_start(self, (self.function, self.catchup))
        self._name_lanes_to_redrive()

    def _relay_function(
        self, construct_id: str, handler: str, what: str, reserved: int
    ) -> lambda_.Function:
        """One lane's relay function, allowed to send."""
        function = python_function(
            self,
            construct_id,
            handler=handler,
            defaults=self._defaults,
            # A batch of 500 is SendMessageBatch per 10 with up to 3 tries: seconds
            # normally; a minute leaves room for throttled retries before the mapping
            # retries the batch.
            timeout=Duration.seconds(60),
            # Sends run on 8 threads; more memory is more CPU for the JSON and TLS work.
            memory_mb=1024,
            description=f"Sends inserted {what} to their tenant's SQS queue",
            any_resource_reasons=(
                "dynamodb:ListStreams (the event source mapping) has no resource-level permission.",
            ),
            # A cap, below the shards x parallelization factor batches the mapping
            # could run: a throttled batch waits in the stream, retried until it is
            # 6 hours old (throttles use none of its retry attempts: Lambda's
            # "services-dynamodb-errors"), and the API and the materializer keep
            # their own reservations (DeployConfig._concurrency).
            reserved_concurrency=reserved,
        )
        self._grant_sending(function)
        return function

    def _grant_sending(self, function: lambda_.Function) -> None:
        """Exactly what the relay's code calls: SENDING's table actions, and the sends
        (SendMessageBatch is authorized as SendMessage). A lane's event source mapping adds
        its stream reads (_add_lane)."""
        self._data.grant(function, SENDING)
        self._queues.grant(function, "SendMessage")

    def _dead_failure_queue(self) -> sqs.Queue:
        """Where a batch the re-drive failed to send REDRIVE_RECEIVES times waits (alarmed:
        RelayUndelivered) for an operator to move it back once the cause is fixed
        (docs/operations.md); the stream keeps its records 24 hours."""
        return sqs.Queue(
            self,
            "UndeliveredBatchesDead",
            retention_period=Duration.days(14),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )

    def _failure_queue(self, dead: sqs.Queue) -> sqs.Queue:
        """The lanes' on-failure destination: the batches their mappings give up on, which
        the re-drive consumes."""
        return sqs.Queue(
            self,
            "UndeliveredBatches",
            retention_period=Duration.days(14),
            # At least six times the re-drive's timeout, so a running re-drive keeps it.
            visibility_timeout=Duration.seconds(6 * REDRIVE_TIMEOUT_SECONDS),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            dead_letter_queue=sqs.DeadLetterQueue(queue=dead, max_receive_count=REDRIVE_RECEIVES),
        )

    def _redrive_function(self) -> lambda_.Function:
        """The failure queue's consumer: it reads a batch back from the stream and relays
        it again."""
        stream_arn = self._occurrences.table_stream_arn
        assert stream_arn is not None, "the occurrences table is the outbox: it has a stream"
        function = python_function(
            self,
            "Redrive",
            handler="relay.redrive.lambda_handler",
            defaults=self._defaults,
            timeout=Duration.seconds(REDRIVE_TIMEOUT_SECONDS),
            memory_mb=512,
            description="Reads a stream batch the relay gave up on back and relays it again",
        )
        # The relay's own sends, and the stream read back (GetShardIterator, GetRecords).
        self._grant_sending(function)
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["dynamodb:GetShardIterator", "dynamodb:GetRecords"],
                # The occurrences table's stream, the one the relay's mapping reads.
                resources=[stream_arn],
            )
        )
        function.add_event_source(
            sources.SqsEventSource(
                self.failures,
                batch_size=1,
                report_batch_item_failures=True,
                # Unreserved: few at once (DeployConfig's arithmetic counts them).
                max_concurrency=REDRIVE_CONCURRENCY,
            )
        )
        return function

    def _add_lane(
        self,
        function: lambda_.Function,
        parallelization_factor: int,
        lane: Any,
        batching_window: Duration,
    ) -> None:
        """The event source mapping of one lane: inserted SCHEDULED occurrence items whose
        ``lane`` attribute matches ``lane`` (as punctual.integrations.streams.wanted)."""
        function.add_event_source(
            sources.DynamoEventSource(
                self._occurrences,
                starting_position=STARTING_POSITION,
                batch_size=500,
                max_batching_window=batching_window,
                # Shards of the stream are read this many batches at a time; records of
                # one occurrence stay in order because they share a partition key.
                parallelization_factor=parallelization_factor,
                bisect_batch_on_error=True,
                retry_attempts=10,
                max_record_age=Duration.hours(6),
                report_batch_item_failures=True,
                on_failure=sources.SqsDlq(self.failures),
                filters=[_outbox_inserts(lane)],
            )
        )

    def _name_lanes_to_redrive(self) -> None:
        """Which lane's batch failed: the re-drive re-sends only that lane's records."""
        self.redrive.add_environment("PUNCTUAL_RELAY_FUNCTION", self.function.function_name)
        self.redrive.add_environment("PUNCTUAL_CATCHUP_RELAY_FUNCTION", self.catchup.function_name)


def relay_start(scope: Construct, relays: tuple[lambda_.Function, ...]) -> cdk.CustomResource:
    """The instant the relays' stream mappings were made (infra/start_handler.py, inlined),
    handed to each relay function as PUNCTUAL_RELAY_STARTED_AT. Its properties name the
    mappings, so the mappings made anew (the stack re-created after a destroy, a mapping
    replaced) make a new instant; a deploy that keeps them keeps it, and the functions'
    configuration with it. (It must not refer to the mappings themselves: each function's
    environment depends on it, and each mapping on its function.)"""
    mappings = sorted(
        child.node.path
        for relay in relays
        for child in relay.node.children
        if isinstance(child, lambda_.EventSourceMapping)
    )
    function = inline_function(
        scope,
        "StartFunction",
        code=START_CODE,
        description="Answers the instant the relay's stream mappings were made",
    )
    start = cdk.CustomResource(
        scope,
        "Start",
        service_token=function.function_arn,
        resource_type="Custom::PunctualRelayStart",
        properties={"Mappings": mappings, "StartingPosition": STARTING_POSITION.value},
    )
    for relay in relays:
        relay.add_environment("PUNCTUAL_RELAY_STARTED_AT", start.get_att_string("StartedAt"))
    return start


def _outbox_inserts(lane: Any) -> Mapping[str, Any]:
    """The outbox: an occurrence item's INSERT, in ``lane``. State changes and attempts
    never invoke the relay."""
    return lambda_.FilterCriteria.filter(
        {
            "eventName": lambda_.FilterRule.is_equal("INSERT"),
            "dynamodb": {
                "NewImage": {
                    "sk": {"S": lambda_.FilterRule.begins_with(OCCURRENCE_PREFIX)},
                    # Inserted SCHEDULED: a repair's MISSED record is not sent.
                    "state": {"S": lambda_.FilterRule.is_equal("SCHEDULED")},
                    "lane": lane,
                }
            },
        }
    )
