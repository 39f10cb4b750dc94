"""Every example in README.md and docs/ runs as written (issue 46), against a local stack
where it calls the API: each fenced block is found here by its document and first line,
and run whole (shell blocks in bash from the repository's root, as a reader pastes them;
Python saved as the file the document names and run; JSON checked against what the code
reads or writes). A block this file does not know fails the first test: a new example
gets a way to run here, or a reason it cannot.

Where an example needs AWS (the deploy guide's `aws cloudformation` and `aws iam` calls),
a stand-in `aws` on the PATH answers them for the local stack: the stack's URL as the
stack output, and a policy document checked and accepted; every `curl` still goes to the
local API, signed as written.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from punctual.domain.message import Message, message_body
from punctual.domain.occurrence import Occurrence
from tests.e2e.conftest import (
    REPO,
    Stack,
    _hermetic_environment,
    local_stack,
    wait_for,
)

pytestmark = pytest.mark.e2e

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A fenced block at the start of a line, or indented in a list item (its text dedented).
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[a-z]*)\n(?P<text>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
RUN_SECONDS = 120
INSTALL_SECONDS = 600


@dataclass(frozen=True)
class Example:
    document: str  # relative to the repository
    lang: str
    text: str

    @property
    def key(self) -> tuple[str, str]:
        return self.document, self.text.splitlines()[0]


def examples() -> list[Example]:
    found = []
    for path in DOCUMENTS:
        for match in FENCE.finditer(path.read_text(encoding="utf-8")):
            relative = str(path.relative_to(REPO))
            text = textwrap.dedent(match["text"])
            found.append(Example(relative, match["lang"], text))
    return found


def example(document: str, first_line: str) -> Example:
    [found] = [e for e in examples() if e.key == (document, first_line)]
    return found


# Each example by (document, first line), and the test that runs it (or why none can).
README_MAKE = (
    "README.md",
    "make run    # the whole system on this machine, with a demo (Ctrl-C stops it)",
)
QUICKSTART = (
    "README.md",
    'eval "$(.venv/bin/punctual local env)"            # engine endpoints, PUNCTUAL_ENDPOINT '
    "(--data DIR)",
)
PREVIEWS = (
    "README.md",
    ".venv/bin/punctual preview --cron '30 2 * * *' --tz America/New_York "
    "--after 2026-03-07T00:00:00Z --count 3",
)
CAPACITY = (
    "docs/capacity.md",
    "make capacity                                   # about 5 s: everything below",
)
CAPACITY_PAYLOADS = (
    "docs/capacity.md",
    'make capacity          # the section "== Payloads" (scripts/capacity/payloads.py)',
)
MESSAGE = ("docs/message.md", "{")
READ_REPORTS = ("docs/operations.md", "punctual.pipeline.reconciler.read_reports(")
RERUN_EVENT = ("docs/operations.md", '{"time": "2026-11-18T12:20:00Z", "shards": [3, 4],')
WORKER = ("docs/worker.md", "import signal")
WORKER_INSTALL = (
    "docs/worker.md",
    "python3 -m venv ~/punctual-client                                        "
    "# an environment of its own",
)
WORKER_LAMBDA = ("docs/worker.md", "from billing import TENANT, charge")
WORKER_IDEMPOTENT = (
    "docs/worker.md",
    "from aws_lambda_powertools.utilities.idempotency import (",
)
DEPLOY_SIGN = (
    "docs/deploy.md",
    "API=$(aws cloudformation describe-stacks --stack-name Punctual \\",
)
DEPLOY_TENANT = (
    "docs/deploy.md",
    "# 1. the tenant, with its quotas (every quota is optional; these are the defaults)",
)
DEPLOY_SCHEDULE = (
    "docs/deploy.md",
    """curl "${sign[@]}" -X POST "${API}v1/targets" -d '{"name": "default"}'   # queue + DLQ""",
)
DEPLOY_POLICY = (
    "docs/deploy.md",
    "punctual tenants worker-policy acme > acme-workers.json     "
    "# or GET /v1/admin/tenants/acme/worker-policy",
)
# Steps only an AWS account can run (outputs of the deployed stack, alarm state, an assumed
# role): their shell is checked to parse, and each command to be one the AWS CLI has.
DEPLOY_OUTPUTS = (
    "docs/deploy.md",
    "out() { aws cloudformation describe-stacks --stack-name Punctual \\",
)
DEPLOY_ALARM_TEST = (
    "docs/deploy.md",
    "aws cloudwatch set-alarm-state --alarm-name Punctual-RelayUndelivered \\",
)
DEPLOY_ASSUME = (
    "docs/deploy.md",
    'eval "$(aws sts assume-role --role-arn "$OPERATOR" --role-session-name onboarding \\',
)
AWS_ONLY = (DEPLOY_OUTPUTS, DEPLOY_ALARM_TEST, DEPLOY_ASSUME)
# The AWS CLI commands those steps use (service, operation), as the CLI names them.
AWS_COMMANDS = {
    ("cloudformation", "describe-stacks"),
    ("cloudwatch", "set-alarm-state"),
    ("cloudwatch", "describe-alarm-history"),
    ("sts", "assume-role"),
}
RUN_BY = {
    # `make run` is `punctual local up --demo` (test_local_stack.py holds the Makefile to
    # it; every end-to-end test starts that command); `make test` is this suite itself.
    README_MAKE: "the two commands: the end-to-end tests and CI run them",
    QUICKSTART: "test_readme_quickstart_runs_as_written",
    PREVIEWS: "test_readme_previews_run_as_written_and_have_not_expired",
    CAPACITY: "test_capacity_commands_run_as_written",
    CAPACITY_PAYLOADS: "test_capacity_commands_run_as_written",
    MESSAGE: "test_message_example_is_what_the_relay_sends",
    READ_REPORTS: "test_operations_examples_are_what_the_code_reads",
    RERUN_EVENT: "test_operations_examples_are_what_the_code_reads",
    WORKER_INSTALL: "test_worker_install_example_installs_the_client_alone",
    WORKER: "test_worker_examples_run_against_the_local_stack",
    WORKER_LAMBDA: "test_worker_examples_run_against_the_local_stack",
    WORKER_IDEMPOTENT: "test_worker_idempotency_example_sends_once_for_two_deliveries",
    DEPLOY_SIGN: "test_deploy_examples_run_against_the_local_stack",
    DEPLOY_TENANT: "test_deploy_examples_run_against_the_local_stack",
    DEPLOY_SCHEDULE: "test_deploy_examples_run_against_the_local_stack",
    DEPLOY_POLICY: "test_deploy_examples_run_against_the_local_stack",
    **dict.fromkeys(AWS_ONLY, "test_aws_only_examples_parse_and_name_real_commands"),
}


def test_every_example_in_the_docs_is_run_here():
    # GIVEN every fenced block of README.md and docs/
    found = {e.key for e in examples()}
    # THEN each is one this file runs (or says why it cannot), and each listed still exists
    assert sorted(found - set(RUN_BY)) == [], "an example no test runs"
    assert sorted(set(RUN_BY) - found) == [], "a listed example is gone or changed"
    tests = {name for name in globals() if name.startswith("test_")}
    assert {t for t in RUN_BY.values() if t.startswith("test_")} <= tests


# --- running shell blocks --------------------------------------------------------------


@pytest.fixture(scope="module")
def docs_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of this module's own (the deploy guide makes tenants of its own)."""
    with local_stack(tmp_path_factory.mktemp("docs-stack")) as stack:
        yield stack


def shell_environment(stack: Stack | None, **more: str) -> dict[str, str]:
    """A reader's shell: no AWS or Punctual settings of the machine running the tests, the
    stack's data folder as the default one (`punctual local env` finds it as written)."""
    env = _hermetic_environment() | more
    if stack is not None:
        env["PUNCTUAL_LOCAL_DATA"] = str(stack.data)
    return env


def bash(
    script: str, env: dict[str, str], cwd: Path = REPO, seconds: float = RUN_SECONDS
) -> subprocess.CompletedProcess[str]:
    """``script`` in bash, stopping at its first failing command, within ``seconds``."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=seconds,
        check=False,
    )


def json_values(text: str) -> list[Any]:
    """The JSON values curl printed one after another (its answers end in no newline)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        value, end = decoder.raw_decode(text, at)
        found.append(value)
        at = end + len(text[end:]) - len(text[end:].lstrip())
    return found


def no_traceback(*outputs: str) -> None:
    for output in outputs:
        assert "Traceback" not in output, output


def test_readme_quickstart_runs_as_written(docs_stack: Stack, tmp_path: Path):
    # GIVEN the quickstart's commands, pasted into a shell beside a running stack
    script = example(*QUICKSTART).text
    log = tmp_path / "quickstart.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            ["bash", "-eu", "-c", script],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=shell_environment(docs_stack),
            cwd=REPO,
            start_new_session=True,
        )
    try:
        # WHEN its last command, the worker, is up
        wait_for(
            lambda: (
                "worker for demo/default" in log.read_text(errors="replace")
                or process.poll() is not None
            ),
            RUN_SECONDS,
            "the quickstart's worker to start",
        )
        assert process.poll() is None, log.read_text(errors="replace")
        # ... and is stopped with Ctrl-C, as the README says
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    # THEN the schedule was created and listed, and the worker stopped cleanly
    created = re.search(r"^(sch_demo\.\w+)\s+ACTIVE", output, re.M)
    assert created, output
    assert output.count(created[1]) >= 2, output  # created, then listed
    assert "worker stopped" in output, output
    no_traceback(output)


def test_readme_previews_run_as_written_and_have_not_expired(docs_stack: Stack):
    # WHEN the preview examples run (their signed calls need the quickstart's exports)
    env = shell_environment(docs_stack, AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="x")
    exports = 'eval "$(.venv/bin/punctual local env)"\n'
    done = bash(exports + example(*PREVIEWS).text, env)
    # THEN each answers fires, none "no fires after" (an example whose dates have passed)
    assert done.returncode == 0, done.stderr
    assert "no fires after" not in done.stdout, done.stdout
    assert done.stdout.count("\n") >= 10, done.stdout
    no_traceback(done.stdout, done.stderr)


def test_capacity_commands_run_as_written():
    # GIVEN the capacity page's commands; the calibration re-measures this machine for six
    # minutes (make bench): its own runs show it works, it is left out here
    lines = [line for line in example(*CAPACITY).text.splitlines() if "--calibrate" not in line]
    assert len(lines) == 2
    # WHEN they run
    done = bash("\n".join(lines), shell_environment(None))
    # THEN each ends well, the model printed and the options listed
    assert done.returncode == 0, done.stderr
    assert "== Workload" in done.stdout, done.stdout[-2000:]
    assert "--shards" in done.stdout.split("usage:", 1)[-1], done.stdout[-2000:]
    no_traceback(done.stdout, done.stderr)
    # AND the payloads section the page points at is printed
    payloads = bash(example(*CAPACITY_PAYLOADS).text, shell_environment(None))
    assert payloads.returncode == 0, payloads.stderr
    assert "== Payloads" in payloads.stdout, payloads.stdout[-2000:]


# --- JSON and signatures ---------------------------------------------------------------


def test_message_example_is_what_the_relay_sends():
    # GIVEN the message documented, and one the relay's code builds
    documented = json.loads(example(*MESSAGE).text)
    occurrence = Occurrence(
        occurrence_id="occ_sch_acme.x_1796029200_3",
        tenant_id="acme",
        schedule_id="sch_acme.x",
        schedule_version=3,
        scheduled_for=1796029200,
        available_at=1796029337,
        target="default",
        attempt_count=0,
    )
    built = json.loads(message_body(occurrence, {"report": "daily"}))
    # THEN the documented one has exactly its fields, each of its type, and parses as one
    assert set(documented) == set(built)
    assert {k: type(v) for k, v in documented.items()} == {k: type(v) for k, v in built.items()}
    Message.model_validate(documented)


def test_operations_examples_are_what_the_code_reads():
    # GIVEN the signature the operations page shows, and the event it says re-runs a window
    from reconciler.handler import ReconcileRequest

    from punctual.pipeline import reconciler

    # (the page's trailing comma; the annotations as written, not as strings)
    shown = re.sub(r"\s+", "", example(*READ_REPORTS).text).replace(",)", ")")
    signature = str(inspect.signature(reconciler.read_reports)).replace("'", "")
    actual = re.sub(r"\s+", "", f"punctual.pipeline.reconciler.read_reports{signature}")
    # THEN the signature is the function's, annotations included
    assert shown == actual
    # AND the event is one the reconciler's handler accepts as a window to re-run
    event = ReconcileRequest.model_validate(json.loads(example(*RERUN_EVENT).text))
    assert event.shards == [3, 4]


# --- the worker guide -------------------------------------------------------------------


def test_worker_install_example_installs_the_client_alone(tmp_path: Path):
    # GIVEN a reader's home folder of its own
    env = shell_environment(None, HOME=str(tmp_path))
    # WHEN the guide's install block runs as written, from the repository's root (pip
    # downloads the dependencies on a clean machine: minutes at worst)
    done = bash(example(*WORKER_INSTALL).text, env, seconds=INSTALL_SECONDS)
    # THEN it installed the client and the core it pins, and says what they speak
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == (
        "punctual-client 0.1.0 on punctual-core 0.1.0: message schema 1, run protocol 2"
    )
    site = next((tmp_path / "punctual-client" / "lib").glob("python3.*/site-packages"))
    assert (site / "punctual_client" / "worker" / "core.py").is_file()
    assert (site / "punctual" / "dal" / "runs.py").is_file()
    # AND nothing of the server: the control plane, the pipeline, its wiring
    assert not [p for p in ("control", "pipeline", "services") if (site / "punctual" / p).exists()]


def test_worker_examples_run_against_the_local_stack(docs_stack: Stack, tmp_path: Path):
    # GIVEN the complete worker saved as billing.py, as the guide says, and its Lambda
    # variant beside it, in the quickstart's shell (its exports, the demo key)
    (tmp_path / "billing.py").write_text(example(*WORKER).text)
    (tmp_path / "lambda_function.py").write_text(example(*WORKER_LAMBDA).text)
    env = shell_environment(docs_stack, AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="x")
    env |= docs_stack.exports | {"PYTHONPATH": str(tmp_path)}
    # ... and the schedule the guide describes, due in a moment (a busy machine may take a
    # few seconds to start the CLI: an instant past by then would be refused)
    invoice = '{"invoice": {"id": "inv-1", "amount": 12, "lines": ["a", "b"]}}'
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 15))
    made = docs_stack.cli("create", "--at", at, "--target", "default", "--payload", invoice)
    assert made.code == 0, made.err
    log = tmp_path / "billing.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [sys.executable, "billing.py"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        # WHEN it runs until the invoice is written
        def charged() -> list[dict[str, Any]]:
            read = bash(
                textwrap.dedent(
                    """\
                    .venv/bin/python - <<'EOF'
                    import boto3, json
                    try:
                        print(json.dumps(boto3.client("dynamodb").scan(TableName="invoices")["Items"]))
                    except boto3.client("dynamodb").exceptions.ResourceNotFoundException:
                        print("[]")
                    EOF"""
                ),
                env,
            )
            return list(json.loads(read.stdout or "[]"))

        items = wait_for(charged, RUN_SECONDS, f"the invoice (worker log: {log})")
        # ... and is stopped with Ctrl-C
        worker.send_signal(signal.SIGINT)
        code = worker.wait(timeout=40)
    finally:
        if worker.poll() is None:
            worker.kill()
    # THEN the invoice was charged once, and the worker stopped cleanly
    assert [(i["pk"]["S"], i["amount"]["N"]) for i in items] == [("invoice#inv-1", "12")]
    assert code == 0, log.read_text(errors="replace")
    no_traceback(log.read_text(errors="replace"))
    # AND the Lambda variant imports it and makes a handler
    lambda_ = subprocess.run(
        [
            sys.executable,
            "-c",
            "import lambda_function; print(callable(lambda_function.lambda_handler))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=RUN_SECONDS,
        check=False,
    )
    assert (lambda_.returncode, lambda_.stdout.strip()) == (0, "True"), lambda_.stderr


# The reader's own module the idempotency example imports: a mailer that records each send.
MY_APP = """
import types
sent = []


def _send(payload):
    sent.append(payload)
    return {"sent": len(sent)}


mailer = types.SimpleNamespace(send=_send)
"""
# The example's table as its comment describes it, then one occurrence delivered twice.
DELIVER_TWICE = """
import json, types
import boto3
boto3.client("dynamodb").create_table(
    TableName="my-idempotency",
    KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
    AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
    BillingMode="PAY_PER_REQUEST",
)
import example, my_app
from punctual.domain.message import Message
job = types.SimpleNamespace(message=Message.model_validate_json(open("message.json").read()))
example.handler(job)
example.handler(job)
print(json.dumps(my_app.sent))
"""


def test_worker_idempotency_example_sends_once_for_two_deliveries(
    docs_stack: Stack, tmp_path: Path
):
    # GIVEN the guide's idempotent handler as written, the reader's mailer beside it, and the
    # message the message guide shows, in the quickstart's shell (the local DynamoDB)
    (tmp_path / "example.py").write_text(example(*WORKER_IDEMPOTENT).text)
    (tmp_path / "my_app.py").write_text(MY_APP)
    (tmp_path / "message.json").write_text(example(*MESSAGE).text)
    env = shell_environment(docs_stack, AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="x")
    env |= docs_stack.exports | {"PYTHONPATH": str(tmp_path)}
    # WHEN the same occurrence's message is handled twice (a redelivery)
    ran = subprocess.run(
        [sys.executable, "-c", DELIVER_TWICE],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=RUN_SECONDS,
        check=False,
    )
    # THEN the remote side was called once, with the payload
    assert ran.returncode == 0, ran.stderr
    [sent] = json.loads(ran.stdout)
    assert sent == json.loads(example(*MESSAGE).text)["payload"]


def test_aws_only_examples_parse_and_name_real_commands():
    # GIVEN the deploy guide's steps that only an AWS account runs
    for key in AWS_ONLY:
        text = example(*key).text
        # THEN their shell parses ...
        checked = subprocess.run(
            ["bash", "-n", "-c", text], capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, (key, checked.stderr)
        # ... and every `aws` command in them is one of those listed (as the CLI names them)
        used = set(re.findall(r"\baws ([a-z0-9-]+) ([a-z0-9-]+)", text))
        assert used, key
        assert used <= AWS_COMMANDS, (key, used - AWS_COMMANDS)


# --- the deploy guide -------------------------------------------------------------------

# The stand-in for AWS's CLI: the stack's output is the local API's URL; a role policy is
# read and checked to be an IAM policy document naming the tenant's queues.
FAKE_AWS = """#!/bin/sh
case "$1 $2" in
  "cloudformation describe-stacks") echo "$PUNCTUAL_TEST_API/" ;;
  "iam put-role-policy")
    for arg in "$@"; do
      case "$arg" in file://*) file="${arg#file://}" ;; esac
    done
    "$PUNCTUAL_TEST_PYTHON" -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["Version"] == "2012-10-17" and d["Statement"]' "$file" ;;
  *) echo "aws stand-in: $* is not one the docs use" >&2; exit 2 ;;
esac
"""


def test_deploy_examples_run_against_the_local_stack(docs_stack: Stack, tmp_path: Path):
    # GIVEN a shell with the stand-in `aws` and the repository's `punctual` on its PATH,
    # signing as the operator, in a region
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(FAKE_AWS)
    (bin_dir / "aws").chmod(0o755)
    env = shell_environment(
        docs_stack,
        PATH=f"{bin_dir}:{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
        AWS_REGION="us-east-1",
        AWS_ACCESS_KEY_ID="operator",
        AWS_SECRET_ACCESS_KEY="x",
        AWS_SESSION_TOKEN="",
        PUNCTUAL_TEST_API=docs_stack.url,
        PUNCTUAL_TEST_PYTHON=sys.executable,
    ) | {"PUNCTUAL_ENDPOINT": docs_stack.url}
    sign = example(*DEPLOY_SIGN).text
    # WHEN the operator's examples run: the API's URL and the signing, the tenant onboarded
    operator = bash(sign + "\n" + example(*DEPLOY_TENANT).text, env, cwd=tmp_path)
    # THEN every call answered without an error
    assert operator.returncode == 0, operator.stderr
    assert '"error"' not in operator.stdout, operator.stdout
    assert [v.get("tenant_id") for v in json_values(operator.stdout)][1:] == ["acme"] * 4
    # WHEN the tenant's examples run, signed by a principal of acme (on AWS, the role the
    # guide binds; locally a key is its principal, bound here the same way)
    bind = (
        'curl "${sign[@]}" -X POST "${API}v1/admin/tenants/acme/principals" '
        """-d '{"principal_arn": "arn:aws:iam::000000000000:user/acme"}'"""
    )
    assert bash(sign + "\n" + bind, env, cwd=tmp_path).returncode == 0
    tenant = bash(
        sign + "\n" + example(*DEPLOY_SCHEDULE).text,
        env | {"AWS_ACCESS_KEY_ID": "acme"},
        cwd=tmp_path,
    )
    # THEN the target and the schedule were made
    assert tenant.returncode == 0, tenant.stderr
    assert '"error"' not in tenant.stdout, tenant.stdout
    answers = json_values(tenant.stdout)
    assert [a["name"] for a in answers if "queue_url" in a] == ["default"], tenant.stdout
    assert [a["schedule"]["name"] for a in answers if "schedule" in a] == ["nightly"]
    # WHEN the operator writes the workers' policy and puts it on their role
    policy = bash(example(*DEPLOY_POLICY).text, env, cwd=tmp_path)
    # THEN the policy is a document the stand-in accepted
    assert policy.returncode == 0, policy.stderr
    assert json.loads((tmp_path / "acme-workers.json").read_text())["Statement"]
    no_traceback(operator.stderr, tenant.stderr, policy.stderr)
