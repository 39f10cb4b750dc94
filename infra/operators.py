"""The first operator: without one, nobody can call /v1/admin after a deploy and no tenant
can ever be created. The stack makes a role that principals of the deploying account may
assume (if their own identity policy allows sts:AssumeRole on it, as an administrator's
does), and counts it among the operators."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.api import STAGE
from infra.checks import acknowledge


class OperatorRole(Construct):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.AccountRootPrincipal(),
            description="Punctual operator: onboards tenants through /v1/admin (docs/deploy.md)",
            max_session_duration=Duration.hours(1),
        )

    def allow(self, api: apigw.RestApi) -> None:
        """Every method of the API's stage, the operator routes included."""
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["execute-api:Invoke"],
                resources=[api.arn_for_execute_api(method="*", path="/v1/*", stage=STAGE)],
            )
        )
        acknowledge(
            self.role,
            "IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:"
            f"<{api.stack.get_logical_id(api.node.default_child)}>/{STAGE}/*/v1/*]",  # type: ignore[arg-type]
            "An operator calls every route of this one API (tenants, quotas, principals, "
            "reconcile reports, and the tenant routes to check them); no other API.",
        )
