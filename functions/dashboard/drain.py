"""The dashboard's drain widget, a CloudWatch custom widget: the delivery backlog (messages
waiting in the tenants' queues) overall and for the largest tenants, each with its oldest
due time and its drain time (punctual.domain.drain.queue_drain over the queues' SQS metrics,
punctual.integrations.queue_metrics). CloudWatch invokes it as the dashboard renders and
shows the HTML it answers."""

from __future__ import annotations

from html import escape
from typing import Any

import boto3
from aws_lambda_powertools.utilities.typing import LambdaContext

from punctual.domain.drain import NOT_DRAINING, Drain, largest, queue_drain
from punctual.integrations.queue_metrics import MINUTE, QueueMetrics
from punctual.observability import logger
from punctual.services import Services, Wiring
from punctual.timing import utc_text

WINDOW = 300  # seconds of deletes and sends the rates are measured over
# CloudWatch may still be taking in the last minutes' datapoints: the window ends earlier.
INGESTION = 120
LARGEST = 5

DESCRIPTION = """\
**Delivery backlog and drain time** (docs/operations.md, *Backlog and drain*).

Messages waiting or in flight in the tenants' queues, the due time of the oldest (its age
in the queue), the rates workers deleted and the relay sent messages over five minutes, and
the time the backlog takes to clear at that pace: backlog / (deleted - sent). *not
draining*: it does not shrink; *over a day*: it shrinks, slower. Overall (every tenant
queue among the 500 largest by each figure) and the 5 tenants with the largest backlog
(their targets summed, each queue read by name); DLQs left out.
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


def _eta(drain: Drain) -> str:
    if not drain.backlog:
        return "empty"
    if drain.drain_seconds < NOT_DRAINING:
        return _duration(drain.drain_seconds)
    shrinking = drain.processed_per_second > drain.arriving_per_second
    return "over a day" if shrinking else "not draining"


def _row(name: str, drain: Drain, at: int) -> str:
    if drain.oldest_due is None:
        oldest = "-"
    else:
        oldest = f"{utc_text(drain.oldest_due)} ({_duration(max(0, at - drain.oldest_due))} old)"
    cells = (
        name,
        str(drain.backlog),
        oldest,
        f"{drain.processed_per_second * 60:.1f}",
        f"{drain.arriving_per_second * 60:.1f}",
        _eta(drain),
    )
    return "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>"


def render(overall: Drain, tenants: list[tuple[str, Drain]], at: int, *, found: bool) -> str:
    header = "".join(
        f"<th>{title}</th>"
        for title in (
            "tenant",
            "backlog",
            "oldest due (UTC)",
            "deleted/min",
            "sent/min",
            "drain time",
        )
    )
    rows = [_row("all tenants", overall, at)]
    rows += [_row(tenant, drain, at) for tenant, drain in tenants]
    note = "" if found else "<p>No SQS metrics of a tenant queue in this time range.</p>"
    return (
        f"<table><tr>{header}</tr>{''.join(rows)}</table>{note}"
        f"<p>as of {utc_text(at)} (the minutes before; CloudWatch's last two left out)</p>"
    )


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
    end = now - now % MINUTE - INGESTION
    start = end - WINDOW
    metrics = wiring.built(_metrics)
    # Every tenant queue from the survey (for the sums), then the largest tenants' queues
    # read by name (their rows exact, whatever crowds the survey's lists).
    surveyed = metrics.survey(start, end)
    _, tenants = queue_drain(
        ((tenant, f) for (tenant, _), f in surveyed.items()), now=end, window=WINDOW
    )
    largest_ = {tenant for tenant, _ in largest(tenants, LARGEST)}
    exact = metrics.exact([name for tenant, name in surveyed if tenant in largest_], start, end)
    queues = [(tenant, exact.get(name, f)) for (tenant, name), f in surveyed.items()]
    overall, tenants = queue_drain(queues, now=end, window=WINDOW)
    # (the rows: of those read by name only, the ones with a backlog still)
    rows = largest({t: d for t, d in tenants.items() if t in largest_}, LARGEST)
    return render(overall, rows, end, found=bool(surveyed))
