"""The relay: the outbox stream's INSERTs to tenant queues, failures reported, never lost."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from .conftest import actions_of, render, resources_of, role_statements

HANDLER = "relay.handler.lambda_handler"


def test_relay_reads_only_occurrence_inserts_and_reports_item_failures(service: Template):
    # THEN the stream mapping filters to occurrence INSERTs, reports partial failures,
    # bisects, bounds retries and keeps what it could not deliver
    service.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "EventSourceArn": {"Ref": Match.string_like_regexp("^SsmParameterValue")},
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "BisectBatchOnFunctionError": True,
            "MaximumRetryAttempts": 10,
            "ParallelizationFactor": 10,
            "StartingPosition": "TRIM_HORIZON",
            "FilterCriteria": {
                "Filters": [
                    {
                        "Pattern": Match.serialized_json(
                            {
                                "eventName": ["INSERT"],
                                "dynamodb": {"NewImage": {"sk": {"S": [{"prefix": "OCC#"}]}}},
                            }
                        )
                    }
                ]
            },
            "DestinationConfig": {"OnFailure": {"Destination": Match.any_value()}},
        },
    )


def test_relay_on_failure_queue_is_encrypted_and_kept_two_weeks(service: Template):
    # THEN batches given up land in an SSE queue, TLS only, kept for 14 days
    service.has_resource_properties(
        "AWS::SQS::Queue", {"MessageRetentionPeriod": 14 * 86400, "SqsManagedSseEnabled": True}
    )
    service.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": [
                    Match.object_like(
                        {
                            "Effect": "Deny",
                            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                        }
                    )
                ]
            }
        },
    )


def test_relay_may_send_only_to_queues_under_the_prefix(service: Template):
    # GIVEN the relay's role
    statements = role_statements(service, HANDLER)
    sqs = [s for s in statements if any(a.startswith("sqs:") for a in actions_of(s))]
    # THEN its tenant-queue permission is SendMessage only, on punctual-* queues of this
    # account and region (the on-failure queue is the mapping's, granted separately)
    tenant = [s for s in sqs if any("punctual-*" in render(r) for r in resources_of(s))]
    assert len(tenant) == 1
    assert actions_of(tenant[0]) == ["sqs:SendMessage"]
    assert [render(r) for r in resources_of(tenant[0])] == [
        "arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:punctual-*"
    ]
    # AND no SQS statement of the relay names any queue outside those two
    for statement in sqs:
        for resource in resources_of(statement):
            text = render(resource)
            assert text.endswith(":punctual-*") or text.startswith("<RelayUndelivered")


def test_relay_reads_tenants_but_cannot_change_them(service: Template):
    # THEN the relay looks targets up in the tenants table and writes nothing there
    tenant_actions = {
        action
        for statement in role_statements(service, HANDLER)
        if any("table/punctual-tenants" in render(r) for r in resources_of(statement))
        for action in actions_of(statement)
    }
    assert "dynamodb:GetItem" in tenant_actions
    assert not {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"} & (tenant_actions)
