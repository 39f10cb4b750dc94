"""The first operator: a role of the deploying account, counted among the operators."""

from __future__ import annotations

from aws_cdk.assertions import Template

from .conftest import render

API = "api.handler.lambda_handler"


def test_operators_the_stack_makes_an_operator_role_the_api_accepts(service: Template):
    # GIVEN the operator role the stack creates
    roles = {
        logical_id: role
        for logical_id, role in service.find_resources("AWS::IAM::Role").items()
        if logical_id.startswith("OperatorRole")
    }
    ((logical_id, role),) = roles.items()
    # THEN principals of the deploying account may assume it (their own policy permitting)
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Action"] == "sts:AssumeRole"
    assert render(trust["Principal"]["AWS"]) == "arn:<AWS::Partition>:iam::<AWS::AccountId>:root"
    # AND it may call every route of this API's stage, nothing else
    policies = service.find_resources(
        "AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": logical_id}]}}
    )
    (statement,) = next(iter(policies.values()))["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "execute-api:Invoke"
    (api,) = service.find_resources("AWS::ApiGateway::RestApi")
    assert render(statement["Resource"]) == (
        f"arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:<{api}>/prod/*/v1/*"
    )
    # AND the API counts it among the operators, before the configured ones
    (function,) = service.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": API}}
    ).values()
    operators = render(
        function["Properties"]["Environment"]["Variables"]["PUNCTUAL_OPERATOR_PRINCIPALS"]
    )
    assert operators == f"<{logical_id}.Arn>,arn:aws:iam::123456789012:role/punctual-operator"
    # AND the stack outputs its ARN for the first deploy's onboarding
    service.has_output("OperatorRoleArn", {"Value": {"Fn::GetAtt": [logical_id, "Arn"]}})
