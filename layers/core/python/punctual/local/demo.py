"""`make run`'s demo: a few schedules of the demo tenant, created through the local API as
any client would, and a worker that prints each occurrence it handles with its lag."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from punctual.client import Client
from punctual.timing import utc_text

if TYPE_CHECKING:
    from punctual.local.stack import LocalStack
    from punctual.worker import Job


def print_occurrence(job: Job) -> None:
    """A handler that only reports: which occurrence, when it was due, how late it is."""
    now = time.time()
    due = job.message.available_at.timestamp()
    scheduled = job.message.scheduled_for.timestamp()
    local = datetime.now(UTC).strftime("%H:%M:%S")
    flexible = f", available {due - scheduled:+.0f} s (flexible)" if due != scheduled else ""
    print(
        f"[{local}] {job.message.payload.get('demo', job.message.schedule_id)}: "
        f"{job.occurrence_id} scheduled {utc_text(int(scheduled))}{flexible}, "
        f"handled {now - due:.2f} s after due, attempt {job.attempt}",
        flush=True,
    )


DEMO_SCHEDULES = (
    ("one-shot in 10 s", {"kind": "at"}, 0),
    (
        "every minute, Asia/Kolkata",
        {"kind": "cron", "expression": "* * * * *", "timezone": "Asia/Kolkata"},
        0,
    ),
    ("every 2 minutes, flexible 60 s", {"kind": "rate", "expression": "rate(2 minutes)"}, 60),
)


def run_demo(stack: LocalStack, stop: threading.Event) -> None:
    from punctual.scheduling import Services
    from punctual.worker import QueueConsumer, Worker

    assert stack.gateway is not None
    client = Client(stack.gateway.url, access_key_id="demo")
    for name, spec, flex in DEMO_SCHEDULES:
        if spec["kind"] == "at":
            spec = spec | {"at": utc_text(int(time.time()) + 10)}
        saved = client.post(
            "/v1/schedules",
            {
                "name": name,
                "spec": spec,
                "target": "default",
                "payload": {"demo": name},
                "flexible_window_seconds": flex,
            },
        )
        fires = ", ".join(f["utc"] for f in saved["next_fires"][:2]) or "materialized now"
        print(
            f"demo: created {saved['schedule']['schedule_id']} ({name}); next {fires}", flush=True
        )
    queue = client.get("/v1/targets")["targets"][0]["queue_url"]
    worker = Worker(Services.from_environment(), "demo", print_occurrence, heartbeat_seconds=20)
    print(f"demo: worker polling {queue}", flush=True)
    QueueConsumer(worker, queue, wait_seconds=5).run(stop)
