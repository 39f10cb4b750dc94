"""The relay: the outbox stream's INSERTs to tenant queues, failures reported, never lost."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aws_cdk.assertions import Match, Template

from infra.offline import cdk_json_context, synthesize
from infra.relay import START_CODE
from punctual.domain.occurrence import Lane
from punctual.integrations.streams import wanted

from .conftest import actions_of, function_id, render, resources_of, role_statements

HANDLER = "relay.handler.lambda_handler"
CATCHUP_HANDLER = "relay.catchup.lambda_handler"


def _stream_mappings(service: Template) -> dict[str, dict[str, Any]]:
    """The outbox stream's mappings by their function's handler."""
    functions = service.find_resources("AWS::Lambda::Function")
    return {
        functions[m["Properties"]["FunctionName"]["Ref"]]["Properties"]["Handler"]: m["Properties"]
        for m in service.find_resources("AWS::Lambda::EventSourceMapping").values()
        if "StartingPosition" in m["Properties"]
    }


def _matches(pattern: Any, value: Any, present: bool = True) -> bool:
    """Lambda's event filtering, the rules these patterns use: a list of literals or
    {"prefix"} / {"exists"} rules for a leaf, a dict for a nested object. `exists` is
    judged on leaves only: an object at its path counts as no value (AWS's rule)."""
    if isinstance(pattern, dict):
        fields = value if present and isinstance(value, dict) else {}
        return all(_matches(p, fields.get(k), k in fields) for k, p in pattern.items())
    leaf = present and not isinstance(value, dict | list)
    for rule in pattern:
        if isinstance(rule, dict) and "exists" in rule:
            if rule["exists"] == leaf:
                return True
        elif isinstance(rule, dict) and "prefix" in rule:
            if present and isinstance(value, str) and value.startswith(rule["prefix"]):
                return True
        elif present and value == rule:
            return True
    return False


def test_relay_lanes_read_only_their_occurrence_inserts_and_report_item_failures(
    service: Template,
):
    mappings = _stream_mappings(service)
    # THEN two mappings read the outbox stream, the on-time lane's and the catch-up lane's
    assert set(mappings) == {HANDLER, CATCHUP_HANDLER}
    for mapping in mappings.values():
        # AND each reports partial failures, bisects, bounds retries and keeps what it could
        # not deliver (in the one on-failure queue the re-drive reads)
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert mapping["BisectBatchOnFunctionError"] is True
        assert mapping["MaximumRetryAttempts"] == 10
        assert mapping["StartingPosition"] == "TRIM_HORIZON"
        assert "OnFailure" in mapping["DestinationConfig"]
    # AND the catch-up lane takes few batches per shard at once (bounded concurrency), the
    # on-time lane the most
    assert mappings[HANDLER]["ParallelizationFactor"] == 10
    assert mappings[CATCHUP_HANDLER]["ParallelizationFactor"] == 2
    assert mappings[CATCHUP_HANDLER]["MaximumBatchingWindowInSeconds"] == 5
    # ... the on-time lane's window is the deploy's (2 s by default): what the API makes due
    # sooner it sends itself (test_prompt_send.py)
    assert mappings[HANDLER]["MaximumBatchingWindowInSeconds"] == 2
    # AND their filters, as Lambda evaluates them, pass exactly the records each lane's
    # code (punctual.integrations.streams.wanted, the local pollers and the re-drive) takes
    # among: occurrence inserts of both lanes, a forged lane, a MISSED record, an attempt
    # item and a modification; each occurrence insert reaches exactly one lane
    patterns = {
        handler: [json.loads(f["Pattern"]) for f in mapping["FilterCriteria"]["Filters"]]
        for handler, mapping in mappings.items()
    }

    def record(event: str = "INSERT", sk: str = "OCC#1", state: str = "SCHEDULED", **more):
        image = {"sk": {"S": sk}, "state": {"S": state}} | more
        return {"eventName": event, "dynamodb": {"NewImage": image}}

    catchup = {"S": Lane.CATCHUP.value}
    records = {
        "on time": record(),
        "catch-up": record(lane=catchup),
        "forged lane": record(lane={"S": "FAST"}),
        "forged lane type": record(lane={"N": "1"}),
        "missed": record(state="MISSED"),
        "catch-up missed": record(state="MISSED", lane=catchup),
        "attempt": record(sk="ATT#1"),
        "modified": record(event="MODIFY"),
    }
    lanes = {HANDLER: None, CATCHUP_HANDLER: Lane.CATCHUP.value}
    sent = {}
    for name, event in records.items():
        sent[name] = {
            handler
            for handler, filters in patterns.items()
            if any(_matches(p, event) for p in filters)
        }
        by_code = {
            handler
            for handler, lane in lanes.items()
            if wanted(event, lane) and event["dynamodb"]["NewImage"]["state"]["S"] == "SCHEDULED"
        }
        assert sent[name] == by_code, name
    assert sent["on time"] == {HANDLER}
    assert sent["catch-up"] == {CATCHUP_HANDLER}
    assert sent["forged lane type"] == {HANDLER}  # a tenant's own item: its own queue
    others = ("on time", "catch-up", "forged lane type")
    assert not any(sent[n] for n in records if n not in others)


def test_relay_catchup_lane_runs_the_relays_code_under_its_role(service: Template):
    functions = {
        f["Properties"]["Handler"]: f["Properties"]
        for f in service.find_resources("AWS::Lambda::Function").values()
    }
    # THEN the catch-up lane's function is the relay's code with a role of its own that
    # grants exactly what the relay's grants (what the call inventory checks for the relay),
    # its own log group and mapping aside, with the same limits
    relay, catchup = functions[HANDLER], functions[CATCHUP_HANDLER]
    assert catchup["Role"] != relay["Role"]

    def grants(handler: str) -> set[tuple[str, str]]:
        own = re.compile(r"<Relay(Function|Catchup)(Logs)?\w*\.Arn>")
        return {
            (action, own.sub("<own>", render(resource)))
            for statement in role_statements(service, handler)
            for action in actions_of(statement)
            for resource in resources_of(statement)
        }

    assert grants(CATCHUP_HANDLER) == grants(HANDLER)
    assert any(action == "sqs:SendMessage" for action, _ in grants(CATCHUP_HANDLER))
    assert (catchup["Timeout"], catchup["MemorySize"]) == (relay["Timeout"], relay["MemorySize"])
    # AND the re-drive knows it by name, to re-send only the failed lane's records
    variables = functions["relay.redrive.lambda_handler"]["Environment"]["Variables"]
    assert variables["PUNCTUAL_CATCHUP_RELAY_FUNCTION"] == {
        "Ref": function_id(service, CATCHUP_HANDLER)
    }
    assert variables["PUNCTUAL_RELAY_FUNCTION"] == {"Ref": function_id(service, HANDLER)}


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


def _on_failure_queue(service: Template) -> str:
    """The logical id of the relay's on-failure queue (the one with a dead-letter queue)."""
    [queue] = service.find_resources(
        "AWS::SQS::Queue", {"Properties": {"RedrivePolicy": Match.any_value()}}
    )
    return queue


def test_relay_on_failure_queue_gives_up_after_three_redrives_into_an_alarmed_dlq(
    service: Template,
):
    # GIVEN the on-failure queue
    queues = service.find_resources("AWS::SQS::Queue")
    policy = queues[_on_failure_queue(service)]["Properties"]["RedrivePolicy"]
    # THEN a batch the re-drive failed 3 times moves to its dead-letter queue (SQS stops
    # counting a message in its age metric after the third receive: an alarm on the age
    # could never fire), kept 14 days
    assert policy["maxReceiveCount"] == 3
    dead = policy["deadLetterTargetArn"]["Fn::GetAtt"][0]
    assert queues[dead]["Properties"]["MessageRetentionPeriod"] == 14 * 86400
    # AND RelayUndelivered alarms on one message there, RedriveFailures on each failed try
    alarms = {
        a["Properties"]["AlarmName"]: a["Properties"]
        for a in service.find_resources("AWS::CloudWatch::Alarm").values()
    }
    [undelivered] = [a for name, a in alarms.items() if name.endswith("RelayUndelivered")]
    assert undelivered["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert undelivered["Dimensions"][0]["Value"]["Fn::GetAtt"][0] == dead
    assert (undelivered["Threshold"], undelivered["ComparisonOperator"]) == (
        0,
        "GreaterThanThreshold",
    )
    [failures] = [a for name, a in alarms.items() if name.endswith("RedriveFailures")]
    assert (failures["MetricName"], failures["Threshold"]) == ("RedriveFailures", 0)


def test_relay_on_failure_queue_is_consumed_by_the_redrive_one_message_at_a_time(
    service: Template,
):
    # THEN the re-drive function polls the on-failure queue, one message per invocation,
    # reporting a message it could not send again as failed (SQS keeps it and retries)
    queue = _on_failure_queue(service)
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


def _start_resource(service: Template) -> tuple[str, dict[str, Any]]:
    [(name, start)] = service.find_resources("Custom::PunctualRelayStart").items()
    return name, start["Properties"]


def test_relay_lanes_know_when_their_mappings_were_made(service: Template):
    # GIVEN the relay's start resource
    name, start = _start_resource(service)
    functions = service.find_resources("AWS::Lambda::Function")
    # THEN both lanes read its instant, and the re-drive (which re-sends batches the
    # mappings gave up on, whenever) does not
    started = {
        f["Properties"]["Handler"]: f["Properties"]["Environment"]["Variables"].get(
            "PUNCTUAL_RELAY_STARTED_AT"
        )
        for f in functions.values()
        if f["Properties"]["Handler"].startswith("relay.")
    }
    instant = {"Fn::GetAtt": [name, "StartedAt"]}
    assert started == {
        HANDLER: instant,
        CATCHUP_HANDLER: instant,
        "relay.redrive.lambda_handler": None,
    }
    # AND its properties name both stream mappings (made anew, they make a new instant),
    # which start at the stream's oldest record
    assert start["StartingPosition"] == "TRIM_HORIZON"
    assert {m["StartingPosition"] for m in _stream_mappings(service).values()} == {"TRIM_HORIZON"}
    assert len(start["Mappings"]) == 2
    assert all(
        re.fullmatch(r"Punctual/Relay/(Function|Catchup)/DynamoDBEventSource:.+", p)
        for p in start["Mappings"]
    )
    # AND its handler is infra/start_handler.py as it is, inlined
    token = start["ServiceToken"]["Fn::GetAtt"][0]
    assert functions[token]["Properties"]["Code"]["ZipFile"] == START_CODE.read_text(
        encoding="utf-8"
    )


def test_relay_start_stays_through_a_deploy_with_other_settings(service: Template, tmp_path: Path):
    # GIVEN a second synthesis with other settings (shards, caps, windows)
    assembly = synthesize(
        str(tmp_path),
        {
            **cdk_json_context(),
            "punctual": '{"shard_count": 256, "relay_concurrency": 200, '
            '"relay_batching_window_seconds": 0, "shard_group_size": 16, '
            '"reconcile_group_size": 4}',
        },
    )
    other = Template.from_json(assembly.get_stack_by_name("Punctual").template)
    # THEN its start resource is the same, with the same properties: CloudFormation does
    # not update it, so the instant stays and the relays' replay rule with it
    assert _start_resource(other) == _start_resource(service)
