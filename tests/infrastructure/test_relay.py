"""The relay: the outbox stream's INSERTs to tenant queues, failures reported, never lost."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from .conftest import actions_of, render, resources_of, role_statements

HANDLER = "relay.handler.lambda_handler"


def test_relay_reads_only_occurrence_inserts_and_reports_item_failures(service: Template):
    # THEN the stream mapping filters to occurrence INSERTs made SCHEDULED (a repair's
    # MISSED record is never sent), reports partial failures,
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
                                "dynamodb": {
                                    "NewImage": {
                                        "sk": {"S": [{"prefix": "OCC#"}]},
                                        "state": {"S": ["SCHEDULED"]},
                                    }
                                },
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


def test_relay_on_failure_queue_is_consumed_by_the_redrive_one_message_at_a_time(
    service: Template,
):
    # THEN the re-drive function polls the on-failure queue, one message per invocation,
    # reporting a message it could not send again as failed (SQS keeps it and retries)
    queue = next(
        iter(
            service.find_resources(
                "AWS::SQS::Queue", {"Properties": {"MessageRetentionPeriod": 14 * 86400}}
            )
        )
    )
    service.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
            "BatchSize": 1,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
        },
    )
    # AND the queue hides a message being re-driven for longer than the re-drive can run
    redrive = next(
        f["Properties"]
        for f in service.find_resources("AWS::Lambda::Function").values()
        if f["Properties"]["Handler"] == "relay.redrive.lambda_handler"
    )
    visibility = service.find_resources("AWS::SQS::Queue")[queue]["Properties"]["VisibilityTimeout"]
    assert visibility >= 6 * redrive["Timeout"]
    # AND it reads the stream back only from the occurrences table's stream
    reads = [
        s
        for s in role_statements(service, "relay.redrive.lambda_handler")
        if "dynamodb:GetRecords" in actions_of(s)
    ]
    assert len(reads) == 1
    assert sorted(actions_of(reads[0])) == ["dynamodb:GetRecords", "dynamodb:GetShardIterator"]
    [stream_mapping] = service.find_resources(
        "AWS::Lambda::EventSourceMapping",
        {"Properties": {"FunctionName": {"Ref": Match.string_like_regexp("^RelayFunction")}}},
    ).values()
    assert [render(r) for r in resources_of(reads[0])] == [
        render(stream_mapping["Properties"]["EventSourceArn"])
    ]


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
