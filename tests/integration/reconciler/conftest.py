"""The fixtures of the reconciler's integration tests. Their settings have two shards instead of
eight, since each test walks every minute of its hours on each shard its schedules land in."""

from __future__ import annotations

import pytest

from punctual.settings import Settings


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Two shards, not eight: each test walks every minute of its hours on each shard its
    schedules land in (a moto update a minute), and two still cover its work across shards."""
    return settings.model_copy(update={"shard_count": 2})
