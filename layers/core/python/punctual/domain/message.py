"""The occurrence message, version 1 (docs/message.md): what the relay sends to a tenant's
queue and what a worker reads from it, in one place."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from punctual.domain.ids import occurrence_parts
from punctual.domain.occurrence import Occurrence
from punctual.timing import utc_text

MESSAGE_VERSION = 1


class Message(BaseModel):
    """The occurrence message, version 1 (docs/message.md)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: int
    occurrence_id: str
    schedule_id: str
    schedule_version: int
    tenant_id: str
    target: str
    scheduled_for: datetime
    available_at: datetime
    attempt: int
    payload: dict[str, Any]

    @model_validator(mode="after")
    def _id_names_this_occurrence(self) -> Message:
        """The id encodes (schedule, version, instant): a body whose fields disagree with it
        was not written by the relay, and the claim must not act on either half."""
        named = occurrence_parts(self.occurrence_id)  # ValueError: not an occurrence id
        instant = int(self.scheduled_for.timestamp())
        if named != (self.schedule_id, self.schedule_version, instant):
            raise ValueError("occurrence_id does not name this schedule, version and instant")
        return self


def message_body(occurrence: Occurrence, payload: dict[str, Any]) -> str:
    """The body the relay sends."""
    return json.dumps(
        {
            "version": MESSAGE_VERSION,
            "occurrence_id": occurrence.occurrence_id,
            "schedule_id": occurrence.schedule_id,
            "schedule_version": occurrence.schedule_version,
            "tenant_id": occurrence.tenant_id,
            "target": occurrence.target,
            "scheduled_for": utc_text(occurrence.scheduled_for),
            "available_at": utc_text(occurrence.available_at),
            "attempt": occurrence.attempt_count + 1,
            "payload": payload,
        },
        separators=(",", ":"),
    )


def parse_message(body: str) -> Message:
    """A received body; ValueError (or pydantic's ValidationError) when it is not a
    version 1 occurrence message."""
    data = json.loads(body)
    if not isinstance(data, dict) or data.get("version") != MESSAGE_VERSION:
        raise ValueError(f"not a version {MESSAGE_VERSION} occurrence message")
    return Message.model_validate(data)
