"""The dashboard's drain widget, a CloudWatch custom widget: the delivery backlog (messages
waiting in the tenants' queues) overall and for the largest tenants, each with its oldest
due time and its drain time (punctual.drain.queue_drain over the queues' SQS metrics,
punctual.integrations.queue_metrics). CloudWatch invokes it as the dashboard renders and
shows the HTML it answers."""

from __future__ import annotations

from html import escape
from typing import Any

import boto3
from aws_lambda_powertools.utilities.typing import LambdaContext

from punctual.drain import NOT_DRAINING, Drain, largest, queue_drain
from punctual.integrations.queue_metrics import QueueMetrics
from punctual.observability import logger
from punctual.services import Services, Wiring
from punctual.timing import utc_text

WINDOW = 300  # seconds of deletes and sends the rates are measured over
LARGEST = 5

DESCRIPTION = """\
**Delivery backlog and drain time** (docs/operations.md, *Backlog and drain*).

Messages waiting in the tenants' queues, the due time of the oldest (its age in the queue),
the rates workers deleted and the relay sent messages over the last 5 minutes, and the
time the backlog takes to clear at that pace: waiting / (deleted - sent). *not draining*:
it does not shrink. Overall (every tenant queue among the 500 largest by each figure) and
the 5 tenants with most messages waiting (their targets summed); DLQs left out.
"""

wiring = Wiring()
configure = wiring.configure  # tests hand their services in


def _metrics(services: Services) -> QueueMetrics:
    return QueueMetrics(boto3.client("cloudwatch"), services.settings.queue_prefix)


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def _row(name: str, drain: Drain, now: int) -> str:
    if drain.oldest_due is None:
        oldest = "-"
    else:
        oldest = f"{utc_text(drain.oldest_due)} ({_duration(max(0, now - drain.oldest_due))} ago)"
    if not drain.backlog:
        eta = "empty"
    elif drain.drain_seconds >= NOT_DRAINING:
        eta = "not draining"
    else:
        eta = _duration(drain.drain_seconds)
    cells = (
        name,
        str(drain.backlog),
        oldest,
        f"{drain.processed_per_second * 60:.1f}",
        f"{drain.arriving_per_second * 60:.1f}",
        eta,
    )
    return "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>"


def render(overall: Drain, tenants: list[tuple[str, Drain]], now: int) -> str:
    header = "".join(
        f"<th>{title}</th>"
        for title in (
            "tenant",
            "waiting",
            "oldest due (UTC)",
            "deleted/min",
            "sent/min",
            "drain time",
        )
    )
    rows = [_row("all tenants", overall, now)]
    rows += [_row(tenant, drain, now) for tenant, drain in tenants]
    return f"<table><tr>{header}</tr>{''.join(rows)}</table><p>as of {utc_text(now)}</p>"


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> str:
    if event.get("describe"):
        return DESCRIPTION
    services = wiring.services()
    now = int(services.now())
    # The dashboard's time range ending in the past: the backlog as it was then.
    shown = event.get("widgetContext", {}).get("timeRange", {}).get("end")
    if shown is not None:
        now = min(now, int(shown) // 1000)
    queues = wiring.built(_metrics).tenant_queues(now=now, window=WINDOW)
    overall, tenants = queue_drain(queues, now=now, window=WINDOW)
    return render(overall, largest(tenants, LARGEST), now)
