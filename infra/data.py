"""The tables, built from the same definitions the code and the tests use.

`Data` owns them (the stateful stack); `DataReferences` names them for the functions (the
stateless stack). The stateless side finds each table by its fixed name and the outbox
stream through an SSM parameter, so no CloudFormation export ties the two stacks together:
either can be redeployed on its own, and removing a use of a table never blocks a deploy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aws_cdk as cdk
from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from infra.functions import inline_function, role_of
from infra.layer import ROOT
from punctual.dal.tables import ALL_TABLES, DUE_INDEX, OCCURRENCES, SCHEDULES, TableSpec
from punctual.settings import Settings

WARMED = (SCHEDULES, OCCURRENCES)
GUARD_CODE = ROOT / "infra" / "guard_handler.py"
_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER}


def stream_parameter_name(spec: TableSpec, settings: Settings) -> str:
    return f"/{spec.name(settings)}/stream-arn"


def _attribute(key: tuple[str, str]) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=key[0], type=_TYPES[key[1]])


class Data(Construct):
    """On-demand tables with point-in-time recovery; streams and TTL where the spec says."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        retain: bool,
        deletion_protection: bool,
        warm_write_units: int = 0,
    ) -> None:
        super().__init__(scope, construct_id)
        self.settings = settings
        self.warm = (
            dynamodb.WarmThroughput(write_units_per_second=warm_write_units)
            if warm_write_units
            else None
        )
        self.tables: dict[str, dynamodb.Table] = {}
        for spec in ALL_TABLES:
            table = self._table(spec, retain, deletion_protection)
            self.tables[spec.setting] = table
            if spec.stream:
                # A stream's ARN changes whenever the stream is re-enabled; the stateless
                # stack reads it from here at each deploy.
                ssm.StringParameter(
                    self,
                    f"{table.node.id}StreamArn",
                    parameter_name=stream_parameter_name(spec, settings),
                    string_value=str(table.table_stream_arn),
                    description=f"Stream of {spec.name(settings)}: the outbox the relay reads",
                )
        ShardCountGuard(
            self, "ShardCountGuard", table=self.tables["leases_table"], count=settings.shard_count
        )

    def _table(self, spec: TableSpec, retain: bool, deletion_protection: bool) -> dynamodb.Table:
        table = dynamodb.Table(
            self,
            spec.setting.removesuffix("_table").title(),
            table_name=spec.name(self.settings),
            partition_key=_attribute(spec.pk),
            sort_key=_attribute(spec.sk) if spec.sk else None,
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=spec.ttl_attribute,
            stream=dynamodb.StreamViewType.NEW_IMAGE if spec.stream else None,
            deletion_protection=deletion_protection,
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
            # The tables the top-of-hour peak writes (a step's transaction, its occurrence).
            warm_throughput=self.warm if spec in WARMED else None,
        )
        for index in spec.indexes:
            table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attribute(index.pk),
                sort_key=_attribute(index.sk),
                projection_type=dynamodb.ProjectionType(index.projection),
                non_key_attributes=list(index.include) if index.include else None,
                # (the due index: each step moves its schedule from one bucket to the next)
                warm_throughput=self.warm if index.name == DUE_INDEX else None,
            )
        return table


class ShardCountGuard(Construct):
    """Fails a deploy whose shard count is below the largest ever deployed (its code:
    infra/guard_handler.py, inlined), so CloudFormation rolls it back."""

    def __init__(
        self, scope: Construct, construct_id: str, *, table: dynamodb.Table, count: int
    ) -> None:
        super().__init__(scope, construct_id)
        # (The function keeps its construct id: CloudFormation refuses to change a custom
        # resource's service token, the function's ARN.)
        function = inline_function(
            self,
            "Function",
            code=GUARD_CODE,
            description="Refuses a deploy with fewer shards than deployed before",
        )
        role_of(function).add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:UpdateItem", "dynamodb:GetItem"], resources=[table.table_arn]
            )
        )
        cdk.CustomResource(
            self,
            "Count",
            service_token=function.function_arn,
            resource_type="Custom::PunctualShardCount",
            properties={"ShardCount": count, "Table": table.table_name},
        )


# A function's DynamoDB access: (table setting, index name or None for the table itself) ->
# the actions its code calls there, without the "dynamodb:" prefix. Each function lists exactly
# what it calls: tests/infrastructure/inventory.txt records the calls while the integration
# tests run, and test_inventory.py fails on a call without a grant or a grant without a call.
TableGrants = Mapping[tuple[str, str | None], Sequence[str]]


class DataReferences(Construct):
    """The tables as the functions see them: by name, with their indexes and stream."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings) -> None:
        super().__init__(scope, construct_id)
        self.settings = settings
        self.tables: dict[str, dynamodb.ITable] = {}
        for spec in ALL_TABLES:
            stream_arn = (
                ssm.StringParameter.value_for_string_parameter(
                    self, stream_parameter_name(spec, settings)
                )
                if spec.stream
                else None
            )
            self.tables[spec.setting] = dynamodb.Table.from_table_attributes(
                self,
                spec.setting.removesuffix("_table").title(),
                table_name=spec.name(settings),
                table_stream_arn=stream_arn,
                global_indexes=[index.name for index in spec.indexes] or None,
            )

    def environment(self) -> dict[str, str]:
        """The PUNCTUAL_* variables every function reads its table names from."""
        return {f"PUNCTUAL_{spec.setting.upper()}": spec.name(self.settings) for spec in ALL_TABLES}

    def grant(self, function: lambda_.Function, grants: TableGrants) -> None:
        """One statement per table or index: its ARN (no wildcard), the listed actions."""
        for (setting, index), actions in grants.items():
            spec = next(spec for spec in ALL_TABLES if spec.setting == setting)
            if index is not None and index not in {i.name for i in spec.indexes}:
                raise ValueError(f"{spec.name(self.settings)} has no index {index}")
            arn = self.tables[setting].table_arn
            function.add_to_role_policy(
                iam.PolicyStatement(
                    actions=[f"dynamodb:{action}" for action in actions],
                    resources=[arn if index is None else f"{arn}/index/{index}"],
                )
            )
