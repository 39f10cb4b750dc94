"""What a schedule does with a late fire, an overlapping run and a failed attempt."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from punctual.domain.fields import Record, StrictCount, whole

DEFAULT_CATCHUP_LIMIT = 10


class MisfireAction(StrEnum):
    SKIP = "SKIP"  # record MISSED, fire nothing
    FIRE_ONCE = "FIRE_ONCE"  # fire only the latest missed instant
    CATCHUP = "CATCHUP"  # fire at most catchup_limit latest instants, paced


class MisfirePolicy(Record):
    model_config = ConfigDict(
        json_schema_extra={
            # What the validator below holds, said in the schema: a catchup_limit only with
            # action CATCHUP (schema-valid requests are then all accepted: issue 46).
            "anyOf": [
                {"properties": {"catchup_limit": {"type": "null"}}},
                {"required": ["action"], "properties": {"action": {"const": "CATCHUP"}}},
            ]
        }
    )

    action: MisfireAction = MisfireAction.FIRE_ONCE
    max_lateness_seconds: StrictCount = Field(
        default=300, ge=0, le=7 * 86400, description="Later than this counts as a misfire."
    )
    catchup_limit: (
        Annotated[int, Field(strict=True, ge=1, le=1000), BeforeValidator(whole)] | None
    ) = Field(default=None, description="Only for CATCHUP; default 10.")

    @model_validator(mode="after")
    def _limit_only_for_catchup(self) -> Self:
        if self.catchup_limit is not None and self.action is not MisfireAction.CATCHUP:
            raise ValueError("catchup_limit applies only when action is CATCHUP")
        return self

    @property
    def effective_catchup_limit(self) -> int:
        """How many of the latest missed fires CATCHUP fires (1 for FIRE_ONCE, 0 for SKIP)."""
        if self.action is MisfireAction.CATCHUP:
            return self.catchup_limit or DEFAULT_CATCHUP_LIMIT
        return 1 if self.action is MisfireAction.FIRE_ONCE else 0


class OverlapPolicy(StrEnum):
    """What an occurrence does while an earlier one of its schedule runs: run anyway; be
    SKIPPED_OVERLAP; or wait for it, one at a time (a later one that finds another already
    waiting is SKIPPED_OVERLAP)."""

    ALLOW = "ALLOW"
    SKIP_IF_RUNNING = "SKIP_IF_RUNNING"
    QUEUE_ONE = "QUEUE_ONE"


class RetryPolicy(Record):
    """Transient failures back off exponentially with full jitter within these bounds."""

    # At most 20, below the target queue's redrive count (25): see integrations/queues.py.
    max_attempts: StrictCount = Field(default=3, ge=1, le=20)
    backoff_base_seconds: StrictCount = Field(default=10, ge=1, le=3600)
    backoff_max_seconds: StrictCount = Field(default=900, ge=1, le=43200)
    deadline_seconds: StrictCount = Field(
        default=86400,
        ge=60,
        le=14 * 86400,
        description="No attempt starts later than available_at + deadline (when the "
        "occurrence became receivable: a late fire released by the misfire policy counts "
        "from its release).",
    )

    @model_validator(mode="after")
    def _base_below_max(self) -> Self:
        if self.backoff_base_seconds > self.backoff_max_seconds:
            raise ValueError("backoff_base_seconds must not exceed backoff_max_seconds")
        return self
