"""Tenant target queues: the API creates them at run time (``<prefix>-<tenant>-<target>``
and its ``-dlq``), so the stack owns no queue, only who may touch queues under the prefix."""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.checks import acknowledge
from infra.functions import role_of


class TargetQueueAccess(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, prefix: str) -> None:
        super().__init__(scope, construct_id)
        self.prefix = prefix
        # This account and region only: a queue of the same name elsewhere is not ours.
        self.queue_arns = Stack.of(self).format_arn(service="sqs", resource=f"{prefix}-*")

    def grant(self, function: lambda_.Function, *actions: str) -> None:
        """``actions`` without the "sqs:" prefix, exactly those the function calls (as
        DynamoDB grants, tests/infrastructure/test_inventory.py holds them to the calls)."""
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=[f"sqs:{action}" for action in actions], resources=[self.queue_arns]
            )
        )
        acknowledge(
            role_of(function),
            f"IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:"
            f"{self.prefix}-*]",
            "Tenant queues are created at run time, so their names are not known at deploy "
            f"time; the pattern admits only queues under the '{self.prefix}-' prefix in this "
            "account and region, the ones Punctual creates.",
        )
