"""Item (de)serialization, and the one place where DynamoDB's errors become domain errors:
every call a store makes goes through ``Dynamo``, which answers in ``translated``'s terms."""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as NoConnection

from punctual.backoff import Backoff, Sleep
from punctual.domain.errors import InvalidInput, NotFound, Retryable
from punctual.observability import logger

if TYPE_CHECKING:  # the stubs are a development dependency: Lambda never imports them
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import (
        BatchGetItemOutputTypeDef,
        GetItemOutputTypeDef,
        PutItemOutputTypeDef,
        QueryOutputTypeDef,
        ScanOutputTypeDef,
        TransactWriteItemsOutputTypeDef,
        UpdateItemOutputTypeDef,
    )

    from punctual.skew import AnswerClock

T = TypeVar("T")

_SERIALIZER = TypeSerializer()
_DESERIALIZER = TypeDeserializer()

_RETRYABLE = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "TransactionConflictException",
    }
)

Item = dict[str, Any]


def to_dynamo(item: Mapping[str, Any]) -> dict[str, Any]:
    """An item as DynamoDB's JSON, attributes that are None left out. What boto3's
    TypeSerializer gives (floats as their shortest decimal text), without its type probe of
    every value: every item written goes through here (a sixth of a schedule step's CPU went
    to it, 2026-12-04)."""
    return {k: _typed(v) for k, v in item.items() if v is not None}


# Integers DynamoDB takes as they are: 38 significant digits.
_DIGITS_38 = 10**38


def _typed(value: Any) -> dict[str, Any]:
    kind = type(value)
    if kind is str:
        return {"S": value}
    if kind is int and -_DIGITS_38 < value < _DIGITS_38:
        return {"N": str(value)}
    if kind is dict:
        return {"M": {k: _typed(v) for k, v in value.items()}}
    if kind is list:
        return {"L": [_typed(v) for v in value]}
    return _typed_rarer(value)


def _typed_rarer(value: Any) -> dict[str, Any]:
    """The values items hold less often than text, numbers, maps and lists."""
    if type(value) is bool:
        return {"BOOL": value}
    if value is None:
        return {"NULL": True}
    # Floats, Decimals, longer integers (refused), sets, binaries, subclasses: boto3's way.
    serialized: dict[str, Any] = _SERIALIZER.serialize(_plain(value))
    return serialized


def from_dynamo(item: Mapping[str, Any]) -> Item:
    """An item in DynamoDB's JSON as Python values: numbers as int (or float when not
    integral), maps and lists as dicts and lists. What boto3's TypeDeserializer gives, then
    ``_native``, without its Decimal for every number: every item read goes through here
    (a fifth of a schedule step's CPU went to the two, 2026-12-03)."""
    return {k: _value(v) for k, v in item.items()}


def _value(typed: Mapping[str, Any]) -> Any:
    if "S" in typed:
        return typed["S"]
    if "N" in typed:
        return _number(typed["N"])
    if "M" in typed:
        return {k: _value(v) for k, v in typed["M"].items()}
    if "L" in typed:
        return [_value(v) for v in typed["L"]]
    return _value_rarer(typed)


def _value_rarer(typed: Mapping[str, Any]) -> Any:
    """The values items hold less often than text, numbers, maps and lists."""
    if "BOOL" in typed:
        return typed["BOOL"]
    if "NULL" in typed:
        return None
    # Sets and binaries (Punctual stores none): boto3's way.
    return _native(_DESERIALIZER.deserialize(dict(typed)))


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        number = Decimal(text)  # "1.5", "1E+2", "2.0"
    return int(number) if number == number.to_integral_value() else float(number)


def values(**named: Any) -> dict[str, Any]:
    """ExpressionAttributeValues from keyword arguments: values(v=3) -> {':v': {'N': '3'}}."""
    return {f":{k}": _typed(v) for k, v in named.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _native(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _native(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_native(v) for v in value]
    return value


@contextmanager
def translated() -> Iterator[None]:
    """DynamoDB's errors as the one outcome every call has, here and nowhere else: a failed
    condition is ConditionFailed (``Label.ITEM``, and the item as it was when the request
    asked for it), throttling, transient faults and no answer at all (a timeout, a lost
    connection: the SDK's own retries spent) are Retryable, a missing table NotFound. A
    cancelled transaction stays a ClientError for ``Transactions`` to read its reasons."""
    try:
        yield
    except (HTTPClientError, NoConnection) as error:
        raise Retryable(f"DynamoDB did not answer ({type(error).__name__}); retry") from error
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        if code == "ConditionalCheckFailedException":
            old = error.response.get("Item")
            raise ConditionFailed(Label.ITEM, from_dynamo(old) if old else None) from error
        if code in _RETRYABLE:
            raise Retryable(f"DynamoDB is busy ({code}); retry") from error
        if code == "ResourceNotFoundException":
            raise NotFound("table not found") from error
        raise


# What building a record from an item can raise when the item is not one Punctual wrote:
# pydantic's ValidationError is a ValueError; a missing attribute, a wrong type.
UNPARSABLE: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError, AttributeError)


class BadItems:
    """Items a reader could not make a record of, counted. A tenant's worker may write under
    its own keys whatever its IAM policy allows, and an UpdateItem creates a missing item
    (docs/security.md): such an item is that tenant's bad data. Its reader logs it with its
    key, counts it here and goes on without it; never a failure of a shard, a batch or
    another tenant's work. Each orchestrator's report says how many it met (metric
    MalformedItems). One per ``Services``, shared by its stores and threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def skip(self, table: str, item: Mapping[str, Any], error: Exception) -> None:
        key = {k: item.get(k) for k in ("schedule_id", "sk", "pk") if k in item}
        logger.warning(
            "skipped an item that is not a record Punctual wrote (a tenant's bad data)",
            extra={"table": table, "key": key, "error": f"{type(error).__name__}: {error}"[:500]},
        )
        with self._lock:
            self._count += 1


def encode_token(key: Mapping[str, Any] | None) -> str | None:
    """An opaque pagination token for a DynamoDB LastEvaluatedKey."""
    if not key:
        return None
    raw = json.dumps(from_dynamo(key), separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(
    token: str | None,
    *,
    expect: Mapping[str, Any],
    keys: frozenset[str],
    sk_within: tuple[str, str] | None = None,
) -> dict[str, Any] | None:
    """Back to ExclusiveStartKey. A mangled token, one missing or adding key attributes
    (``keys``), one minted for another tenant or schedule (``expect``), or one whose sort
    key lies outside the query's range (``sk_within``: DynamoDB refuses such a start key
    with a ValidationException, which would be a 500) is a 400."""
    if not token:
        return None
    problem = InvalidInput(
        "next_token is not valid", [{"field": "next_token", "reason": "not a token we issued"}]
    )
    try:
        padded = token + "=" * (-len(token) % 4)
        key = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, binascii.Error):
        raise problem from None
    if (
        not isinstance(key, dict)
        or set(key) != keys
        or not all(isinstance(v, str | int) and not isinstance(v, bool) for v in key.values())
        or any(key.get(k) != v for k, v in expect.items())
        or (sk_within is not None and not sk_within[0] <= str(key.get("sk")) <= sk_within[1])
    ):
        raise problem
    return to_dynamo(key)


class Label(StrEnum):
    """The name of a write's action, which a refusal reports (``ConditionFailed.label``): in
    a transaction, the action whose condition failed first; a single write's is ``ITEM``."""

    ITEM = "item"  # a single write (PutItem, UpdateItem, DeleteItem)
    SCHEDULE = "schedule"  # a schedule's CURRENT item
    STEP = "step"  # a materializer's step of a schedule: its occurrences and its cursor
    VERSION = "version"  # a schedule's version item
    OCCURRENCE = "occurrence"
    TRIGGER = "trigger"  # a run now's record under its idempotency key
    TENANT = "tenant"  # the tenant record: its usage against its quotas
    SHARD = "shard"  # a shard's lease item: its walk's watermark
    FENCE = "fence"  # the materializer's check that it still holds the shard
    TALLY = "tally"  # a shard's tally of a tenant's released usage
    CONCURRENCY_SLOT = "concurrency_slot"  # the tenant's concurrency slots (workers)
    RUN_SLOT = "run_slot"  # a schedule's one running run (overlap SKIP, QUEUE_ONE)
    WAIT_SLOT = "wait_slot"  # a schedule's next in line (QUEUE_ONE)
    EFFECT = "record"  # a worker's effect record (the effect ledger)
    EFFECT_WRITE = "write"  # a tenant's own write in the effect's transaction


class ConditionFailed(Exception):
    """A write refused because a condition failed. ``label`` names the action whose
    condition failed (the first one, in a transaction), ``old_item`` is that item as it was
    (when the action asked for it), ``codes`` every action's cancellation code in order
    ("None": not at fault; empty for a single write). Not an HTTP error: the caller decides
    what a lost race means (a retry, a False, a 409 from the API)."""

    def __init__(self, label: Label, old_item: Item | None, codes: Sequence[str] = ()) -> None:
        super().__init__(label)
        self.label = label
        self.old_item = old_item
        self.codes = tuple(codes)

    def failed(self, index: int) -> bool:
        """The condition of the action at ``index`` failed."""
        return self.codes[index] == "ConditionalCheckFailed"

    def innocent(self, index: int) -> bool:
        """The action at ``index`` had nothing to do with the refusal."""
        return self.codes[index] in ("None", "")

    def conflicted(self, index: int) -> bool:
        """The action at ``index`` met another transaction on its item."""
        return self.codes[index] == "TransactionConflict"


# Keys a BatchGetItem left unprocessed (throttled) are asked again this many times in all.
UNPROCESSED = Backoff(tries=8, base=0.05, cap=1.0)


class Dynamo:
    """A DynamoDB client as the stores use it: each call translated (``translated``), so a
    throttled read answers Retryable (the API's 503) like a throttled write, and the pause
    of every retry loop over it (``sleep``). The stores hold one of these, never the raw
    client (tests/unit/test_seams.py): a call it does not offer cannot be made untranslated.
    With a ``clock``, each call is timed against its answer's Date (the component's clock
    skew: punctual.skew)."""

    __slots__ = ("clock", "raw", "sleep")

    def __init__(
        self, raw: DynamoDBClient, sleep: Sleep = time.sleep, clock: AnswerClock | None = None
    ) -> None:
        self.raw = raw
        self.sleep = sleep
        self.clock = clock

    def _answer(self, call: Callable[[], T]) -> T:
        """``call``'s answer, translated (and timed, with a clock)."""
        with translated():
            return call() if self.clock is None else self.clock.timed(call)

    def get_item(self, **request: Any) -> GetItemOutputTypeDef:
        return self._answer(lambda: self.raw.get_item(**request))

    def batch_get_item(self, **request: Any) -> BatchGetItemOutputTypeDef:
        return self._answer(lambda: self.raw.batch_get_item(**request))

    def query(self, **request: Any) -> QueryOutputTypeDef:
        return self._answer(lambda: self.raw.query(**request))

    def scan(self, **request: Any) -> ScanOutputTypeDef:
        return self._answer(lambda: self.raw.scan(**request))

    def query_pages(self, **request: Any) -> Iterator[QueryOutputTypeDef]:
        """Every page of a Query, each read translated."""
        pages = iter(self.raw.get_paginator("query").paginate(**request))
        while True:
            page = self._answer(lambda: next(pages, None))
            if page is None:
                return
            yield page

    def put_item(self, **request: Any) -> PutItemOutputTypeDef:
        return self._answer(lambda: self.raw.put_item(**request))

    def update_item(self, **request: Any) -> UpdateItemOutputTypeDef:
        return self._answer(lambda: self.raw.update_item(**request))

    def transact_write_items(self, **request: Any) -> TransactWriteItemsOutputTypeDef:
        return self._answer(lambda: self.raw.transact_write_items(**request))


def dynamo(client: Any, sleep: Sleep | None = None) -> Dynamo:
    """``client`` as a Dynamo (itself if it is one already, unless another ``sleep`` is
    given)."""
    if isinstance(client, Dynamo):
        return client if sleep is None else Dynamo(client.raw, sleep, client.clock)
    return Dynamo(client, sleep or time.sleep)


def transact(client: Dynamo, actions: list[dict[str, Any]]) -> None:
    """TransactWriteItems with an idempotency token. A call whose response is lost after it
    committed is sent again by the SDK; without the token the repeat meets its own write and
    is refused (a create answering 409 for the schedule it made), with it DynamoDB answers
    the repeat as the first call succeeded."""
    client.transact_write_items(TransactItems=actions, ClientRequestToken=uuid.uuid4().hex)


_TRY_AGAIN = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})


class Transactions:
    """How an orchestrator commits what several stores built, as one TransactWriteItems
    over labelled actions, with one outcome: it committed (``commit`` returns), a condition
    failed (ConditionFailed), or it may simply be tried again (Retryable: a conflicting
    transaction, throttling)."""

    def __init__(self, client: Any) -> None:
        self._client = dynamo(client)

    def commit(self, actions: Sequence[tuple[Label, dict[str, Any]]]) -> None:
        try:
            transact(self._client, [action for _, action in actions])
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            reasons = error.response.get("CancellationReasons", [])
            codes = [str(r.get("Code") or "None") for r in reasons]
            for (label, _), reason in zip(actions, reasons, strict=False):
                if reason.get("Code") == "ConditionalCheckFailed":
                    old = reason.get("Item")
                    raise ConditionFailed(
                        label, from_dynamo(old) if old else None, codes
                    ) from error
            if _TRY_AGAIN & set(codes):
                raise Retryable(
                    "a concurrent change or throttling cancelled the write; retry"
                ) from error
            raise


def batch_get(
    client: Dynamo,
    table: str,
    keys: list[dict[str, Any]],
    *,
    consistent: bool = True,
    attributes: Sequence[str] = (),
) -> list[Item]:
    """The items of ``keys`` (plain key dicts) in their order, skipping missing ones, 100 a
    request. How a query on a narrow index reads the rest of each item, and how a batch of
    known ids is checked in one call. ``attributes``: only these (paths such as
    ``definition.payload``) and the key are returned (read units are the whole item's)."""
    if not keys:
        return []
    projection = _projection([*keys[0], *attributes])
    found: dict[str, Item] = {}
    for start in range(0, len(keys), 100):
        request: dict[str, Any] = {
            table: {
                "Keys": [to_dynamo(k) for k in keys[start : start + 100]],
                "ConsistentRead": consistent,
            }
            | (projection if attributes else {})
        }
        for answer in batch_get_all(client, request):
            for raw in answer["Responses"].get(table, []):
                item = from_dynamo(raw)
                found[_key_text(item, keys[0])] = item
    return [found[text] for key in keys if (text := _key_text(key, keys[0])) in found]


def batch_get_all(client: Dynamo, request: dict[str, Any]) -> Iterator[BatchGetItemOutputTypeDef]:
    """The answers of a BatchGetItem (``request``: its RequestItems) and of its asks again
    for the keys each answer left unprocessed (throttled ones: DynamoDB hands them back at
    once, and asking again at once hammers the partition that throttled them), apart by
    UNPROCESSED's back-off; Retryable if keys are still left after its last try."""
    for _ in UNPROCESSED.attempts(client.sleep):
        answer = client.batch_get_item(RequestItems=request)
        yield answer
        request = answer.get("UnprocessedKeys") or {}
        if not request:
            return
    raise Retryable("DynamoDB kept keys of a batch read unprocessed (throttled); retry")


def _projection(paths: Sequence[str]) -> dict[str, Any]:
    """ProjectionExpression and ExpressionAttributeNames for attribute paths, every name a
    placeholder (a reserved word, such as ``state``, cannot appear as it is)."""
    names: dict[str, str] = {}
    spelled = []
    for path in paths:
        parts = []
        for name in path.split("."):
            placeholder = next((k for k, v in names.items() if v == name), f"#p{len(names)}")
            names[placeholder] = name
            parts.append(placeholder)
        spelled.append(".".join(parts))
    return {"ProjectionExpression": ", ".join(spelled), "ExpressionAttributeNames": names}


def _key_text(item: Mapping[str, Any], like: Mapping[str, Any]) -> str:
    return json.dumps([item[name] for name in like])
