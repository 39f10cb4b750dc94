"""AWS's failure modes, injected around real boto3 clients (moto or DynamoDB Local).

The local engines are kinder than AWS: strongly consistent, never throttled, never failing a
call that succeeded. This layer wraps a client and, by a seeded plan, makes it behave as
AWS documents it can:

- eventually consistent reads (GetItem, BatchGetItem, Query, on the table or an index)
  return each item as it stood up to ``stale_seconds`` ago: a recent write is missing, or
  an item still shows its old image (in its old index partition, too);
- throttling (``ThrottlingException``, ``ProvisionedThroughputExceededException``) before
  the call runs;
- transactions cancelled by a conflict with another transaction (nothing written);
- a timeout after the write committed: the SDK retries the same request, which then meets
  its own write (a transaction with a ``ClientRequestToken`` is answered from the token, as
  DynamoDB does for 10 minutes); or no retry is left and the caller gets the error;
- SQS batch sends with failed entries, sends that fail before any message went in (no
  answer: a connection that timed out), and sends that time out after the messages went in.

It wraps clients, not the business logic: the code under test runs unchanged. Every fault
injected is counted by kind (``injected``) so a run can say what it survived.
"""

from __future__ import annotations

import copy
import operator
import random
import re
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from email.utils import formatdate
from typing import Any

from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

Clock = Callable[[], float]
Hook = Callable[[str, dict[str, Any]], None]

_WRITES = ("put_item", "update_item", "delete_item")
_READS = ("get_item", "batch_get_item", "query")


def client_error(code: str, operation: str, message: str = "injected") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


def _timeout() -> ReadTimeoutError:
    return ReadTimeoutError(endpoint_url="https://injected.local")


@dataclass
class FaultPlan:
    """Probabilities per call (0..1) and the staleness of eventually consistent reads."""

    throttle: float = 0.0
    conflict: float = 0.0  # TransactWriteItems cancelled with TransactionConflict
    replayed: float = 0.0  # committed, response lost, the SDK sent it again
    lost_response: float = 0.0  # committed, response lost, no retry left: the caller errs
    stale: float = 0.0  # an eventually consistent read is served stale
    stale_seconds: float = 0.0
    index_lag: float = 0.0  # a query on a global secondary index is served far behind
    index_lag_seconds: float = 0.0
    send_failure: float = 0.0  # an SQS batch entry fails (not sent)
    send_timeout: float = 0.0  # an SQS batch went in but the call errs
    send_error: float = 0.0  # an SQS batch call errs before any message went in

    @classmethod
    def none(cls) -> FaultPlan:
        return cls()


@dataclass
class Faults:
    """What every wrapped client of one run shares: the plan, a seeded RNG, the clock, the
    count of faults injected, and optional hooks called before an operation."""

    plan: FaultPlan
    clock: Clock
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    injected: Counter[str] = field(default_factory=Counter)
    before: dict[str, Hook] = field(default_factory=dict)
    enabled: bool = True
    # How far the servers' clock (the Date of DynamoDB's answers) is ahead of ``clock``: a
    # fraction of a second makes a measure's truncation and resolution matter.
    server_ahead: float = 0.0

    def roll(self, probability: float, kind: str) -> bool:
        if self.enabled and probability > 0 and self.rng.random() < probability:
            self.injected[kind] += 1
            return True
        return False


def _key_text(table: str, key: dict[str, Any]) -> str:
    return table + "|" + repr(sorted((k, repr(v)) for k, v in key.items()))


class FaultyDynamoDB:
    """A DynamoDB client that fails, throttles and serves stale reads as AWS may."""

    def __init__(self, real: Any, faults: Faults) -> None:
        self._real = real
        self._faults = faults
        self._keys: dict[str, list[str]] = {}  # table -> key attribute names
        self._sorts: dict[tuple[str, str | None], str | None] = {}  # (table, index) -> sort key
        # table|key -> [(written_at, image before that write or None)], oldest first; only
        # writes younger than stale_seconds are kept (older ones no read can be served from)
        self._history: dict[str, list[tuple[float, dict[str, Any] | None]]] = {}
        self._recent: deque[tuple[float, str]] = deque()
        self._tokens: dict[str, Any] = {}

    @property
    def real(self) -> Any:
        return self._real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    # --- the wrapped operations ------------------------------------------------------------

    def get_item(self, **request: Any) -> Any:
        self._before("get_item", request)
        answer = self._dated(self._real.get_item(**request))
        if request.get("ConsistentRead") or not self._stale():
            return answer
        image = self._as_of(request["TableName"], request["Key"], answer.get("Item"))
        return {k: v for k, v in answer.items() if k != "Item"} | ({"Item": image} if image else {})

    def batch_get_item(self, **request: Any) -> Any:
        self._before("batch_get_item", request)
        answer = self._dated(self._real.batch_get_item(**request))
        responses = answer.get("Responses", {})
        for table, part in request["RequestItems"].items():
            if part.get("ConsistentRead") or not self._stale():
                continue
            keys = self._key_names(table)
            found = {_key_text(table, {k: i[k] for k in keys}): i for i in responses.get(table, [])}
            served = []
            for key in part["Keys"]:
                image = self._as_of(table, key, found.get(_key_text(table, key)))
                if image is not None:
                    served.append(self._project(image, part))
            responses[table] = served
        return answer

    def query(self, **request: Any) -> Any:
        self._before("query", request)
        answer = self._dated(self._real.query(**request))
        lag = self._faults.plan.stale_seconds
        if "IndexName" in request and self._faults.roll(self._faults.plan.index_lag, "index_lag"):
            lag = self._faults.plan.index_lag_seconds  # an index's propagation, far behind
        elif request.get("ConsistentRead") or not self._stale():
            return answer
        answer["Items"] = self._stale_page(request, answer["Items"], lag)
        answer["Count"] = len(answer["Items"])
        return answer

    def put_item(self, **request: Any) -> Any:
        return self._write("put_item", request, [(request["TableName"], self._item_key(request))])

    def update_item(self, **request: Any) -> Any:
        return self._write("update_item", request, [(request["TableName"], request["Key"])])

    def delete_item(self, **request: Any) -> Any:
        return self._write("delete_item", request, [(request["TableName"], request["Key"])])

    def transact_write_items(self, **request: Any) -> Any:
        token = request.get("ClientRequestToken")
        if token is not None and token in self._tokens:
            return self._tokens[token]  # DynamoDB answers a repeated token from its record
        keys = []
        for action in request["TransactItems"]:
            (kind, body), *_ = action.items()
            keys.append((body["TableName"], self._item_key(body) if kind == "Put" else body["Key"]))
        if self._faults.roll(self._faults.plan.conflict, "transaction_conflict"):
            self._before("transact_write_items", request)
            raise self._cancelled(len(keys))
        answer = self._write("transact_write_items", request, keys)
        if token is not None:
            self._tokens[token] = answer
        return answer

    def get_paginator(self, operation: str) -> Any:
        if operation in ("query", "scan"):
            return _Paginator(getattr(self, operation))
        return self._real.get_paginator(operation)

    # --- helpers ---------------------------------------------------------------------------

    def _dated(self, answer: Any) -> Any:
        """The answer's Date header by the servers' clock (the run's true one, plus
        ``server_ahead``; each component runs its own, skewed, one and measures the skew
        between the two from these: punctual.skew)."""
        headers = answer.setdefault("ResponseMetadata", {}).setdefault("HTTPHeaders", {})
        headers["date"] = formatdate(self._faults.clock() + self._faults.server_ahead, usegmt=True)
        return answer

    def _before(self, operation: str, request: dict[str, Any]) -> None:
        hook = self._faults.before.get(operation)
        if hook is not None:
            hook(operation, request)
        if self._faults.roll(self._faults.plan.throttle, "throttled"):
            code = self._faults.rng.choice(
                ["ThrottlingException", "ProvisionedThroughputExceededException"]
            )
            raise client_error(code, operation)

    def _write(self, operation: str, request: dict[str, Any], keys: list[tuple[str, Any]]) -> Any:
        self._before(operation, request)
        tracking = self._faults.plan.stale > 0 or self._faults.plan.index_lag > 0
        olds = self._images(keys) if tracking else []
        answer = self._dated(getattr(self._real, operation)(**request))
        if tracking:
            now = self._faults.clock()
            self._forget(now)
            for (table, key), old in zip(keys, olds, strict=True):
                text = _key_text(table, key)
                self._history.setdefault(text, []).append((now, old))
                self._recent.append((now, text))
        if self._faults.roll(self._faults.plan.replayed, "replayed_after_commit"):
            # The response was lost and the SDK sent the same request again: it now meets
            # its own write (conditions fail) unless a ClientRequestToken answers for it.
            token = request.get("ClientRequestToken")
            if token is None:
                return self._dated(getattr(self._real, operation)(**request))
            self._tokens[token] = answer
        if self._faults.roll(self._faults.plan.lost_response, "lost_response"):
            raise _timeout()
        return answer

    def _forget(self, now: float) -> None:
        plan = self._faults.plan
        horizon = now - max(plan.stale_seconds, plan.index_lag_seconds)
        while self._recent and self._recent[0][0] <= horizon:
            written_at, text = self._recent.popleft()
            history = self._history.get(text, [])
            while history and history[0][0] <= written_at:
                history.pop(0)
            if not history:
                self._history.pop(text, None)

    def _cancelled(self, actions: int) -> ClientError:
        error = client_error("TransactionCanceledException", "TransactWriteItems")
        error.response["CancellationReasons"] = [{"Code": "TransactionConflict"}] * actions
        return error

    def _stale(self) -> bool:
        return self._faults.roll(self._faults.plan.stale, "stale_read")

    def _key_names(self, table: str) -> list[str]:
        if table not in self._keys:
            schema = self._real.describe_table(TableName=table)["Table"]["KeySchema"]
            self._keys[table] = [k["AttributeName"] for k in schema]
        return self._keys[table]

    def _item_key(self, body: dict[str, Any]) -> dict[str, Any]:
        return {k: body["Item"][k] for k in self._key_names(body["TableName"])}

    def _images(self, keys: list[tuple[str, Any]]) -> list[dict[str, Any] | None]:
        """The items as they are before a write, one consistent BatchGetItem."""
        if len(keys) == 1:
            table, key = keys[0]
            return [self._real.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")]
        request: dict[str, Any] = {}
        for table, key in keys:
            part = request.setdefault(table, {"Keys": [], "ConsistentRead": True})
            if key not in part["Keys"]:
                part["Keys"].append(key)
        found: dict[str, dict[str, Any]] = {}
        while request:
            answer = self._real.batch_get_item(RequestItems=request)
            for table, items in answer["Responses"].items():
                names = self._key_names(table)
                for item in items:
                    found[_key_text(table, {k: item[k] for k in names})] = item
            request = answer.get("UnprocessedKeys") or {}
        return [found.get(_key_text(table, key)) for table, key in keys]

    def _as_of(
        self,
        table: str,
        key: dict[str, Any],
        current: dict[str, Any] | None,
        lag: float | None = None,
    ) -> dict[str, Any] | None:
        """The item as a replica ``lag`` (default stale_seconds) behind would serve it."""
        lag = self._faults.plan.stale_seconds if lag is None else lag
        horizon = self._faults.clock() - lag
        for written_at, before in self._history.get(_key_text(table, key), []):
            if written_at > horizon:
                return copy.deepcopy(before)
        return current

    def _stale_page(
        self, request: dict[str, Any], items: list[dict[str, Any]], lag: float
    ) -> list[Any]:
        """A page as a lagging table or index shows it: recent items at their old images,
        dropped where the old image does not belong to the queried partition, and items
        that recently left the partition still in it, each in its place in the order of the
        sort key queried by (the order a reader meets them in, as DynamoDB returns them)."""
        table = request["TableName"]
        keys = self._key_names(table)
        partition = _partition_of(request)
        served = []
        seen = set()
        for item in items:
            text = _key_text(table, {k: item[k] for k in keys})
            seen.add(text)
            image = self._as_of(table, {k: item[k] for k in keys}, item, lag)
            if image is not None and (partition is None or image.get(partition[0]) == partition[1]):
                served.append(image)
        if partition is not None and "ExclusiveStartKey" not in request:
            horizon = self._faults.clock() - lag
            in_range = _in_sort_range(request)
            for text, history in self._history.items():
                if not text.startswith(table + "|") or text in seen:
                    continue
                old = next((b for t, b in history if t > horizon), None)
                if old is not None and old.get(partition[0]) == partition[1] and in_range(old):
                    served.append(copy.deepcopy(old))
        order = self._sort_name(table, request.get("IndexName"))
        if order is not None:
            # (An old image without the index's sort key was not in the index: it is sparse.)
            served = [image for image in served if order in image]
            served.sort(
                key=lambda image: _scalar(image[order]),
                reverse=request.get("ScanIndexForward") is False,
            )
        return [self._project(image, request) for image in served]

    def _sort_name(self, table: str, index: str | None) -> str | None:
        """The sort key attribute of a table or of one of its indexes (None without one)."""
        if (table, index) not in self._sorts:
            found = self._real.describe_table(TableName=table)["Table"]
            schema = found["KeySchema"]
            if index is not None:
                indexes = found.get("GlobalSecondaryIndexes", [])
                indexes += found.get("LocalSecondaryIndexes", [])
                schema = next(i["KeySchema"] for i in indexes if i["IndexName"] == index)
            ranged = (k["AttributeName"] for k in schema if k["KeyType"] == "RANGE")
            self._sorts[(table, index)] = next(ranged, None)
        return self._sorts[(table, index)]

    @staticmethod
    def _project(image: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        projection = request.get("ProjectionExpression")
        if not projection:
            return image
        names = request.get("ExpressionAttributeNames", {})
        wanted = {
            names.get(p.strip().split(".")[0], p.strip().split(".")[0])
            for p in projection.split(",")
        }
        return {k: v for k, v in image.items() if k in wanted}


_EQUALITY = re.compile(r"^\s*(#?\w+)\s*=\s*(:\w+)")


_BETWEEN = re.compile(r"\bAND\s+(#?\w+)\s+BETWEEN\s+(:\w+)\s+AND\s+(:\w+)", re.IGNORECASE)
_BEGINS = re.compile(r"\bbegins_with\(\s*(#?\w+)\s*,\s*(:\w+)\s*\)", re.IGNORECASE)
_COMPARED = re.compile(r"\bAND\s+(#?\w+)\s*(<=|>=|<|>|=)\s*(:\w+)", re.IGNORECASE)
_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "=": operator.eq,
}


def _scalar(typed: dict[str, Any]) -> Any:
    return Decimal(typed["N"]) if "N" in typed else typed.get("S", typed.get("B"))


def _in_sort_range(request: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """Whether an item meets the query's sort key condition (BETWEEN, begins_with or a
    comparison; any item when there is none): what a lagging replica still applies to the
    old images it serves."""
    expression = request.get("KeyConditionExpression", "")
    names = request.get("ExpressionAttributeNames", {})
    typed = request.get("ExpressionAttributeValues", {})

    def key(image: dict[str, Any], name: str) -> Any:
        value = image.get(names.get(name, name))
        return None if value is None else _scalar(value)

    if found := _BETWEEN.search(expression):
        name, low, high = found[1], _scalar(typed[found[2]]), _scalar(typed[found[3]])
        return lambda image: (value := key(image, name)) is not None and low <= value <= high
    if found := _BEGINS.search(expression):
        name, prefix = found[1], _scalar(typed[found[2]])
        return lambda image: str(key(image, name) or "").startswith(prefix)
    if found := _COMPARED.search(expression):
        name, order, bound = found[1], _ORDER[found[2]], _scalar(typed[found[3]])
        return lambda image: (value := key(image, name)) is not None and order(value, bound)
    return lambda image: True


def _partition_of(request: dict[str, Any]) -> tuple[str, Any] | None:
    """(attribute, typed value) of the query's partition key condition."""
    match = _EQUALITY.match(request.get("KeyConditionExpression", ""))
    if match is None:
        return None
    name = request.get("ExpressionAttributeNames", {}).get(match.group(1), match.group(1))
    return name, request["ExpressionAttributeValues"][match.group(2)]


class _Paginator:
    """query/scan pages through the wrapped operation (so every page meets the faults)."""

    def __init__(self, operation: Callable[..., Any]) -> None:
        self._operation = operation

    def paginate(self, **request: Any) -> Iterator[dict[str, Any]]:
        config = request.pop("PaginationConfig", {})
        if "PageSize" in config:
            request["Limit"] = config["PageSize"]
        while True:
            page = self._operation(**request)
            yield page
            start = page.get("LastEvaluatedKey")
            if not start:
                return
            request["ExclusiveStartKey"] = start


class FaultySQS:
    """An SQS client whose batch sends fail entries or time out after sending."""

    def __init__(self, real: Any, faults: Faults) -> None:
        self._real = real
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def send_message_batch(self, **request: Any) -> Any:
        hook = self._faults.before.get("send_message_batch")
        if hook is not None:
            hook("send_message_batch", request)
        if self._faults.roll(self._faults.plan.send_error, "send_error"):
            # No connection, no answer: none of the batch reached the queue.
            raise ConnectTimeoutError(endpoint_url="https://injected.local")
        failed = [
            e
            for e in request["Entries"]
            if self._faults.roll(self._faults.plan.send_failure, "send_failed")
        ]
        passed = [e for e in request["Entries"] if e not in failed]
        answer = self._real.send_message_batch(**(request | {"Entries": passed})) if passed else {}
        if passed and self._faults.roll(self._faults.plan.send_timeout, "send_timeout"):
            raise _timeout()
        return {
            "Successful": answer.get("Successful", []),
            "Failed": answer.get("Failed", [])
            + [{"Id": e["Id"], "SenderFault": False, "Code": "InternalError"} for e in failed],
        }
