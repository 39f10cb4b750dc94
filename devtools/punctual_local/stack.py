"""`punctual local up`: the whole system on one machine, the same handler code.

Engines (own processes, data on disk): DynamoDB Local and roto's SQS. Drivers (threads
here): the HTTP gateway (API Gateway), the ticker (EventBridge + the Step Functions Map
over shard groups), the stream poller (the relay's event source mapping), the reconciler
on its schedule, and a watch that starts a dead engine again on its data. Everything AWS
would keep lives in the engines, so a crash of this process or of an engine loses
nothing: the stack (or `local up` again) carries on from the engines' data and the
materializer's watermarks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from punctual.domain.ids import shard_groups
from punctual.domain.occurrence import Lane
from punctual.integrations.streams import CATCHUP_WINDOW_SECONDS, ON_TIME_WINDOW_SECONDS
from punctual.observability import logger
from punctual.timing import utc_text
from punctual_client.logs import plain_logs
from punctual_local.dynamodb import listening
from punctual_local.engines import ACCOUNT, LOCAL_SHARDS, Engines, ensure_engines
from punctual_local.gateway import Gateway, LambdaContext
from punctual_local.sqs import queue_exists
from punctual_local.streams import StreamPoller

REPO = Path(__file__).resolve().parents[2]
# The data folder of `local up`, `local env`, `local down` and `stats` when --data is not
# given: $PUNCTUAL_LOCAL_DATA, else .data in the repo (a test's stack, or a second one, is
# then found by every command the README shows, as written).
DATA = Path(os.environ.get("PUNCTUAL_LOCAL_DATA") or REPO / ".data")
OPERATOR_KEY = "operator"
DEMO_KEY = "demo"
DEMO_TENANT = "demo"
DEMO_TARGET = "default"  # the demo tenant's target: the demo's schedules and worker use it
LOCK_FILE = "stack.lock"
GROUP_SIZE = 4
RECENT_WINDOW = 600  # seconds: the local reconciler's short windows, and how often it runs
WATCH_SECONDS = 1.0  # how soon a dead engine is started again


class StackError(Exception):
    """The stack cannot start; the message says why and what to do, in one line."""


def local_principal(access_key_id: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:user/{access_key_id}"


@dataclass
class StackOptions:
    # The Lambda handlers' root (functions/ of a checkout): the stack imports each handler
    # from there as Lambda does; it ships with none of them.
    functions: Path = REPO / "functions"
    port: int = 8766
    data: Path = DATA
    tick_seconds: int = 60
    lookahead_seconds: int = 180
    reconcile_seconds: int = RECENT_WINDOW
    poll_seconds: float = 0.5
    # The on-time relay mapping's batching window, as deployed (DeployConfig's default);
    # the API sends what it makes due sooner at once (ControlPlane._send_promptly).
    relay_window_seconds: int = ON_TIME_WINDOW_SECONDS


HANDLERS = (
    "api.handler",
    "materializer.handler",
    "relay.handler",
    "relay.catchup",
    "reconciler.handler",
)


def _handler(root: Path, module: str) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """A Lambda handler from the functions' ``root``, imported as Lambda imports it."""
    functions = str(root)
    if functions not in sys.path:
        sys.path.insert(0, functions)
    return importlib.import_module(module).lambda_handler  # type: ignore[no-any-return]


def _relay_handler(root: Path, module: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda event: _handler(root, module)(event, LambdaContext("relay", 60, time.time))


def lane_checkpoints(data: Path) -> dict[str | None, Path]:
    """Each lane's stream poller's checkpoint file. A stack that ran before the lanes had
    one poller, whose checkpoints (streams.json) the on-time lane keeps; the catch-up lane
    starts from a copy of them (what came before was sent), made before any poller runs:
    copied later, the on-time poller could have moved past catch-up records not yet sent."""
    on_time, catchup = data / "streams.json", data / "streams-catchup.json"
    if on_time.exists() and not catchup.exists():
        shutil.copyfile(on_time, catchup)
    return {None: on_time, Lane.CATCHUP.value: catchup}


def load_handlers(root: Path) -> list[str]:
    """Every handler under ``root`` imported now, in the calling thread, as each Lambda's init
    phase does. The stack's threads then find them imported: two threads importing modules
    that import each other (Powertools' do) can each see the other's half-made module and
    fail with an ImportError, which is how a request once failed in CI."""
    present = [m for m in HANDLERS if (root / m.replace(".", "/")).with_suffix(".py").exists()]
    for module in present:
        _handler(root, module)
    return present


def configure_environment(engines: Engines, options: StackOptions) -> None:
    """Point boto3 and the handlers at the engines, as the CDK stack's env vars do on AWS."""
    os.environ.update(engines.environment())
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    os.environ.update(
        {
            "PUNCTUAL_SHARD_COUNT": str(LOCAL_SHARDS),
            "PUNCTUAL_TICK_SECONDS": str(options.tick_seconds),
            "PUNCTUAL_LOOKAHEAD_SECONDS": str(options.lookahead_seconds),
            "PUNCTUAL_RELAY_WINDOW_SECONDS": str(options.relay_window_seconds),
            "PUNCTUAL_OPERATOR_PRINCIPALS": local_principal(OPERATOR_KEY),
            "POWERTOOLS_SERVICE_NAME": "punctual",
            "POWERTOOLS_METRICS_NAMESPACE": "Punctual",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"),
        }
    )
    plain_logs(os.environ["POWERTOOLS_LOG_LEVEL"])


def restore_queues(services: Any) -> list[str]:
    """Queues the tables name but the SQS engine lacks (a data folder from before the SQS
    engine kept its data), made again by the control plane's own queue admin under their
    stored names. Runs before anything grants on them. Returns the targets restored."""
    from punctual.control.plane import ControlPlane
    from punctual.dal.common import from_dynamo, values
    from punctual.dal.tenants import target_from_item

    plane = ControlPlane(services)
    # A scan: the local tenants table is small, and this runs once per start.
    pages = services.dynamodb.get_paginator("scan").paginate(
        TableName=services.settings.tenants_table,
        FilterExpression="begins_with(sk, :t)",
        ExpressionAttributeValues=values(t="TARGET#"),
    )
    restored = []
    for page in pages:
        for item in page["Items"]:
            target = target_from_item(from_dynamo(item))
            stored = (target.queue_url, target.dlq_url)
            if all(queue_exists(services.sqs, url) for url in stored):
                continue
            principals = plane.tenants.get(target.tenant_id).principals
            made = plane.queues.create(target.tenant_id, target.name, principals)
            if [_name(made.queue_url), _name(made.dlq_url)] != [_name(url) for url in stored]:
                raise StackError(
                    f"target {target.tenant_id}/{target.name}: its queue {_name(stored[0])} is "
                    f"missing and would now be named {_name(made.queue_url)}; start on a new "
                    "data folder (--data) or remove this one"
                )
            restored.append(f"{target.tenant_id}/{target.name}")
    return restored


def _name(queue_url: str) -> str:
    return queue_url.rsplit("/", 1)[-1]


def bootstrap(services: Any) -> list[str]:
    """Tables, lost queues restored, the operator's tenant-free principal, and the demo
    tenant with `default`; idempotent, so every start runs it on the same data."""
    from punctual.control.plane import ControlPlane
    from punctual.dal.tables import create_tables
    from punctual.domain.errors import Conflict
    from punctual.domain.tenancy import Quotas

    create_tables(services.dynamodb, services.settings)
    plane = ControlPlane(services)
    with contextlib.suppress(Conflict):
        plane.create_tenant(DEMO_TENANT, Quotas())
    restored = restore_queues(services)
    plane.bind_principal(local_principal(DEMO_KEY), DEMO_TENANT)
    with contextlib.suppress(Conflict):  # a restart on the same data
        plane.create_target(DEMO_TENANT, DEMO_TARGET)
    return restored


def claim(data: Path, holder: str) -> IO[str]:
    """One stack per data folder: an exclusive lock held as long as this process lives (the
    system drops it when the process dies, kill -9 included). The open file is the lock."""
    data.mkdir(parents=True, exist_ok=True)
    handle = (data / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise StackError(
            f"a local stack is already running on {data} ({holder}); stop it with Ctrl-C "
            "where it runs, or use it as it is"
        ) from None
    _write_holder(handle, holder)
    return handle


def _write_holder(lock: IO[str], holder: str) -> None:
    """Who holds the lock, for whoever finds it taken (and `local env`: the API's URL)."""
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}, {holder}")
    lock.flush()


def _api_holder(url: str) -> str:
    return f"API {url}"


_API_HOLDER = re.compile(r"pid (?P<pid>\d+), API (?P<url>http://\S+)")


@dataclass(frozen=True)
class RecordedApi:
    url: str
    serving: bool  # False: the stack that recorded it is gone (killed: its engines may run on)


def recorded_api(data: Path) -> RecordedApi | None:
    """The API the last `local up` on ``data`` served, as its lock file names it, and
    whether it still serves it: its process alive and its port answering."""
    try:
        text = (data / LOCK_FILE).read_text()
    except OSError:
        return None
    found = _API_HOLDER.fullmatch(text.strip())
    if found is None:
        return None
    url, pid = found["url"], int(found["pid"])
    try:
        os.kill(pid, 0)
        alive = True
    except PermissionError:  # someone else's process: alive
        alive = True
    except OSError:
        alive = False
    port = urlsplit(url).port
    return RecordedApi(url, alive and port is not None and listening(port))


def bind_gateway(port: int, functions: Path) -> Gateway:
    """The API's port, taken before any engine starts, so that a busy port costs nothing;
    the console is served on it too (``/console``), reading through the API."""
    from punctual_local.console import PREFIX, Console

    console = Console("", default_key=DEMO_KEY, operator_key=OPERATOR_KEY)
    try:
        gateway = Gateway(
            lambda event, context: _handler(functions, "api.handler")(event, context),
            port,
            time.time,
            pages=(PREFIX, console.answer),
        )
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        raise StackError(
            f"port {port} is already in use (another program, or a local stack on another "
            "data folder); choose another with --port"
        ) from None
    console.endpoint = gateway.url  # (the port bound: 0 picks one)
    return gateway


@dataclass
class LocalStack:
    options: StackOptions
    engines: Engines | None = None
    gateway: Gateway | None = None
    restored: list[str] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    ticks: int = 0
    _lock: IO[str] | None = None
    _serving: bool = False

    def start(self) -> None:
        """Everything, or nothing left running: a failed start stops what it started."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        options = self.options
        self._lock = claim(options.data, _api_holder(f"http://127.0.0.1:{options.port}"))
        self.gateway = bind_gateway(options.port, options.functions)
        if options.port == 0:  # the port the system picked
            _write_holder(self._lock, _api_holder(self.gateway.url))
        self.engines = ensure_engines(options.data)
        configure_environment(self.engines, options)
        from punctual.services import Services
        from punctual.settings import get_settings

        get_settings.cache_clear()
        # Before any thread starts (see load_handlers): the handlers, and the demo's worker.
        handlers = load_handlers(options.functions)
        importlib.import_module("punctual_local.demo")
        services = Services.from_environment()
        self.restored = bootstrap(services)
        self.gateway.start()
        self._serving = True
        self._loop("engine-watch", self._revive, WATCH_SECONDS)
        self._loop("ticker", self._tick, options.tick_seconds, aligned=True)
        # One poller per lane, as each lane has its own event source mapping (infra/relay.py).
        checkpoints = lane_checkpoints(options.data)
        lanes = (
            (None, "relay.handler", options.relay_window_seconds),
            (Lane.CATCHUP.value, "relay.catchup", CATCHUP_WINDOW_SECONDS),
        )
        for lane, module, window in lanes:
            poller = StreamPoller(
                services.dynamodb,
                _client("dynamodbstreams"),
                services.settings.occurrences_table,
                _relay_handler(options.functions, module),
                checkpoints[lane],
                lane=lane,
                window=window,
            )
            self._loop(f"stream-poller-{module}", poller.poll_once, options.poll_seconds)
        if "reconciler.handler" in handlers:
            self._loop("reconciler", self._reconcile, options.reconcile_seconds, aligned=True)

    def start_demo(self) -> None:
        """The demo's schedules and worker, in a thread that ``stop`` ends first."""
        from punctual_local.demo import run_demo

        assert self.gateway is not None
        url = self.gateway.url
        self._thread("demo", lambda: run_demo(url, self.stop_event))

    def _thread(self, name: str, run: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                run()
            except Exception:
                logger.exception(f"{name} stopped")

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _loop(
        self, name: str, work: Callable[[], Any], every: float, aligned: bool = False
    ) -> None:
        def run() -> None:
            while not self.stop_event.is_set():
                started = time.time()
                try:
                    work()
                except Exception:
                    logger.exception(f"{name} failed; it runs again next time")
                pause = (
                    every - (time.time() % every) if aligned else every - (time.time() - started)
                )
                self.stop_event.wait(max(0.05, pause))

        self._thread(name, run)

    def _revive(self) -> None:
        assert self.engines is not None
        for engine in self.engines.revive():
            logger.warning(
                f"the {engine.name} engine had stopped; started again on its data "
                f"({engine.endpoint}, pid {engine.pid})"
            )

    def _groups(self) -> list[list[int]]:
        return shard_groups(LOCAL_SHARDS, GROUP_SIZE)

    def _tick(self) -> None:
        """What EventBridge + the Map do each tick: one materializer call per shard group."""
        tick = utc_text(int(time.time()) // self.options.tick_seconds * self.options.tick_seconds)
        handler = _handler(self.options.functions, "materializer.handler")
        timeout = min(55, self.options.tick_seconds * 0.9)
        with ThreadPoolExecutor(max_workers=len(self._groups())) as pool:
            list(
                pool.map(
                    lambda shards: handler(
                        {"tick": tick, "shards": shards},
                        _Stoppable("materializer", timeout + 10, self.stop_event),
                    ),
                    self._groups(),
                )
            )
        self.ticks += 1

    def _reconcile(self) -> None:
        """The hourly run as on AWS (its hour, and any earlier one without a report), and,
        since a local run is short-lived, the ten minutes that ended ten minutes ago: recent
        fires are checked, and what no worker took is re-sent, within about half an hour."""
        handler = _handler(self.options.functions, "reconciler.handler")
        now = int(time.time())
        end = now - now % RECENT_WINDOW - RECENT_WINDOW
        recent = {"window_start": utc_text(end - RECENT_WINDOW), "window_end": utc_text(end)}
        for shards in self._groups():
            for event in ({}, recent):
                if self.stop_event.is_set():
                    return
                context = _Stoppable("reconciler", 900, self.stop_event)
                handler({"time": utc_text(now), "shards": shards, **event}, context)

    def stop(self) -> None:
        """Drivers and the demo worker first (they use the engines), then the engines."""
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=70)
        if self.gateway is not None:
            if self._serving:
                self.gateway.stop()
            else:
                self.gateway.server.server_close()  # bound, never served
        if self.engines is not None:
            self.engines.stop()
        if self._lock is not None:
            self._lock.close()


class _Stoppable(LambdaContext):
    """A Lambda context whose time runs out as soon as the stack is stopping: the
    materializer and the reconciler then stop between steps, as at a Lambda timeout,
    instead of holding up the stop (a reconcile pass checks two days of hours)."""

    def __init__(self, function_name: str, timeout_seconds: float, stopping: threading.Event):
        super().__init__(function_name, timeout_seconds, time.time)
        self._stopping = stopping

    def get_remaining_time_in_millis(self) -> int:
        return 0 if self._stopping.is_set() else super().get_remaining_time_in_millis()


def _client(service: str) -> Any:
    import boto3

    return boto3.client(service)
