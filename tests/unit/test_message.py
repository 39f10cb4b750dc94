"""The occurrence message, version 1 (docs/message.md): the exact body the relay sends,
and what a worker accepts as one."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from punctual.domain.ids import occurrence_id
from punctual.domain.message import MESSAGE_VERSION, message_body, parse_message
from punctual.domain.occurrence import Occurrence

SCHEDULE = "sch_acme.q7k"
SCHEDULED_FOR = 1_796_029_200  # 2026-11-30T09:00:00Z
OCCURRENCE = Occurrence(
    occurrence_id=occurrence_id(SCHEDULE, 3, SCHEDULED_FOR),
    tenant_id="acme",
    schedule_id=SCHEDULE,
    schedule_version=3,
    scheduled_for=SCHEDULED_FOR,
    available_at=SCHEDULED_FOR + 137,
    target="default",
    attempt_count=1,
)


def test_message_body_is_the_documented_version_1_body_in_compact_json():
    # GIVEN an occurrence on its second attempt, with a payload
    # WHEN the relay builds its message
    body = message_body(OCCURRENCE, {"report": "daily"})
    # THEN it is exactly the documented body: these names, this order, UTC instants with Z,
    # the attempt this message starts, no whitespace (SQS bills by size)
    assert body == (
        '{"version":1,"occurrence_id":"occ_sch_acme.q7k_1796029200_3",'
        '"schedule_id":"sch_acme.q7k","schedule_version":3,"tenant_id":"acme",'
        '"target":"default","scheduled_for":"2026-11-30T09:00:00Z",'
        '"available_at":"2026-11-30T09:02:17Z","attempt":2,"payload":{"report":"daily"}}'
    )


def test_a_message_body_reads_back_as_the_occurrence_it_was_built_from():
    message = parse_message(message_body(OCCURRENCE, {"n": 1}))
    assert (message.version, message.occurrence_id, message.schedule_id) == (
        MESSAGE_VERSION,
        OCCURRENCE.occurrence_id,
        SCHEDULE,
    )
    assert (message.schedule_version, message.tenant_id, message.target) == (3, "acme", "default")
    assert int(message.scheduled_for.timestamp()) == SCHEDULED_FOR
    assert int(message.available_at.timestamp()) == SCHEDULED_FOR + 137
    assert (message.attempt, message.payload) == (2, {"n": 1})


@pytest.mark.parametrize(
    "body",
    [
        "[]",  # not an object
        '"text"',
        json.dumps({"occurrence_id": "occ_x_1_1"}),  # no version
        json.dumps({"version": 2}),  # a version this SDK does not know
    ],
)
def test_a_body_that_is_not_a_version_1_message_is_refused(body: str):
    with pytest.raises(ValueError, match="not a version 1 occurrence message"):
        parse_message(body)


def test_a_body_whose_fields_disagree_with_its_occurrence_id_is_refused():
    # GIVEN a version 1 body whose schedule version is not the one its id names
    data = json.loads(message_body(OCCURRENCE, {}))
    data["schedule_version"] = 4
    # THEN the worker's parse refuses it rather than act on either half
    with pytest.raises(ValidationError, match="does not name this schedule"):
        parse_message(json.dumps(data))


def test_a_body_that_is_not_json_is_refused():
    with pytest.raises(ValueError, match="Expecting value"):
        parse_message("not json")
