"""DynamoDB Streams records as the relay's event source mapping hands them over.

Shared by the on-failure re-drive (which reads a discarded batch back from the stream) and
the local stream poller (which stands in for the mapping)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from punctual.dal.tables import OCCURRENCE_PREFIX

PAGE = 1000  # records per GetRecords call (DynamoDB Streams' maximum)
# GetRecords may answer an empty page while records lie further on in the shard (AWS's API
# reference); a range is read on through this many empty pages in a row before giving up.
EMPTY_PAGES = 25


class Unfinished(Exception):
    """A range's records were not all read (empty pages past the bound): try again later."""


ANY_LANE = "*"
# Each lane's mapping waits up to this long to fill a batch (MaximumBatchingWindowInSeconds,
# infra/relay.py; the on-time one is DeployConfig.relay_batching_window_seconds's default).
ON_TIME_WINDOW_SECONDS = 2
CATCHUP_WINDOW_SECONDS = 5


def wanted(record: dict[str, Any], lane: str | None = ANY_LANE) -> bool:
    """A mapping's filter: eventName INSERT and NewImage.sk starting with OCC#, in ``lane``:
    None is the on-time lane (no string at NewImage.lane.S), ANY_LANE either; as
    infra/relay.py's filters say it."""
    image = record.get("dynamodb", {}).get("NewImage", {})
    sk = image.get("sk", {}).get("S", "")
    attribute = image.get("lane")
    named = attribute.get("S") if isinstance(attribute, dict) else None  # None: on time
    in_lane = lane == ANY_LANE or named == lane
    return record.get("eventName") == "INSERT" and sk.startswith(OCCURRENCE_PREFIX) and in_lane


def _typed(value: Any) -> Any:
    """DynamoDB Local's streams write an empty map as {} instead of {"M": {}}: repair it
    (and inside maps and lists), so records look like DynamoDB's."""
    if value == {}:
        return {"M": {}}
    if "M" in value:
        return {"M": {k: _typed(v) for k, v in value["M"].items()}}
    if "L" in value:
        return {"L": [_typed(v) for v in value["L"]]}
    return value


def event_record(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A GetRecords record as a Lambda event record (the mapping's shape)."""
    dynamodb = dict(record["dynamodb"])
    for image in ("NewImage", "OldImage", "Keys"):
        if image in dynamodb:
            dynamodb[image] = {k: _typed(v) for k, v in dynamodb[image].items()}
    created = dynamodb.get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        dynamodb["ApproximateCreationDateTime"] = created.timestamp()
    return {**record, "dynamodb": dynamodb, "eventSourceARN": stream_arn}


def read_range(
    streams: Any, stream_arn: str, shard_id: str, first: str, last: str
) -> Iterator[dict[str, Any]]:
    """The records of one shard from sequence number ``first`` to ``last`` (inclusive), as
    event records, read until the one at ``last`` (or the shard's end). Raises the client's
    TrimmedDataAccessException once the stream no longer holds them (24 hours), Unfinished
    after EMPTY_PAGES empty pages in a row short of ``last`` (an empty page does not mean
    the range is over: AWS may answer one before the records)."""
    iterator = streams.get_shard_iterator(
        StreamArn=stream_arn,
        ShardId=shard_id,
        ShardIteratorType="AT_SEQUENCE_NUMBER",
        SequenceNumber=first,
    ).get("ShardIterator")
    end = int(last)
    empty = 0
    while iterator:
        page = streams.get_records(ShardIterator=iterator, Limit=PAGE)
        records = page.get("Records", [])
        for record in records:
            sequence = int(record["dynamodb"]["SequenceNumber"])
            if sequence > end:
                return
            yield event_record(record, stream_arn)
            if sequence == end:
                return
        empty = 0 if records else empty + 1
        if empty >= EMPTY_PAGES:
            raise Unfinished(f"{empty} empty pages in a row before sequence number {last}")
        iterator = page.get("NextShardIterator")
