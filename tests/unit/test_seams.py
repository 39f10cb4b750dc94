"""The seams the code keeps: only punctual/dal talks to DynamoDB (expressions, item
formats, client calls); every Lambda handler is wired the same way; a domain error's HTTP
status is decided by the API alone, in agreement with whose fault the error is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "layers/core/python/punctual"  # the runtime: the Lambda layer ships it whole
CLIENT = REPO / "clients/python/punctual_client"  # what tenants run: CLI, HTTP client, worker
DEVTOOLS = REPO / "devtools/punctual_local"  # the local stack and its commands
FUNCTIONS = REPO / "functions"
SOURCE_ROOTS = {p.name: p.parent for p in (PACKAGE, CLIENT, DEVTOOLS)}

# Request parameters only a DynamoDB call or transaction action has.
DYNAMODB_PARAMETERS = frozenset(
    {
        "ConditionExpression",
        "UpdateExpression",
        "KeyConditionExpression",
        "FilterExpression",
        "ProjectionExpression",
        "ExpressionAttributeNames",
        "ExpressionAttributeValues",
        "TransactItems",
        "ReturnValuesOnConditionCheckFailure",
        "ExclusiveStartKey",
    }
)
DYNAMODB_CALLS = frozenset(
    {
        "get_item",
        "put_item",
        "update_item",
        "delete_item",
        "query",
        "scan",
        "batch_get_item",
        "batch_write_item",
        "transact_write_items",
        "transact_get_items",
    }
)
# dal.common's item and expression helpers: using them means building DynamoDB requests.
DAL_INTERNALS = frozenset(
    {"to_dynamo", "from_dynamo", "values", "batch_get", "transact", "translated"}
)


def seam_violations(source: str) -> list[str]:
    """What in ``source`` (a module outside dal/) talks to DynamoDB itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and node.value in DYNAMODB_PARAMETERS:
            found.append(f"{line}: builds a request with {node.value!r}")
        elif isinstance(node, ast.keyword) and node.arg in DYNAMODB_PARAMETERS:
            found.append(f"{node.value.lineno}: passes {node.arg}=")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in DYNAMODB_CALLS:
                found.append(f"{line}: calls .{node.func.attr}()")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("punctual.dal"):
            found += [
                f"{line}: imports {alias.name} from {node.module}"
                for alias in node.names
                if alias.name in DAL_INTERNALS
            ]
    return found


def _outside_dal() -> list[Path]:
    # punctual_local is development tooling (it runs the engines and reads tables for its
    # stats), not part of what Lambda or a worker runs.
    modules = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "dal"]
    return modules + sorted(CLIENT.rglob("*.py")) + sorted(FUNCTIONS.rglob("*.py"))


def test_seam_only_dal_builds_dynamodb_requests_or_calls_the_client() -> None:
    # GIVEN every module of the runtime package (dal/ aside), the client package and the
    # functions
    modules = _outside_dal()
    assert len(modules) > 30
    assert CLIENT / "worker/core.py" in modules
    # THEN none builds a DynamoDB expression, converts items, or calls the client: the
    # stores do, and say there which reads are consistent and why
    violations = {
        str(path.relative_to(REPO)): problems
        for path in modules
        if (problems := seam_violations(path.read_text(encoding="utf-8")))
    }
    assert violations == {}


@pytest.mark.parametrize(
    "source",
    [
        'update = {"ConditionExpression": "version = :v"}',
        "client.query(TableName=t, KeyConditionExpression=k)",
        "services.dynamodb.get_item(Key=key)",
        "from punctual.dal.common import Item, to_dynamo",
    ],
)
def test_seam_check_finds_each_kind_of_violation(source: str) -> None:
    # GIVEN code that talks to DynamoDB itself; THEN the guard above would name it
    assert seam_violations(source)


def test_seam_check_lets_stores_and_transactions_be_used() -> None:
    source = (
        "from punctual.dal.common import ConditionFailed, Item\n"
        "services.transactions.commit([('step', services.schedules.step_action(item, s, c, []))])\n"
    )
    assert seam_violations(source) == []


def test_every_handler_is_wired_by_one_lazily_built_wiring() -> None:
    # GIVEN each Lambda entry point
    from api import context
    from materializer import handler as materializer
    from reconciler import handler as reconciler
    from relay import handler as relay
    from relay import redrive

    from punctual.services import Wiring

    for module in (context, materializer, reconciler, relay, redrive):
        # THEN its services come from one Wiring, which tests and the local stack configure
        assert isinstance(module.wiring, Wiring), module.__name__
        assert module.configure == module.wiring.configure
    # AND no function builds its own clients per invocation
    for path in FUNCTIONS.rglob("*.py"):
        assert "from_environment" not in path.read_text(encoding="utf-8"), path


def test_error_status_is_the_apis_and_agrees_with_whose_fault_it_is() -> None:
    from api.errors import STATUS, status_of

    from punctual.domain import errors

    domain = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.PunctualError)
    ]
    # THEN every domain error has a status only at the API, 4xx exactly for the caller's
    # fault, and no domain class carries one itself
    for error in domain:
        assert not hasattr(error, "status"), error
    for error_class, status in STATUS.items():
        assert error_class.callers_fault == (400 <= status < 500), error_class
    assert status_of(errors.PunctualError("x")) == 500
    # a cap waiting does not lift is 409 (not retried); a rate quota 429 with Retry-After
    assert status_of(errors.QuotaExceeded("x", quota="q", limit=1, usage=1)) == 409
    rate = errors.RateExceeded("x", quota="q", limit=1, usage=1, retry_after=5)
    assert status_of(rate) == 429


def _punctual_imports(path: Path) -> set[Path]:
    """The punctual modules ``path`` imports, anywhere in it, as files."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            root = SOURCE_ROOTS.get(name.split(".")[0])
            if root is None:
                continue
            base = root / name.replace(".", "/")
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.exists():
                    found.add(candidate)
    return found


def _reached(roots: list[Path]) -> set[Path]:
    seen: set[Path] = set()
    todo = list(roots)
    while todo:
        path = todo.pop()
        for module in _punctual_imports(path) - seen:
            seen.add(module)
            todo.append(module)
            if module.name == "__init__.py":
                continue
            package_init = module.parent / "__init__.py"
            if package_init.exists() and package_init not in seen:
                seen.add(package_init)
                todo.append(package_init)
    return seen


def test_the_runtime_imports_neither_the_client_nor_the_development_tooling() -> None:
    # GIVEN every module the functions import, directly or not, and the runtime package,
    # which the layer ships whole
    reached = _reached(sorted(FUNCTIONS.rglob("*.py")) + sorted(PACKAGE.rglob("*.py")))
    assert PACKAGE / "control" / "plane.py" in reached
    # THEN all of them are the runtime's: Lambda runs nothing of the CLI, the HTTP client,
    # the worker SDK or the local stack, and needs none of them
    assert {p for p in reached if PACKAGE not in p.parents} == set()


def test_the_client_does_not_import_the_server_or_the_development_tooling() -> None:
    # GIVEN the client package (CLI, HTTP client and the worker SDK tenants run in their
    # own accounts)
    reached = _reached(sorted(CLIENT.rglob("*.py")))
    assert CLIENT / "worker/core.py" in reached
    # THEN it needs the stores, the models and the message (punctual-core), not the control
    # plane, the materializer, the relay or the reconciler, the server's wiring or its
    # integrations, nor the local stack
    server = {PACKAGE / name for name in ("control", "pipeline", "integrations", "services")}
    assert {p for p in reached if p.parent in server} == set()
    assert PACKAGE / "domain" / "message.py" in reached
    assert {p for p in reached if DEVTOOLS in p.parents} == set()


def test_the_functions_clients_skip_botocores_parameter_check(monkeypatch: pytest.MonkeyPatch):
    # GIVEN a Lambda's environment
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    from punctual.services import Services

    # WHEN a handler builds its services
    services = Services.from_environment()
    # THEN its DynamoDB and SQS clients leave checking requests to the services (a fifth of
    # a schedule step's CPU, docs/decisions.md 2026-12-03), while the tests' own clients
    # (boto3's defaults) keep the check, so a malformed request still fails in a test
    # (botocore wraps the serializer in its validator only when the check is on)
    import boto3
    from botocore.validate import ParamValidationDecorator

    for client in (services.dynamodb, services.sqs):
        assert not isinstance(client._serializer, ParamValidationDecorator)
    assert isinstance(boto3.client("sqs")._serializer, ParamValidationDecorator)


def test_the_collector_runs_less_often_during_an_invocation_and_frees_its_cycles_after():
    # GIVEN the process's collector thresholds, and a collector shared by two invocations
    # (two threads of the local stack)
    import gc
    import weakref

    from punctual.services import COLLECTOR_THRESHOLDS, Collector

    class Page:  # (a cycle: what an exception's traceback holding a page makes)
        pass

    before = gc.get_threshold()
    collector = Collector()
    cycle = Page()
    with collector.tuned():
        # WHILE they run, the collector runs less often (and still runs)
        assert gc.get_threshold() == COLLECTOR_THRESHOLDS
        assert gc.isenabled()
        with collector.tuned():
            cycle.self = cycle  # type: ignore[attr-defined]
            left = weakref.ref(cycle)
            del cycle
        # ... the other one still running keeps it so
        assert gc.get_threshold() == COLLECTOR_THRESHOLDS
    # THEN after the last, the thresholds are as before and the cycle is freed
    assert gc.get_threshold() == before
    assert left() is None


DAL = PACKAGE / "dal"


def untranslated_calls(source: str, *, common: bool = False) -> list[str]:
    """The DynamoDB calls in a dal module made on anything but a store's Dynamo
    (``self._client``); in dal/common.py also ``Dynamo``'s own calls of its raw client
    (``self.raw``) and those on a parameter annotated Dynamo. And every ``self._client``
    set to anything but ``dynamo(...)`` or ``Dynamo(...)``: a call on ``self._client`` is
    translated only if that is a Dynamo, not the raw client."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        wrapped = (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in {"dynamo", "Dynamo"}
        )
        if not wrapped and any(ast.unparse(t) == "self._client" for t in targets):
            found.append(f"{node.lineno}: self._client = {ast.unparse(value)}")
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        typed = {
            a.arg
            for a in function.args.args + function.args.kwonlyargs
            if isinstance(a.annotation, ast.Name) and a.annotation.id == "Dynamo"
        }
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            paginated = node.func.attr == "get_paginator" and any(
                isinstance(a, ast.Constant) and a.value in DYNAMODB_CALLS for a in node.args
            )
            if node.func.attr not in DYNAMODB_CALLS | {"query_pages"} and not paginated:
                continue
            receiver = ast.unparse(node.func.value)
            allowed = receiver == "self._client" or (
                common and (receiver == "self.raw" or receiver in typed)
            )
            if not allowed:
                found.append(f"{node.lineno}: {receiver}.{node.func.attr}()")
    return found


def test_seam_every_dynamodb_call_of_the_stores_is_translated() -> None:
    # GIVEN every module of dal/ (the only ones that call DynamoDB)
    modules = sorted(DAL.glob("*.py"))
    assert DAL / "runs.py" in modules
    # THEN each call goes through a Dynamo (a throttled read answers Retryable, the API's
    # 503, like a throttled write; no raw call can slip past the translation): made on
    # ``self._client``, which each store sets to ``dynamo(...)``. (The calls alone passed
    # when the stores held the raw client there; what each holds at run time is checked by
    # test_seam_every_store_holds_a_dynamo_whatever_client_it_is_given.)
    violations = {
        path.name: problems
        for path in modules
        if (
            problems := untranslated_calls(
                path.read_text(encoding="utf-8"), common=path.name == "common.py"
            )
        )
    }
    assert violations == {}


@pytest.mark.parametrize(
    "source",
    [
        "def f(self):\n    self._table.get_item(Key=k)",
        "def f(self, client):\n    client.query(TableName=t)",
        "def f(self):\n    self.raw.get_item(Key=k)",  # (outside dal/common.py)
        'def f(self):\n    self._client.raw.get_paginator("query")',
        "def __init__(self, client):\n    self._client = client",  # the raw client kept
        "def __init__(self, client):\n    self._client: Any = client",
    ],
)
def test_seam_untranslated_call_check_finds_each_kind(source: str) -> None:
    assert untranslated_calls(source)


def test_seam_every_store_holds_a_dynamo_whatever_client_it_is_given() -> None:
    # GIVEN each store, built over a raw client as a test or a script builds it
    from punctual.dal.common import Dynamo, Transactions
    from punctual.dal.effects import EffectLedger
    from punctual.dal.leases import LeaseStore
    from punctual.dal.occurrences import OccurrenceStore
    from punctual.dal.reports import ReportStore
    from punctual.dal.runs import RunStore
    from punctual.dal.schedules import ScheduleStore
    from punctual.dal.tenants import TenantStore
    from punctual.settings import Settings

    raw = object()
    stores = [
        LeaseStore(raw, "t"),
        OccurrenceStore(raw, "t"),
        ReportStore(raw, "t"),
        ScheduleStore(raw, "t"),
        TenantStore(raw, "t"),
        RunStore(raw, Settings()),
        EffectLedger(raw, "t"),
        Transactions(raw),
    ]
    # THEN each talks to it through a Dynamo over it
    for store in stores:
        client = store._client  # type: ignore[attr-defined]
        assert isinstance(client, Dynamo), type(store).__name__
        assert client.raw is raw
