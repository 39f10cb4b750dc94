"""Materializer Lambda: one Step Functions Map iteration, {"tick": ISO, "shards": [ints]}."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from punctual.domain.drain import walk_drain
from punctual.domain.ids import minute_of
from punctual.observability import add_clock_skew, logger, metrics
from punctual.pipeline.materializer import Materializer
from punctual.services import COLLECTOR, Wiring
from punctual.timing import to_epoch

# Stop with this much time left (between transactions), so the lease is released and the
# watermark saved instead of a timeout killing the invocation mid-bucket.
SAFETY_MILLIS = 10_000


wiring = Wiring()
configure = wiring.configure  # tests and the local stack hand their services in


class TickRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tick: AwareDatetime
    shards: list[int] = Field(min_length=1, max_length=4096)


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = TickRequest.model_validate(event)
    materializer = Materializer(
        wiring.services(),
        holder=context.aws_request_id,
        out_of_time=lambda: context.get_remaining_time_in_millis() < SAFETY_MILLIS,
    )
    tick = to_epoch(request.tick)
    started = time.monotonic()
    # Big pages, thousands of steps: the collector runs less often, then collects everything
    # the invocation left (punctual.services.Collector)
    with COLLECTOR.tuned():
        reports = materializer.run(tick, request.shards)
    metrics.add_metric(
        name="MaterializeDuration",
        unit=MetricUnit.Milliseconds,
        value=(time.monotonic() - started) * 1000,
    )
    # Buckets (minutes) up to the planning horizon that this run left for the next tick:
    # 0 when the shards are caught up; growing means the materializer falls behind. After
    # an outage: how old the oldest bucket not walked yet is (0 while every walk is at or
    # ahead of the clock), and how long the slowest shard takes to catch up at this tick's
    # pace (punctual.domain.drain).
    walks = [r for r in reports if r.watermark is not None]
    planning = walk_drain(
        [r.watermark for r in walks if r.watermark is not None],
        [r.buckets for r in walks],
        minute_of(tick + materializer.settings.lookahead_seconds),
    )
    oldest = planning.oldest_due
    for name, seconds in (
        ("PlanningOldestAge", 0 if oldest is None else max(0, tick - oldest)),
        ("PlanningDrainSeconds", planning.drain_seconds),
    ):
        metrics.add_metric(name=name, unit=MetricUnit.Seconds, value=seconds)
    for name, value in (
        ("DueBacklog", planning.backlog),
        ("Occurrences", sum(r.occurrences for r in reports)),
        ("Missed", sum(r.missed for r in reports)),
        ("CursorConflicts", sum(r.conflicts for r in reports)),
        ("ShardsBusy", sum(not r.claimed and not r.out_of_time for r in reports)),
        ("ShardsOutOfTime", sum(r.out_of_time for r in reports)),
        ("LeasesLost", sum(r.lease_lost for r in reports)),
        ("MalformedItems", sum(r.malformed for r in reports)),
    ):
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    add_clock_skew("materializer", wiring.services().clock_offset())
    return {"shards": [asdict(r) for r in reports]}
