"""punctual.integrations.streams.read_range: a discarded batch's records read back from the
stream, to its last sequence number, through the empty pages GetRecords may answer before
a range's records (AWS's API reference says it may); never taken for the range's end."""

from __future__ import annotations

from typing import Any

import pytest

from punctual.integrations.streams import EMPTY_PAGES, Unfinished, read_range
from punctual.pipeline.redrive import StreamRedrive


def _record(sequence: int) -> dict[str, Any]:
    return {
        "eventName": "INSERT",
        "dynamodb": {
            "SequenceNumber": str(sequence),
            "NewImage": {"sk": {"S": "TRG#x"}},  # (not an occurrence: the relay skips it)
            "Keys": {},
        },
    }


class Shard:
    """GetRecords over pages given in order: each a list of sequence numbers (an empty one:
    an empty page); the iterator ends after the last page (a closed shard) unless
    ``open_after`` (then empty pages go on)."""

    def __init__(self, pages: list[list[int]], *, open_after: bool = True) -> None:
        self.pages = pages
        self.open_after = open_after
        self.calls = 0

    def get_shard_iterator(self, **request: Any) -> dict[str, Any]:
        assert request["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
        return {"ShardIterator": "0"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        self.calls += 1
        index = int(ShardIterator)
        if index >= len(self.pages):
            return {"Records": [], "NextShardIterator": str(index + 1) if self.open_after else None}
        last = index + 1 == len(self.pages) and not self.open_after
        return {
            "Records": [_record(n) for n in self.pages[index]],
            "NextShardIterator": None if last else str(index + 1),
        }


def _sequences(records: list[dict[str, Any]]) -> list[int]:
    return [int(r["dynamodb"]["SequenceNumber"]) for r in records]


def test_read_range_goes_on_through_empty_pages_to_the_ranges_last_record():
    # GIVEN a range 10..15 whose records GetRecords hands out after empty pages in between
    shard = Shard([[10, 11], [], [], [12], [], [13, 14, 15, 16]])
    # WHEN it is read
    found = _sequences(list(read_range(shard, "arn", "s", "10", "15")))
    # THEN every record of the range is read, and nothing after it
    assert found == [10, 11, 12, 13, 14, 15]


def test_read_range_stops_at_its_last_record_without_reading_on():
    # GIVEN an open shard whose range ends with the last record written so far
    shard = Shard([[10, 11, 12]])
    # WHEN it is read; THEN it stops at 12, asking no page after it (none would come)
    assert _sequences(list(read_range(shard, "arn", "s", "10", "12"))) == [10, 11, 12]
    assert shard.calls == 1


def test_read_range_of_a_closed_shard_ends_with_the_shard():
    shard = Shard([[10], [], [11]], open_after=False)
    assert _sequences(list(read_range(shard, "arn", "s", "10", "20"))) == [10, 11]


def test_read_range_gives_up_after_too_many_empty_pages_in_a_row_short_of_its_end():
    # GIVEN a range whose last records do not come within EMPTY_PAGES empty pages
    shard = Shard([[10, 11]])
    # WHEN it is read; THEN it is Unfinished (the re-drive keeps the message: tried again)
    with pytest.raises(Unfinished):
        list(read_range(shard, "arn", "s", "10", "15"))
    assert shard.calls == 1 + EMPTY_PAGES


def test_redrive_of_a_range_not_read_to_its_end_keeps_the_failure_message():
    # GIVEN a discarded batch whose range the stream does not hand back in full
    shard = Shard([[10]])
    failure = {
        "requestContext": {"functionArn": ""},
        "DDBStreamBatchInfo": {
            "streamArn": "arn",
            "shardId": "s",
            "startSequenceNumber": "10",
            "endSequenceNumber": "12",
        },
    }

    class NoRelay:
        def relay(self, records: Any) -> Any:
            raise AssertionError("nothing is relayed from a range not read to its end")

    # WHEN it is re-driven; THEN it raises (the on-failure queue's message comes back)
    with pytest.raises(Unfinished):
        StreamRedrive(shard, NoRelay()).redrive(failure)  # type: ignore[arg-type]
