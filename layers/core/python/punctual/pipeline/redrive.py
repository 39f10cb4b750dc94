"""Re-driving deliveries that were lost: two nets under the relay's at-least-once send.

1. **Batches the stream mapping gave up on.** After its retries (or the records' maximum
   age) the relay's event source mapping discards a batch and puts its position (shard,
   first and last sequence number) in the on-failure queue. ``StreamRedrive`` reads those
   records back from the stream, which keeps them 24 hours, and relays them again: a batch
   is re-driven within minutes, and the queue's message stays until it was.
2. **Occurrences no worker took long after they became receivable.** Whatever lost them
   (a message dropped after the send, a stream trimmed before the re-drive, a purged
   queue), the hourly reconciler re-sends every occurrence of the hour it checks that is
   still open ``REDRIVE_AFTER`` past the moment it should have been taken (``overdue``),
   same occurrence id, and counts it; and every one a backfill made in that hour, whatever
   hour its instant is in (the backfill's record).

Both send through the relay, so a re-sent message is the same message; the worker's claim
makes a duplicate harmless.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from punctual.dal.occurrences import StoredOccurrence
from punctual.domain.occurrence import Lane, OccurrenceState
from punctual.integrations.streams import ANY_LANE, read_range, wanted
from punctual.pipeline.relay import Relay, RelayReport, SendFailed

# An open occurrence this long past when a worker should have taken it is re-sent. Far
# above a healthy consumer's delay; the reconciler checks an hour only after it ended.
REDRIVE_AFTER = 15 * 60


def overdue(stored: StoredOccurrence, now: int) -> bool:
    """An occurrence no worker holds or will hold without a new message: SCHEDULED since its
    available_at, waiting on a retry since its retry_at, RUNNING under a lease long expired."""
    occurrence = stored.occurrence
    since: int | None
    if occurrence.state is OccurrenceState.SCHEDULED:
        since = occurrence.available_at
    elif occurrence.state is OccurrenceState.RETRY_WAIT:
        since = stored.retry_at if stored.retry_at is not None else occurrence.available_at
    elif occurrence.state is OccurrenceState.RUNNING:
        since = occurrence.lease_expires_at
    else:
        return False
    return since is not None and since + REDRIVE_AFTER < now


class Trimmed(Exception):
    """The stream no longer holds a discarded batch: only the reconciler can re-send it."""


def failed_lane(failure: dict[str, Any], relay_function: str, catchup_function: str) -> str | None:
    """The lane (``wanted``'s argument) of the mapping whose batch ``failure`` names: both
    lanes' mappings read the same shards, so a batch's range holds the other lane's records
    too, which that lane has sent. ANY_LANE when the failure names neither function (say,
    one replaced since): re-sending the other lane's records costs duplicates, not loss."""
    arn = str(failure.get("requestContext", {}).get("functionArn", ""))
    parts = arn.split(":")  # arn:aws:lambda:<region>:<account>:function:<name>[:<qualifier>]
    name = parts[6] if len(parts) >= 7 and parts[5] == "function" else None
    if name and name == catchup_function:
        return Lane.CATCHUP.value
    if name and name == relay_function:
        return None
    return ANY_LANE


class StreamRedrive:
    """Replays one discarded stream batch (the on-failure queue's message) through the relay."""

    def __init__(
        self, streams: Any, relay: Relay, relay_function: str = "", catchup_function: str = ""
    ) -> None:
        self._streams = streams
        self._relay = relay
        self._functions = (relay_function, catchup_function)

    def redrive(self, failure: dict[str, Any]) -> RelayReport:
        """Relay the batch again; SendFailed if some of it still could not be sent (the
        message is then kept and comes back), Trimmed if the stream dropped it."""
        info = failure["DDBStreamBatchInfo"]
        try:
            records = list(
                read_range(
                    self._streams,
                    info["streamArn"],
                    info["shardId"],
                    info["startSequenceNumber"],
                    info["endSequenceNumber"],
                )
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "TrimmedDataAccessException":
                raise Trimmed(f"stream records {info['startSequenceNumber']}.. expired") from error
            raise
        lane = failed_lane(failure, *self._functions)
        report = self._relay.relay([r for r in records if wanted(r, lane)])
        if report.failures:
            raise SendFailed(f"{len(report.failures)} of the batch not sent again yet")
        return report
