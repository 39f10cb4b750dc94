"""The local stand-ins for the two lanes' event source mappings (punctual_local.streams, as
`make run` runs them): each hands its lane's records only, keeps its own position, holds
them up to its batching window, and a lane added to a stack that has run starts where the
stack's poller was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import occurrence_to_item
from punctual.domain.ids import new_schedule_id, occurrence_id
from punctual.domain.occurrence import Lane, Occurrence
from punctual.services import Services
from punctual_local import streams as local_streams
from punctual_local.stack import lane_checkpoints
from punctual_local.streams import StreamPoller


def _put(aws: Services, fire: int, lane: Lane | None) -> str:
    schedule_id = new_schedule_id("alice")
    occurrence = Occurrence(
        occurrence_id=occurrence_id(schedule_id, 1, fire),
        tenant_id="alice",
        schedule_id=schedule_id,
        schedule_version=1,
        scheduled_for=fire,
        available_at=fire,
        target="default",
        lane=lane,
    )
    aws.dynamodb.put_item(
        TableName=aws.settings.occurrences_table,
        Item=to_dynamo(occurrence_to_item(occurrence, {})),
    )
    return occurrence.occurrence_id


class Handed:
    """A relay handler that notes the occurrence ids it was handed."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        self.ids += [r["dynamodb"]["NewImage"]["occurrence_id"]["S"] for r in event["Records"]]
        return {"batchItemFailures": []}


def _poller(aws: Services, streams: Any, handed: Handed, path: Path, **lane: Any) -> StreamPoller:
    return StreamPoller(aws.dynamodb, streams, aws.settings.occurrences_table, handed, path, **lane)


def test_stream_lanes_each_poller_hands_its_lanes_records_once(
    local_aws: Services,
    streams: Any,
    tmp_path: Path,
):
    # GIVEN on-time and catch-up occurrences in the stream, interleaved
    made = {
        lane: [_put(local_aws, 1_800_000_000 + n, lane) for n in range(3)]
        for lane in (None, Lane.CATCHUP)
    }
    on_time, catchup = Handed(), Handed()
    pollers = [
        _poller(local_aws, streams, on_time, tmp_path / "streams.json", lane=None),
        _poller(local_aws, streams, catchup, tmp_path / "catchup.json", lane="CATCHUP"),
    ]
    # WHEN each polls (twice: the second finds nothing new)
    for _ in range(2):
        for poller in pollers:
            poller.poll_once()
    # THEN each lane's poller was handed its lane's occurrences, each once
    assert on_time.ids == made[None]
    assert catchup.ids == made[Lane.CATCHUP]


def test_stream_lanes_a_new_lane_starts_where_the_stacks_poller_was(
    local_aws: Services,
    streams: Any,
    tmp_path: Path,
):
    # GIVEN a stack whose single poller (before the lanes) relayed a catch-up occurrence
    old = _put(local_aws, 1_800_000_000, Lane.CATCHUP)
    _poller(local_aws, streams, Handed(), tmp_path / "streams.json").poll_once()
    new = _put(local_aws, 1_800_000_060, Lane.CATCHUP)
    # WHEN the stack starts with lanes: the on-time poller runs first and moves on
    checkpoints = lane_checkpoints(tmp_path)
    _poller(local_aws, streams, Handed(), checkpoints[None], lane=None).poll_once()
    handed = Handed()
    _poller(local_aws, streams, handed, checkpoints["CATCHUP"], lane="CATCHUP").poll_once()
    # THEN the catch-up lane hands only what came after the old poller (the old one was
    # sent), however far the on-time lane went meanwhile
    assert handed.ids == [new]
    assert old not in handed.ids
    # AND it keeps its own position from then on: nothing again
    again = Handed()
    _poller(
        local_aws, streams, again, lane_checkpoints(tmp_path)["CATCHUP"], lane="CATCHUP"
    ).poll_once()
    assert again.ids == []


def test_stream_lanes_a_window_holds_a_lanes_records_until_it_closes_then_hands_them_at_once(
    local_aws: Services, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monotonic = [1000.0]
    checkpoints = tmp_path / "streams.json"
    handed = Handed()
    poller = _poller(
        local_aws, streams, handed, checkpoints, lane=None, window=2, monotonic=lambda: monotonic[0]
    )
    # GIVEN an on-time occurrence read by a poller whose mapping waits 2 s to fill a batch
    first = _put(local_aws, 1_800_000_000, None)
    poller.poll_once()
    # THEN nothing is handed while the window is open, and a catch-up record read meanwhile
    # (another lane's) does not close it
    _put(local_aws, 1_800_000_030, Lane.CATCHUP)
    monotonic[0] += 1.9
    second = _put(local_aws, 1_800_000_060, None)
    poller.poll_once()
    assert handed.ids == []
    # ... nor is the position saved past them: a restart now reads them again
    restarted = Handed()
    _poller(local_aws, streams, restarted, checkpoints, lane=None).poll_once()
    assert restarted.ids == [first, second]
    # WHEN the window closes (2 s after the first was read)
    monotonic[0] += 0.1
    poller.poll_once()
    # THEN both are handed in one batch, once
    assert handed.ids == [first, second]
    poller.poll_once()
    assert handed.ids == [first, second]


def test_stream_lanes_a_full_batch_is_handed_before_its_window_closes(
    local_aws: Services, streams: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(local_streams, "BATCH_SIZE", 3)
    handed = Handed()
    poller = _poller(
        local_aws,
        streams,
        handed,
        tmp_path / "streams.json",
        lane=None,
        window=60,
        monotonic=lambda: 1000.0,  # time stands still
    )
    made = [_put(local_aws, 1_800_000_000 + n, None) for n in range(2)]
    poller.poll_once()
    assert handed.ids == []
    # WHEN the third record fills the batch
    made.append(_put(local_aws, 1_800_000_002, None))
    poller.poll_once()
    # THEN the batch goes at once
    assert handed.ids == made


def test_stream_lanes_records_whose_handing_over_broke_are_read_again(
    local_aws: Services, streams: Any, tmp_path: Path
):
    # GIVEN a poller whose handler answers with something that is not a batch response
    answers: list[Any] = [{"batchItemFailures": [{"itemIdentifier": "not a sequence"}]}]
    handed = Handed()

    def handler(event: dict[str, Any]) -> dict[str, Any]:
        handed(event)
        return answers.pop() if answers else {"batchItemFailures": []}

    poller = _poller(local_aws, streams, handler, tmp_path / "streams.json", lane=None)  # type: ignore[arg-type]
    made = _put(local_aws, 1_800_000_000, None)
    # WHEN the poll breaks on it (outside the handler)
    with pytest.raises(ValueError, match="not a sequence"):
        poller.poll_once()
    # THEN the next poll hands the same record over again: it was not skipped
    poller.poll_once()
    assert handed.ids == [made, made]
