"""The local stand-in for the Lambda event source mapping on the occurrences stream.

Like a mapping: records are filtered (INSERT of occurrence items only, of one lane), handed
to the relay handler in batches (held up to the mapping's batching window to fill them), and
a record the handler reports as a batch item failure is retried from that record on (after
a pause), so nothing is skipped. The position in each shard is checkpointed to a file, so a
restarted stack carries on where it stopped;
re-delivering a few records after a crash is harmless (the relay skips what is no longer
SCHEDULED, and delivery is at least once anyway).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from punctual.integrations.streams import ANY_LANE, event_record, wanted
from punctual.observability import logger

BatchHandler = Callable[[dict[str, Any]], dict[str, Any]]
BATCH_SIZE = 500  # as the CDK event source mapping
RETRY_PAUSE_SECONDS = 1.0


class StreamPoller:
    def __init__(
        self,
        dynamodb: Any,
        streams: Any,
        table: str,
        handler: BatchHandler,
        checkpoints: Path,
        lane: str | None = ANY_LANE,
        window: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``lane``: the records this poller hands over (``wanted``), as one lane's mapping;
        ``window``: its MaximumBatchingWindowInSeconds (a shard's wanted records are held up
        to this long after the first of them was read, unless a batch fills first)."""
        self._dynamodb = dynamodb
        self._streams = streams
        self._table = table
        self._handler = handler
        self._checkpoints = checkpoints
        self._lane = lane
        self._iterators: dict[str, str | None] = {}
        self._positions: dict[str, str] = {}
        self._stream_arn: str | None = None
        self._retry_after: dict[str, float] = {}
        self._window = window
        self._monotonic = monotonic
        # Per shard: records read but not yet handed over (the checkpoint stays before
        # them, so a restart reads them again), and when the first wanted one was read.
        self._held: dict[str, list[dict[str, Any]]] = {}
        self._held_since: dict[str, float] = {}

    def _load(self, stream_arn: str) -> None:
        try:
            saved = json.loads(self._checkpoints.read_text())
        except (OSError, ValueError):
            saved = {}
        self._positions = dict(saved.get(stream_arn, {}))

    def _save(self) -> None:
        assert self._stream_arn is not None
        tmp = self._checkpoints.with_suffix(".tmp")
        tmp.write_text(json.dumps({self._stream_arn: self._positions}))
        tmp.replace(self._checkpoints)

    def _iterator(self, shard_id: str) -> str | None:
        """An iterator from the shard's checkpoint: what was held after it is read again."""
        assert self._stream_arn is not None
        self._held.pop(shard_id, None)
        position = self._positions.get(shard_id)
        request: dict[str, Any] = {"StreamArn": self._stream_arn, "ShardId": shard_id}
        if position:
            request |= {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": position}
        else:
            request |= {"ShardIteratorType": "TRIM_HORIZON"}
        return str(self._streams.get_shard_iterator(**request)["ShardIterator"])

    def _discover(self) -> None:
        arn = self._dynamodb.describe_table(TableName=self._table)["Table"]["LatestStreamArn"]
        if arn != self._stream_arn:
            self._stream_arn = arn
            self._iterators = {}
            self._load(arn)
        shards = self._streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
        for shard in shards:
            if shard["ShardId"] not in self._iterators:
                self._iterators[shard["ShardId"]] = self._iterator(shard["ShardId"])

    def poll_once(self) -> int:
        """Read every open shard once; returns how many records were handed to the relay."""
        self._discover()
        handed = 0
        for shard_id, iterator in list(self._iterators.items()):
            if iterator is None or self._monotonic() < self._retry_after.get(shard_id, 0):
                continue
            try:
                answer = self._streams.get_records(ShardIterator=iterator, Limit=1000)
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code")
                if code not in ("TrimmedDataAccessException", "ExpiredIteratorException"):
                    raise
                # DynamoDB Local sometimes refuses an iterator it issued; take a fresh one
                # from the checkpoint (nothing is skipped: the checkpoint did not move).
                logger.info("stream iterator refused; taking a fresh one", extra={"code": code})
                self._iterators[shard_id] = self._iterator(shard_id)
                continue
            next_iterator = answer.get("NextShardIterator")
            self._iterators[shard_id] = next_iterator
            records = self._hold(shard_id, answer.get("Records", []), ended=next_iterator is None)
            if records is None:
                continue  # the window is open: more may come to fill the batch
            try:
                failed_at = self._deliver(records)
            except Exception:
                # Not the handler's failure (that is caught in _deliver): read them again
                # from the checkpoint, which has not moved past them.
                self._iterators[shard_id] = self._iterator(shard_id)
                raise
            if failed_at is None:
                if records:
                    self._positions[shard_id] = records[-1]["dynamodb"]["SequenceNumber"]
            else:
                # Retry from the first failed record, as the mapping does.
                done = [r for r in records if int(r["dynamodb"]["SequenceNumber"]) < failed_at]
                if done:
                    self._positions[shard_id] = done[-1]["dynamodb"]["SequenceNumber"]
                self._iterators[shard_id] = self._iterator(shard_id)
                self._retry_after[shard_id] = self._monotonic() + RETRY_PAUSE_SECONDS
            handed += len([r for r in records if wanted(r, self._lane)])
        self._save()
        return handed

    def _hold(
        self, shard_id: str, read: list[dict[str, Any]], *, ended: bool
    ) -> list[dict[str, Any]] | None:
        """The shard's records to hand over now (those held, then ``read``), or None while
        the window is open: some are wanted, fewer than a batch, the first read less than
        the window ago, and the shard has not ended (a closed shard is read no more)."""
        held = self._held.setdefault(shard_id, [])
        had_wanted = any(wanted(r, self._lane) for r in held)
        held += read
        count = sum(1 for r in held if wanted(r, self._lane))
        if count and not had_wanted:
            self._held_since[shard_id] = self._monotonic()
        opened = self._held_since.get(shard_id, 0.0)
        if count and count < BATCH_SIZE and self._monotonic() - opened < self._window and not ended:
            return None
        self._held[shard_id] = []
        return held

    def _deliver(self, records: list[dict[str, Any]]) -> int | None:
        """Hand the wanted records to the relay; the first failed sequence number, if any."""
        assert self._stream_arn is not None
        batch = [event_record(r, self._stream_arn) for r in records if wanted(r, self._lane)]
        for start in range(0, len(batch), BATCH_SIZE):
            part = batch[start : start + BATCH_SIZE]
            try:
                answer = self._handler({"Records": part})
            except Exception:
                logger.exception("relay batch failed; retrying it")
                return int(part[0]["dynamodb"]["SequenceNumber"])
            failures = [int(f["itemIdentifier"]) for f in answer.get("batchItemFailures", [])]
            if failures:
                return min(failures)
        return None
