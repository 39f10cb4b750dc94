"""cdk-nag's AWS Solutions checks and least privilege, read off the synthesized app."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk.assertions import Template

from infra.checks import PACK

from .conftest import Synthesized, render, resources_of


def _acknowledged(resource: Mapping[str, Any]) -> dict[str, str]:
    rules = resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])
    return {rule["id"]: rule["reason"] for rule in rules}


def test_security_aws_solutions_checks_leave_no_unacknowledged_finding(
    synthesized: Synthesized,
):
    # GIVEN the validation report the synthesis wrote (cdk-nag runs as a policy
    # validation plugin, and an error would already have stopped the synthesis)
    reports = {r["pluginName"]: r for r in synthesized.report["pluginReports"]}
    nag = reports[PACK]
    # THEN no finding is open, warnings included
    assert nag["conclusion"] == "success"
    assert nag["violations"] == [], [v["ruleName"] for v in nag["violations"]]
    # AND each acknowledged one carries a reason a reviewer can weigh
    assert nag["suppressedViolations"]
    for finding in nag["suppressedViolations"]:
        assert len(finding["reason"]) >= 60, finding["ruleName"]


def test_security_every_wildcard_resource_is_acknowledged_with_a_reason(
    synthesized: Synthesized,
):
    # GIVEN every IAM policy of both stacks
    wildcards = set()
    for template in (synthesized.data, synthesized.service):
        for logical_id, policy in template.find_resources("AWS::IAM::Policy").items():
            acknowledged = _acknowledged(policy)
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                for resource in resources_of(statement):
                    text = render(resource)
                    if "*" not in text:
                        continue
                    # THEN a resource with '*' is acknowledged by its exact finding
                    finding = f"{PACK}::{PACK}-IAM5[Resource::{text}]"
                    assert finding in acknowledged, f"{logical_id}: {text}"
                    wildcards.add(text)
    # AND the ones there are: X-Ray and stream listing ('*'), the tenant queue prefix, the
    # state machines' own function versions and the operator's API; tables and indexes are
    # named one by one (least privilege)
    assert "*" in wildcards
    assert "arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:punctual-*" in wildcards
    assert not any("dynamodb" in w for w in wildcards)


def test_security_no_function_role_uses_an_aws_managed_policy(service: Template):
    # THEN function roles have only their own inline policies; the one managed policy in
    # the stack is API Gateway's account-wide logging role's
    managed = {
        logical_id: role["Properties"]["ManagedPolicyArns"]
        for logical_id, role in service.find_resources("AWS::IAM::Role").items()
        if role["Properties"].get("ManagedPolicyArns")
    }
    assert len(managed) == 1
    ((logical_id, arns),) = managed.items()
    assert logical_id.startswith("ApiRestCloudWatchRole")
    assert render(arns[0]).endswith("policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs")


def test_security_function_roles_write_only_their_own_log_group(service: Template):
    # THEN a function may write logs to its own group, never create groups
    for function in service.find_resources("AWS::Lambda::Function").values():
        role = function["Properties"]["Role"]["Fn::GetAtt"][0]
        group = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        policies = service.find_resources(
            "AWS::IAM::Policy", {"Properties": {"Roles": [{"Ref": role}]}}
        )
        statements = [
            s for p in policies.values() for s in p["Properties"]["PolicyDocument"]["Statement"]
        ]
        logs = [s for s in statements if "logs:PutLogEvents" in s["Action"]]
        assert len(logs) == 1
        assert resources_of(logs[0]) == [{"Fn::GetAtt": [group, "Arn"]}]
        assert not any("logs:CreateLogGroup" in s["Action"] for s in statements)
