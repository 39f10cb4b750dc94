"""The simulation's stream mapping (tests/sim/world.py) reads on past an expired iterator.

DynamoDB Streams' iterators expire 15 minutes (wall clock) after they are issued; on a busy
machine a poll of the simulation can come later than that. The mapping must then go on after
the last record it read, as Lambda's does: neither stop the run nor read a record twice or
skip one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError

from tests.sim.world import _Mapping

ARN = "arn:aws:dynamodb:us-east-1:000000000000:table/occurrences/stream/x"


def stream_record(n: int) -> dict[str, Any]:
    image = {"sk": {"S": f"OCC#{n:012d}#0000000001"}, "schedule_id": {"S": "sch_t0.a"}}
    return {
        "eventName": "INSERT",
        "dynamodb": {"SequenceNumber": f"{n:05d}", "NewImage": image},
    }


class ExpiringStreams:
    """One shard of ``count`` records, two a page; the iterators issued before ``expire()``
    are refused as expired."""

    def __init__(self, count: int) -> None:
        self.records = [stream_record(n) for n in range(1, count + 1)]
        self.generation = 0
        self.asked: list[dict[str, str]] = []

    def expire(self) -> None:
        self.generation += 1

    def get_shard_iterator(self, **where: str) -> dict[str, str]:
        self.asked.append(where)
        after = where.get("SequenceNumber")
        start = 0 if after is None else int(after)
        return {"ShardIterator": f"{self.generation}:{start}"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        generation, start = map(int, ShardIterator.split(":"))
        if generation != self.generation:
            error = {"Error": {"Code": "ExpiredIteratorException", "Message": "expired"}}
            raise ClientError(cast(Any, error), "GetRecords")
        page = self.records[start : start + 2]
        return {"Records": page, "NextShardIterator": f"{generation}:{start + len(page)}"}


def mapping(streams: ExpiringStreams) -> _Mapping:
    endpoint = SimpleNamespace(meta=SimpleNamespace(endpoint_url="http://localhost:1"))
    # (the records' first reads stamp them with the simulated clock)
    sim = SimpleNamespace(real=endpoint, first_read={}, clock=SimpleNamespace(now=0.0))
    made = _Mapping(cast(Any, sim))
    made.streams = streams
    made.arn, made.shards, made.polls = ARN, ["shard-1"], 1  # no DescribeStream at this poll
    return made


def read(made: _Mapping) -> list[str]:
    return [r["dynamodb"]["SequenceNumber"] for r in made.pending["shard-1"]]


def test_the_mapping_goes_on_after_its_last_record_when_its_iterator_expired():
    # GIVEN a mapping that read a shard's 3 records, then 2 more written
    streams = ExpiringStreams(3)
    made = mapping(streams)
    made._read()
    streams.records += [stream_record(4), stream_record(5)]
    # WHEN its iterator has expired by the next poll
    streams.expire()
    made.polls = 1
    made._read()
    # THEN it read each record once, in order, the new iterator after the last one read
    assert read(made) == ["00001", "00002", "00003", "00004", "00005"]
    assert streams.asked[-1] == {
        "StreamArn": ARN,
        "ShardId": "shard-1",
        "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
        "SequenceNumber": "00003",
    }


def test_the_mapping_reads_a_shard_from_its_start_if_its_first_iterator_expired():
    streams = ExpiringStreams(2)
    made = mapping(streams)
    made.iterators["shard-1"], made.pending["shard-1"] = "-1:0", []  # issued long ago
    made._read()
    assert read(made) == ["00001", "00002"]
    assert streams.asked[-1]["ShardIteratorType"] == "TRIM_HORIZON"


def test_the_mapping_fails_on_any_other_error_of_the_stream():
    streams = ExpiringStreams(1)
    made = mapping(streams)

    def refuse(**_: Any) -> dict[str, Any]:
        error = {"Error": {"Code": "ResourceNotFoundException", "Message": "gone"}}
        raise ClientError(cast(Any, error), "GetRecords")

    made.streams = SimpleNamespace(
        get_shard_iterator=streams.get_shard_iterator, get_records=refuse
    )
    with pytest.raises(ClientError):
        made._read()
