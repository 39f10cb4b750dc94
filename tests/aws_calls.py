"""What Punctual's own code does on AWS, recorded while the integration tests run.

Every boto3 call passes botocore's ``before-parameter-build`` event; the recorder gives it to
the function whose code made it (the outermost entry point above the call, a handler
package or the logic class it calls, up to the test code that called it) and spells it as
the IAM actions and resources it needs. Every EMF metric is captured as Powertools
serializes it. Calls and metrics the tests make themselves (table setup, assertions) belong
to no function and are left out.

The result is the inventory (``tests/infrastructure/inventory.txt``): what each function
calls and emits. ``tests/infrastructure/test_inventory.py`` holds the synthesized roles,
alarms and dashboard to it, and checks at the end of a run that it is what the tests
recorded. ``make inventory`` rewrites it from a run of the integration tests.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlparse

import boto3
import pytest
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import (
    AmazonCloudWatchEMFProvider,
)
from botocore import handlers, xform_name
from botocore.exceptions import ParamValidationError

from punctual.dal.tables import ALL_TABLES
from punctual.settings import Settings

INVENTORY = Path(__file__).parent / "infrastructure" / "inventory.txt"
WRITE_ENV = "PUNCTUAL_WRITE_INVENTORY"
# `make test` splits the integration tests over two processes: each writes what it recorded
# there, and `python -m tests.aws_calls FILE...` compares their union with the inventory.
RECORD_ENV = "PUNCTUAL_RECORD_TO"

# Where each function's code starts: (path fragment, qualified-name prefix or "" for any).
# The logic classes count too, because most tests drive them without the handler. Module
# functions of those files do not: tests call some of them directly (read_reports).
ENTRY_POINTS: tuple[tuple[str, str, str], ...] = (
    ("/functions/api/", "", "api"),
    ("/punctual/control/plane.py", "ControlPlane.", "api"),
    ("/functions/materializer/", "", "materializer"),
    ("/punctual/pipeline/materializer.py", "Materializer.", "materializer"),
    ("/functions/relay/redrive.py", "", "redrive"),
    ("/punctual/pipeline/redrive.py", "StreamRedrive.", "redrive"),
    ("/functions/dashboard/drain.py", "", "drain"),
    ("/punctual/integrations/queue_metrics.py", "QueueMetrics.", "drain"),
    ("/functions/relay/", "", "relay"),
    ("/punctual/pipeline/relay.py", "Relay.", "relay"),
    ("/functions/reconciler/", "", "reconciler"),
    ("/punctual/pipeline/reconciler.py", "Reconciler.", "reconciler"),
    # Tenants' workers (the SDK); they run under the tenant's roles, not this stack's.
    ("/punctual_client/worker/", "", "worker"),
    ("/punctual/dal/effects.py", "EffectLedger.", "worker"),
)
FUNCTIONS = ("api", "materializer", "relay", "redrive", "reconciler", "drain")

_DEFAULTS = Settings.model_construct()  # the deployed defaults, whatever the environment says
TABLE_NAMES = {spec.setting: spec.name(_DEFAULTS) for spec in ALL_TABLES}
QUEUES = f"{_DEFAULTS.queue_prefix}-*"  # every tenant queue, as the roles name them


@dataclass(frozen=True, order=True)
class Call:
    """One IAM action on one resource, relative to the service's ARN prefix:
    ``table/punctual-schedules/index/due`` (DynamoDB), ``punctual-*`` (SQS)."""

    function: str
    action: str  # "dynamodb:Query"
    resource: str

    def line(self) -> str:
        return f"call {self.function} {self.action} {self.resource}"


@dataclass(frozen=True, order=True)
class Emitted:
    """One EMF metric: namespace, name and its dimensions (``key=value`` joined by ',')."""

    function: str
    namespace: str
    name: str
    dimensions: str

    def line(self) -> str:
        return f"metric {self.function} {self.namespace} {self.name} {self.dimensions}"


def parse_inventory(text: str) -> tuple[set[Call], set[Emitted]]:
    calls: set[Call] = set()
    metrics: set[Emitted] = set()
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, *parts = line.split()
        if kind == "call" and len(parts) == 3:
            calls.add(Call(*parts))
        elif kind == "metric" and len(parts) == 4:
            metrics.add(Emitted(*parts))
        else:
            raise ValueError(f"inventory line not understood: {raw!r}")
    return calls, metrics


def read_inventory(path: Path = INVENTORY) -> tuple[set[Call], set[Emitted]]:
    return parse_inventory(path.read_text(encoding="utf-8"))


# --- attribution ----------------------------------------------------------------------------

_inherited = threading.local()


_ROOT = Path(__file__).resolve().parent.parent
_TESTS = f"{_ROOT / 'tests'}{os.sep}"
_CODE = tuple(f"{_ROOT / root}{os.sep}" for root in ("layers", "clients", "devtools", "functions"))
_SELF = str(Path(__file__).resolve())


def function_of(frame: FrameType | None, operation: str | None = None) -> str | None:
    """The function whose code made the call: the outermost entry point among the project
    frames above it, up to the first test frame (test code called that code; a test
    callback invoked by a function starts a new run of frames). A spy wrapping the client,
    a test frame nearest to the call with the operation's own name, is looked through. No
    entry point before a test frame: the test's own call (None). In a pool thread, the
    submitting thread's function when no test frame intervenes (whatever the pool runs
    there is that function's work, even code that is another function's entry point)."""
    found = None
    nearest = True
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if path.startswith(_TESTS) and path != _SELF:
            if not (nearest and code.co_name == operation):
                return found
        elif path.startswith(_CODE):
            nearest = False
            posix = path.replace(os.sep, "/")
            for fragment, prefix, function in ENTRY_POINTS:
                if fragment in posix and code.co_qualname.startswith(prefix):
                    found = function
                    break
        frame = frame.f_back
    inherited: str | None = getattr(_inherited, "function", None)
    return inherited or found


def _submit_keeping_attribution(original: Callable[..., Any]) -> Callable[..., Any]:
    def submit(pool: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kw: Any) -> Any:
        function = function_of(sys._getframe(1))

        def run() -> Any:
            _inherited.function = function
            try:
                return fn(*args, **kw)
            finally:
                _inherited.function = None

        return original(pool, run)

    return submit


# --- IAM spelling of API calls --------------------------------------------------------------


def _table(name: str) -> str:
    """A table by its deployed name: the tests' own names end with the setting's name."""
    for setting, deployed in TABLE_NAMES.items():
        if name == deployed or name.endswith(f"-{setting}"):
            return f"table/{deployed}"
    return f"table/{name}"


def _queue(name: str) -> str:
    return QUEUES if name.startswith(QUEUES[:-1]) else name


_TRANSACT = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}
# Batch calls are authorized as their single-message action.
_SQS_ACTIONS = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}


def iam_requests(service: str, operation: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    """The (action, resource) pairs IAM checks for one API call."""
    if service == "dynamodb":
        if operation in ("TransactWriteItems", "TransactGetItems"):
            # No Transact* action exists: each item is authorized as its own operation.
            return [
                (f"dynamodb:{_TRANSACT[kind]}", _table(body["TableName"]))
                for item in params["TransactItems"]
                for kind, body in item.items()
            ]
        if operation in ("BatchGetItem", "BatchWriteItem"):
            return [(f"dynamodb:{operation}", _table(name)) for name in params["RequestItems"]]
        resource = _table(params["TableName"])
        if params.get("IndexName"):
            resource += f"/index/{params['IndexName']}"
        return [(f"dynamodb:{operation}", resource)]
    if service == "dynamodbstreams":
        # A stream by its table: its label (the creation time) is unknown before deploy.
        # GetRecords names it only through its iterator, which DynamoDB Local spells as the
        # stream ARN with a position (on AWS it is opaque, and IAM checks the stream).
        arn = params.get("StreamArn") or params["ShardIterator"]
        table = arn.split(":table/", 1)[1].split("/stream/", 1)[0]
        return [(f"dynamodb:{operation}", f"{_table(table)}/stream/*")]
    if service == "sqs":
        if "QueueUrl" in params:
            name = urlparse(params["QueueUrl"]).path.rsplit("/", 1)[-1]
        else:
            name = params["QueueName"]
        requests = [(f"sqs:{_SQS_ACTIONS.get(operation, operation)}", _queue(name))]
        if operation == "CreateQueue" and params.get("tags"):
            requests.append(("sqs:TagQueue", _queue(name)))
        return requests
    if service == "cloudwatch" and operation == "GetMetricData":
        return [("cloudwatch:GetMetricData", "*")]  # no resource-level permissions
    raise AssertionError(
        f"{service}:{operation} is a service the recorder cannot spell yet: teach "
        "tests/aws_calls.py.iam_requests its actions and resources"
    )


# --- the recorder ---------------------------------------------------------------------------


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]


def _recording() -> bool:
    """Only the integration tests' calls: `make inventory` runs those alone."""
    return _current_test().startswith("tests/integration/")


@dataclass
class Recorder:
    calls: set[Call] = field(default_factory=set)
    metrics: set[Emitted] = field(default_factory=set)
    # The first test that made each call or emitted each metric (the inventory shows it).
    witnesses: dict[Call | Emitted, str] = field(default_factory=dict)
    # Metric name -> the function that added it, until the set is serialized (Powertools
    # flushes after the handler returned, when its frames are gone).
    _adding: dict[str, str] = field(default_factory=dict)
    active: bool = False
    # Every integration test is in this session: then an inventory entry nothing recorded
    # is stale (tests/infrastructure/conftest.py decides at collection).
    complete: bool = False

    def on_call(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if not _recording():
            return
        # Any call, whoever makes it: AWS refuses such a request (ValidationException), the
        # emulators accept it. (Before attribution, which needs the repo's layout: `make
        # mutate` runs the tests on a flat copy of the code, and must see it too.)
        wrong = enum_violations(model.input_shape, params)
        if wrong:
            raise ParamValidationError(report=f"{model.name}: {'; '.join(wrong)}")
        function = function_of(sys._getframe(), xform_name(model.name))
        if function is None:
            return
        service = model.service_model.service_name
        for action, resource in iam_requests(service, model.name, params):
            self._add(self.calls, Call(function, action, resource))

    def _add(self, found: set[Any], entry: Call | Emitted) -> None:
        if entry not in found:
            found.add(entry)
            self.witnesses.setdefault(entry, _current_test())

    def on_add_metric(self, name: str) -> None:
        if not _recording():
            return
        function = function_of(sys._getframe())
        if function is not None:
            self._adding[name.strip()] = function

    def on_serialized(self, blob: dict[str, Any]) -> None:
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            for keys in directive["Dimensions"]:
                dimensions = ",".join(f"{key}={blob[key]}" for key in sorted(keys))
                for metric in directive["Metrics"]:
                    function = self._adding.get(metric["Name"])
                    if function is not None:
                        self._add(
                            self.metrics,
                            Emitted(function, directive["Namespace"], metric["Name"], dimensions),
                        )
        self._adding.clear()

    def lines(self) -> list[str]:
        entries: list[Call | Emitted] = [*sorted(self.calls), *sorted(self.metrics)]
        return [f"{entry.line():<78} # {self.witnesses[entry]}" for entry in entries]


RECORDER = Recorder()


def whole_integration_suite(
    config: pytest.Config, items: list[pytest.Item], deselected: list[pytest.Item]
) -> bool:
    """Whether every test of tests/integration is selected in this session."""
    directory = _ROOT / "tests" / "integration"

    def inside(item: pytest.Item) -> bool:
        return directory in Path(item.path).parents

    return (
        {Path(item.path) for item in items if inside(item)} == set(directory.rglob("test_*.py"))
        and not any(inside(item) for item in deselected)
        # (a single test named on the command line narrows the suite; one outside it does not)
        and not any(
            "::" in str(arg)
            and directory
            in (config.invocation_params.dir / str(arg).split("::")[0]).resolve().parents
            for arg in config.args
        )
    )


_HEADER = """\
# What each function's code calls on AWS and which metrics it emits, as the integration
# tests exercise it. `make inventory` rewrites this file from a run of them; a test fails
# when it is stale. Each function's role must allow exactly its calls (test_inventory.py).
#   call <function> <iam action> <resource: DynamoDB table/..., SQS queue name or pattern>
#   metric <function> <namespace> <name> <dimensions>
# After '#': the first test that made the call or emitted the metric.
# 'worker' is the worker SDK, which runs under tenants' roles, not this stack's.
"""


def enum_violations(shape: Any, value: Any, path: str = "") -> list[str]:
    """The request's values that its operation's model allows only from a list (an enum:
    ReturnValuesOnConditionCheckFailure, ReturnValues, Select...) and that are not in it.
    Botocore does not check enums and neither do DynamoDB Local and moto, but AWS does:
    a misspelled ``ALL_OLD`` fails every such call there."""
    if shape is None:
        return []
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        return [
            found
            for key, item in value.items()
            if key in shape.members
            for found in enum_violations(shape.members[key], item, f"{path}.{key}")
        ]
    if kind == "list" and isinstance(value, list):
        return [
            found
            for n, item in enumerate(value)
            for found in enum_violations(shape.member, item, f"{path}[{n}]")
        ]
    if kind == "map" and isinstance(value, dict):
        return [
            found
            for key, item in value.items()
            for found in enum_violations(shape.value, item, f"{path}.{key}")
        ]
    allowed = getattr(shape, "enum", None)
    if kind == "string" and allowed and value not in allowed:
        return [f"{path.lstrip('.')} = {value!r}, not one of {', '.join(allowed)}"]
    return []


@pytest.fixture(scope="session", autouse=True)
def record_aws_calls() -> Iterator[Recorder]:
    """Installed for the whole session once an integration test runs."""
    hook = ("before-parameter-build", RECORDER.on_call)
    handlers.BUILTIN_HANDLERS.append(hook)
    # Sessions made before now lack the hook: boto3's default one is made again on use.
    boto3.DEFAULT_SESSION = None
    add_metric = AmazonCloudWatchEMFProvider.add_metric
    serialize = AmazonCloudWatchEMFProvider.serialize_metric_set
    submit = ThreadPoolExecutor.submit

    def adding(provider: Any, name: str, *args: Any, **kwargs: Any) -> None:
        RECORDER.on_add_metric(name)
        add_metric(provider, name, *args, **kwargs)

    def serializing(provider: Any, *args: Any, **kwargs: Any) -> Any:
        blob = serialize(provider, *args, **kwargs)
        RECORDER.on_serialized(dict(blob))
        return blob

    AmazonCloudWatchEMFProvider.add_metric = adding  # type: ignore[method-assign,assignment]
    AmazonCloudWatchEMFProvider.serialize_metric_set = serializing  # type: ignore[method-assign,assignment]
    ThreadPoolExecutor.submit = _submit_keeping_attribution(submit)  # type: ignore[method-assign]
    RECORDER.active = True
    try:
        yield RECORDER
    finally:
        RECORDER.active = False
        ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]
        AmazonCloudWatchEMFProvider.serialize_metric_set = serialize  # type: ignore[method-assign]
        AmazonCloudWatchEMFProvider.add_metric = add_metric  # type: ignore[method-assign]
        handlers.BUILTIN_HANDLERS.remove(hook)
        boto3.DEFAULT_SESSION = None
        if os.environ.get(WRITE_ENV):
            INVENTORY.write_text(_HEADER + "\n".join(RECORDER.lines()) + "\n", encoding="utf-8")
        if os.environ.get(RECORD_ENV):
            Path(os.environ[RECORD_ENV]).write_text(
                "\n".join(RECORDER.lines()) + "\n", encoding="utf-8"
            )


def differences(
    recorded: tuple[set[Call], set[Emitted]], inventory: tuple[set[Call], set[Emitted]]
) -> tuple[list[str], list[str]]:
    """(recorded but not listed, listed but not recorded), as inventory lines."""
    (calls, metrics), (listed_calls, listed_metrics) = recorded, inventory
    new = sorted(c.line() for c in calls - listed_calls) + sorted(
        m.line() for m in metrics - listed_metrics
    )
    stale = sorted(c.line() for c in listed_calls - calls) + sorted(
        m.line() for m in listed_metrics - metrics
    )
    return new, stale


# The functions of the stack as docs/deploy.md names them, in its order.
GRANTS_ROWS = {
    "api": "API",
    "materializer": "materializer",
    "relay": "relay",
    "redrive": "re-drive",
    "drain": "drain widget (the dashboard's)",
    "reconciler": "reconciler",
}
GRANTS_BEGIN = "<!-- grants: generated from tests/infrastructure/inventory.txt -->"
GRANTS_END = "<!-- /grants -->"


def _dynamodb_resource(resource: str) -> str:
    """'table/punctual-schedules/index/due' -> 'schedules `due`'."""
    parts = resource.split("/")
    table = parts[1].removeprefix("punctual-")
    if len(parts) >= 4 and parts[2] == "index":
        return f"{table} `{parts[3]}`"
    if len(parts) >= 3 and parts[2] == "stream":
        return f"{table}' stream"
    return table


def grants_table(calls: set[Call]) -> str:
    """docs/deploy.md's table of what each function's role allows: its recorded calls."""
    lines = [
        "| function | DynamoDB | SQS (`punctual-*` of this account and region), other |",
        "|---|---|---|",
    ]
    for function, title in GRANTS_ROWS.items():
        tables: dict[str, set[str]] = {}
        other: set[str] = set()
        for call in calls:
            if call.function != function:
                continue
            service, _, action = call.action.partition(":")
            if service == "dynamodb":
                tables.setdefault(_dynamodb_resource(call.resource), set()).add(action)
            elif service == "sqs":
                other.add(action)
            else:
                other.add(f"{call.action} (on `{call.resource}`)")
        dynamodb = "; ".join(f"{t}: {', '.join(sorted(a))}" for t, a in sorted(tables.items()))
        lines.append(f"| {title} | {dynamodb or 'none'} | {', '.join(sorted(other)) or 'none'} |")
    return "\n".join(lines)


def documented_grants(text: str) -> str | None:
    """The generated table in a document's text (None: no markers)."""
    if GRANTS_BEGIN not in text or GRANTS_END not in text:
        return None
    return text.split(GRANTS_BEGIN, 1)[1].split(GRANTS_END, 1)[0].strip()


def main(paths: list[str]) -> int:
    """The union of what several sessions recorded (each a part of the integration tests,
    together all of them) against the inventory; 1 and each difference when they differ."""
    calls: set[Call] = set()
    metrics: set[Emitted] = set()
    for path in paths:
        found = parse_inventory(Path(path).read_text(encoding="utf-8"))
        calls |= found[0]
        metrics |= found[1]
    new, stale = differences((calls, metrics), read_inventory())
    problems = [
        f"recorded but not in the inventory (grant it, then `make inventory`): {line}"
        for line in new
    ] + [
        f"in the inventory but no longer made (remove its grant, then `make inventory`): {line}"
        for line in stale
    ]
    for problem in problems:
        print(problem)
    if not problems:
        print(f"the call inventory is what the integration tests recorded ({len(paths)} parts)")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--grants"]:  # docs/deploy.md's table, from the inventory
        print(grants_table(read_inventory()[0]))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
