"""Deployment settings, read once from the environment (prefix ``PUNCTUAL_``) and passed down."""

from __future__ import annotations

from functools import cache
from typing import Annotated

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from punctual.domain.principals import normalize_principal

INDEX_MARGIN_SECONDS = 60


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PUNCTUAL_", frozen=True)

    schedules_table: str = "punctual-schedules"
    occurrences_table: str = "punctual-occurrences"
    tenants_table: str = "punctual-tenants"
    leases_table: str = "punctual-leases"
    idempotency_table: str = "punctual-idempotency"
    ledger_table: str = "punctual-ledger"
    shard_count: int = Field(default=64, ge=1, le=4096)
    lookahead_seconds: int = Field(
        default=180, ge=0, le=600, description="How far ahead of due the materializer plans."
    )
    tick_seconds: int = Field(default=60, ge=1, le=300)
    retention_days: int = Field(default=30, ge=1, le=3650)
    # The on-time relay mapping's MaximumBatchingWindowInSeconds: it waits up to this long
    # to fill a batch (fewer invocations, fewer log lines). An occurrence the API makes
    # receivable sooner than this (plus a margin) is also sent by the API at once
    # (ControlPlane._send_promptly). 0: no window, nothing sent by the API.
    relay_window_seconds: int = Field(default=0, ge=0, le=60)
    # When the relay's stream mappings were made (the stack's RelayStart resource, at its
    # creation and whenever the mappings are made anew): a new mapping reads the stream
    # from its oldest record, up to a day back. An occurrence inserted before this instant
    # and due before it was sent by the mappings before, or (they were gone or behind) is
    # left to the reconciler's re-send; it is not sent again at once (punctual.pipeline.relay).
    # None: no such instant (the local stack's pollers keep their place in files).
    relay_started_at: int | None = Field(default=None, ge=0)
    reconcile_repair: bool = Field(
        default=True,
        description="The reconciler materializes what it finds MISSING (off: report only).",
    )
    queue_prefix: str = Field(
        default="punctual",
        pattern=r"^[A-Za-z0-9-]{1,13}$",
        description="Begins every target queue's name (which SQS limits to 80 characters).",
    )
    # Where the tables and queues live, for the IAM policies Punctual writes for tenants'
    # workers (the deployed stack sets the account; Lambda sets AWS_REGION).
    account_id: str = Field(default="000000000000", pattern=r"^\d{12}$")
    region: str = Field(
        default="us-east-1",
        validation_alias=AliasChoices("region", "PUNCTUAL_REGION", "AWS_REGION"),
    )
    partition: str = Field(default="aws", pattern=r"^aws[a-z-]*$")
    # The two lanes' relay functions: the re-drive tells which lane's stream batch failed
    # by them (unknown: every lane's records of the batch are re-sent).
    relay_function: str = ""
    catchup_relay_function: str = ""
    operator_principals: Annotated[frozenset[str], NoDecode] = frozenset()
    version: str = "0.1.0"

    @field_validator("operator_principals", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return frozenset(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("operator_principals")
    @classmethod
    def _bound_spelling(cls, value: frozenset[str]) -> frozenset[str]:
        """Operators under the spelling callers are matched in (punctual.domain.principals): a role
        session or a path in an entry would otherwise never match. A bad entry fails here,
        at start, not at the first admin call."""
        return frozenset(normalize_principal(arn) for arn in value)

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
