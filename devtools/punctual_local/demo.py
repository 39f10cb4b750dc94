"""`make run`'s demo: a few schedules of the demo tenant, created through the local API as
any client would, and a worker that prints each occurrence it handles with its lag."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

# Imported with this module, in the thread that starts the demo: not later in the demo's
# own thread, alongside other threads' imports (see stack.load_handlers).
from punctual.services import Services
from punctual.timing import utc_text
from punctual_client.commands import print_occurrence
from punctual_client.http import Client
from punctual_client.worker import QueueConsumer, Worker
from punctual_local.stack import DEMO_KEY, DEMO_TARGET, DEMO_TENANT

ONE_SHOT_SECONDS = 10
DEMO_SCHEDULES = (
    (f"one-shot in {ONE_SHOT_SECONDS} s", {"kind": "at"}, 0),
    (
        "every minute, Asia/Kolkata",
        {"kind": "cron", "expression": "* * * * *", "timezone": "Asia/Kolkata"},
        0,
    ),
    ("every 2 minutes, flexible 60 s", {"kind": "rate", "expression": "rate(2 minutes)"}, 60),
    # (a zone with clock changes: the console shows what the next one does to it)
    (
        "daily 02:30, America/New_York",
        {"kind": "cron", "expression": "30 2 * * *", "timezone": "America/New_York"},
        0,
    ),
)


def demo_schedules(client: Client) -> list[tuple[str, dict[str, Any]]]:
    """The demo's schedules: the ones a previous start made that are still ACTIVE (so a
    restart adds none beside them), the others made now. A one-shot whose time has passed
    is done (ACTIVE until the materializer completes it), so every start has a fresh one
    a few seconds ahead."""
    now = time.time()
    active = {
        s["name"]: s
        for s in client.pages("/v1/schedules", "schedules", state="ACTIVE")
        if s.get("payload", {}).get("demo") == s.get("name") and not _fired(s["spec"], now)
    }
    found: list[tuple[str, dict[str, Any]]] = []
    for name, spec, flex in DEMO_SCHEDULES:
        if name in active:
            found.append(("kept", active[name]))
            continue
        if spec["kind"] == "at":
            spec = spec | {"at": utc_text(int(time.time()) + ONE_SHOT_SECONDS)}
        saved = client.post(
            "/v1/schedules",
            {
                "name": name,
                "spec": spec,
                "target": DEMO_TARGET,
                "payload": {"demo": name},
                "flexible_window_seconds": flex,
            },
        )
        found.append(("created", saved["schedule"] | {"next_fires": saved["next_fires"]}))
    return found


def _fired(spec: dict[str, Any], now: float) -> bool:
    return spec["kind"] == "at" and datetime.fromisoformat(spec["at"]).timestamp() <= now


def demo_queue(client: Client) -> str:
    """The queue of the target the demo's schedules use, whatever other targets the tenant
    has (the README invites making some: `billing` lists before `default`)."""
    targets = client.get("/v1/targets")["targets"]
    for target in targets:
        if target["name"] == DEMO_TARGET:
            queue: str = target["queue_url"]
            return queue
    names = ", ".join(t["name"] for t in targets) or "none"
    raise LookupError(f"tenant {DEMO_TENANT} has no target {DEMO_TARGET} (it has {names})")


def run_demo(api_url: str, stop: threading.Event) -> None:
    """The demo's schedules, then a worker printing what arrives until ``stop``."""
    client = Client(api_url, access_key_id=DEMO_KEY)
    for how, schedule in demo_schedules(client):
        fires = [f["utc"] for f in schedule.get("next_fires", [])[:2]]
        # (next_run_at is the materializer's cursor, behind the clock after a restart)
        fires = fires or [schedule.get("next_fire_at") or "none left"]
        print(
            f"demo: {how} {schedule['schedule_id']} ({schedule['name']}); next {', '.join(fires)}",
            flush=True,
        )
    queue = demo_queue(client)
    worker = Worker(
        Services.from_environment(), DEMO_TENANT, print_occurrence, heartbeat_seconds=20
    )
    print(f"demo: worker polling {queue}", flush=True)
    # Short polls: Ctrl-C stops the worker (and then the engines) within a second.
    QueueConsumer(worker, queue, wait_seconds=1).run(stop)
