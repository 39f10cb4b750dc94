"""Deployment settings, read once from the environment (prefix ``PUNCTUAL_``) and passed down."""

from __future__ import annotations

from functools import cache
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

INDEX_MARGIN_SECONDS = 60


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PUNCTUAL_", frozen=True)

    schedules_table: str = "punctual-schedules"
    occurrences_table: str = "punctual-occurrences"
    tenants_table: str = "punctual-tenants"
    leases_table: str = "punctual-leases"
    idempotency_table: str = "punctual-idempotency"
    shard_count: int = Field(default=64, ge=1, le=4096)
    lookahead_seconds: int = Field(
        default=180, ge=0, le=600, description="How far ahead of due the materializer plans."
    )
    tick_seconds: int = Field(default=60, ge=1, le=300)
    retention_days: int = Field(default=30, ge=1, le=3650)
    reconcile_repair: bool = Field(
        default=True,
        description="The reconciler materializes what it finds MISSING (off: report only).",
    )
    queue_prefix: str = "punctual"
    operator_principals: Annotated[frozenset[str], NoDecode] = frozenset()
    version: str = "0.1.0"

    @field_validator("operator_principals", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return frozenset(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def planned_horizon_seconds(self) -> int:
        """How far ahead the API makes a change's fires itself: fires due within it may
        already be past the materializer's watermark, and the cursor goes after it."""
        # A tick walks whole minutes: up to the end of the minute holding tick + lookahead,
        # so up to 59 s past it, whatever the tick interval. The margin keeps the cursor a
        # minute clear of the next walk: the due index is eventually consistent, and a
        # cursor the walk reads before the index shows it would be left behind.
        return self.lookahead_seconds + max(self.tick_seconds, 60) + INDEX_MARGIN_SECONDS


@cache
def get_settings() -> Settings:
    return Settings()
