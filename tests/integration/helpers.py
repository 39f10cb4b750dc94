"""Request bodies, the error-shape check and direct table access shared by the API tests."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

from punctual.control.plane import ControlPlane
from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.domain.schedule import ScheduleDefinition
from punctual.services import Services, Wiring
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Answer, Api, Clock

ERROR_KEYS = {"code", "message", "fields", "details"}


def cron_spec(expression: str, timezone: str = "UTC") -> dict[str, Any]:
    return {"kind": "cron", "expression": expression, "timezone": timezone}


def cron(expression: str = "*/5 * * * *", timezone: str = "UTC", **extra: Any) -> dict[str, Any]:
    """A create body: a cron schedule on the default target."""
    return {"spec": cron_spec(expression, timezone), "target": "default", **extra}


def rate(expression: str = "rate(2 minutes)", **extra: Any) -> dict[str, Any]:
    return {"spec": {"kind": "rate", "expression": expression}, "target": "default", **extra}


def one_shot(at: str, timezone: str | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "at", "at": at}
    if timezone is not None:
        spec["timezone"] = timezone
    return {"spec": spec, "target": "default", **extra}


def assert_error(answer: Answer, status: int, code: str) -> dict[str, Any]:
    """The one error shape of every 4xx: {'error': {code, message, fields, details}}."""
    assert answer.status == status, answer.body
    assert set(answer.body) == {"error"}, answer.body
    error: dict[str, Any] = answer.body["error"]
    assert set(error) == ERROR_KEYS, error
    assert error["code"] == code, error
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["fields"], list)
    assert isinstance(error["details"], dict)
    return error


def make(aws: Services, tenant: str = "alice", **fields: Any) -> str:
    """Create a schedule through the control plane itself (no HTTP); its id."""
    definition = ScheduleDefinition.model_validate({"target": "default", **fields})
    return ControlPlane(aws).create(tenant, definition).schedule.schedule_id


def create(api: Api, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Create a schedule that must be accepted; the SavedOut body."""
    answer = api.post("/v1/schedules", body, **kwargs)
    assert answer.status == 201, answer.body
    saved: dict[str, Any] = answer.body
    return saved


def patch(api: Api, schedule_id: str, body: dict[str, Any], version: int | str | None) -> Answer:
    headers = {} if version is None else {"If-Match": str(version)}
    return api.call("PATCH", f"/v1/schedules/{schedule_id}", body, headers=headers)


def delete(api: Api, schedule_id: str) -> Answer:
    return api.call("DELETE", f"/v1/schedules/{schedule_id}")


def all_pages(api: Api, path: str, key: str, **query: Any) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following next_token until it runs out."""
    pages: list[list[dict[str, Any]]] = []
    token = None
    while True:
        answer = api.get(path, **query, next_token=token)
        assert answer.status == 200, answer.body
        pages.append(answer.body[key])
        token = answer.body["next_token"]
        if token is None:
            return pages
        assert len(pages) < 50, "pagination does not end"


def wire(handler: Any, services: Services, monkeypatch: Any) -> None:
    """Hand ``services`` to a Lambda handler module for one test, as the local stack does
    (Lambda builds them from the environment)."""
    wiring = Wiring()
    wiring.configure(services)
    monkeypatch.setattr(handler, "wiring", wiring)


def current_item(aws: Services, schedule_id: str) -> dict[str, Any]:
    """A schedule's CURRENT item as stored (what the stores hand out typed), to inspect."""
    found = aws.dynamodb.get_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo({"schedule_id": schedule_id, "sk": "CURRENT"}),
        ConsistentRead=True,
    )["Item"]
    return from_dynamo(found)


def set_occurrence_state(aws: Services, occurrence_id: str, state: str) -> None:
    """What the relay or a worker would do: move an occurrence to ``state`` in the table."""
    aws.dynamodb.update_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(occurrence_id)),
        UpdateExpression="SET #state = :state",
        ExpressionAttributeNames={"#state": "state"},
        ExpressionAttributeValues={":state": {"S": state}},
    )


def table_items(aws: Services, table: str) -> list[dict[str, Any]]:
    pages = aws.dynamodb.get_paginator("scan").paginate(TableName=table)
    return [item for page in pages for item in page["Items"]]


def occurrence_items(aws: Services, schedule_id: str) -> list[dict[str, Any]]:
    """The schedule's occurrence items as stored (typed attribute values)."""
    return [
        item
        for item in table_items(aws, aws.settings.occurrences_table)
        if item["schedule_id"]["S"] == schedule_id and item["sk"]["S"].startswith("OCC#")
    ]


class CountedWrites:
    """The client, counting its transactions and the write units each write costs by
    DynamoDB's rules for items up to 1 KB: 2 per action of a transaction (a condition check
    included), 1 per single write. (DynamoDB Local's ConsumedCapacity for a transaction is
    per table, not per action: it undercounts.)"""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.units: Counter[str] = Counter()
        self.transactions = 0  # TransactWriteItems calls
        self.sizes: list[int] = []  # the actions of each, in order

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name == "transact_write_items":

            def transaction(**request: Any) -> Any:
                self.transactions += 1
                self.sizes.append(len(request["TransactItems"]))
                for action in request["TransactItems"]:
                    (kind, body), *_ = action.items()
                    self.units[f"{kind} {body['TableName'].rsplit('-', 1)[-1]}"] += 2
                return attribute(**request)

            return transaction
        if name in ("put_item", "update_item", "delete_item"):

            def single(**request: Any) -> Any:
                self.units[f"{name} {request['TableName'].rsplit('-', 1)[-1]}"] += 1
                return attribute(**request)

            return single
        assert name != "batch_write_item", "count its items too"
        return attribute


def overtaken_at_commit(
    aws: Services, clock: Clock, rival: Callable[[], Any]
) -> tuple[ControlPlane, list[Any]]:
    """A control plane whose first commit is overtaken: ``rival`` runs (and commits) just
    before it. The plane, and the list that gets what ``rival`` returned."""
    faults = Faults(FaultPlan.none(), clock)
    done: list[Any] = []

    def rival_first(_: str, __: dict[str, Any]) -> None:
        if not done:
            done.append(rival())

    faults.before["transact_write_items"] = rival_first
    wired = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    return ControlPlane(wired), done
