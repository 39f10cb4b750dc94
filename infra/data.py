"""The tables, built from the same definitions the code and the tests use."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from punctual.dal.tables import ALL_TABLES, TableSpec
from punctual.settings import Settings

_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER}


def _attribute(key: tuple[str, str]) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=key[0], type=_TYPES[key[1]])


class Data(Construct):
    """On-demand tables with point-in-time recovery; streams and TTL where the spec says."""

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: Settings, retain: bool
    ) -> None:
        super().__init__(scope, construct_id)
        self.settings = settings
        self.tables: dict[str, dynamodb.Table] = {}
        for spec in ALL_TABLES:
            self.tables[spec.setting] = self._table(spec, retain)

    def _table(self, spec: TableSpec, retain: bool) -> dynamodb.Table:
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
            deletion_protection=retain,
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
        )
        for index in spec.indexes:
            table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attribute(index.pk),
                sort_key=_attribute(index.sk),
                projection_type=dynamodb.ProjectionType.ALL,
            )
        return table

    def environment(self) -> dict[str, str]:
        """The PUNCTUAL_* variables every function reads its table names from."""
        return {
            f"PUNCTUAL_{spec.setting.upper()}": self.tables[spec.setting].table_name
            for spec in ALL_TABLES
        }
