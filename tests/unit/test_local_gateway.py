"""The local gateway: its request mapping (principal from SigV4, the stage prefix, decoded
paths, binary bodies) and, over HTTP, its own answers and its one-event-at-a-time rule."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from punctual_local.gateway import Gateway, api_path, principal_of, rest_event


def test_principal_is_named_by_the_sigv4_access_key_id():
    # GIVEN a SigV4 Authorization header; WHEN mapped; THEN the key id names the user
    header = (
        "AWS4-HMAC-SHA256 Credential=demo/20261130/us-east-1/execute-api/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=abc"
    )
    assert principal_of(header) == "arn:aws:iam::000000000000:user/demo"
    # AND an unsigned request has no principal (the gateway answers 403)
    assert principal_of(None) is None
    assert principal_of("Bearer token") is None


def test_deployed_stage_prefix_is_accepted_and_removed():
    # GIVEN a client built for the deployed URL (https://.../prod/v1/...)
    # THEN the local gateway routes it like /v1/..., and leaves other paths alone
    assert api_path("/prod/v1/schedules") == "/v1/schedules"
    assert api_path("/v1/schedules") == "/v1/schedules"
    assert api_path("/production/v1") == "/production/v1"


def test_rest_event_carries_the_caller_and_the_query():
    event = rest_event(
        "GET", "/v1/schedules", "arn:aws:iam::000000000000:user/demo", None, {"limit": ["5"]}
    )
    assert event["requestContext"]["identity"]["userArn"].endswith("user/demo")
    assert event["queryStringParameters"] == {"limit": "5"}
    assert event["multiValueQueryStringParameters"] == {"limit": ["5"]}


def test_paths_are_percent_decoded_as_api_gateway_hands_them_over():
    # GIVEN a path whose id was percent-encoded by the client
    # THEN the function sees the decoded text (errors echo it, the length limit counts it)
    assert api_path("/v1/schedules/%C3%A9t%C3%A9") == "/v1/schedules/été"
    assert api_path("/prod/v1/schedules/a%20b") == "/v1/schedules/a b"


def test_a_body_that_is_not_utf8_arrives_base64_encoded():
    # GIVEN raw bytes that are not UTF-8; WHEN mapped to an event
    event = rest_event("POST", "/v1/schedules", "arn:aws:iam::000000000000:user/demo", b"\xff\xfe{")
    # THEN it travels base64-encoded, as API Gateway passes a binary body
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == b"\xff\xfe{"
    # AND UTF-8 text travels as it is
    text = rest_event("POST", "/v1/schedules", None, b"{}")
    assert (text["body"], text["isBase64Encoded"]) == ("{}", False)


# --- the gateway over HTTP, with a stand-in function ---------------------------------


@dataclass
class Recorder:
    """A function that records the events it gets and how many run at once."""

    events: list[dict[str, Any]] = field(default_factory=list)
    running: int = 0
    most_at_once: int = 0
    pause: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.events.append(event)
        time.sleep(self.pause)
        with self.lock:
            self.running -= 1
        if event["path"] == "/boom":
            raise RuntimeError("the function failed")
        return {"statusCode": 200, "body": json.dumps({"path": event["path"]})}


@pytest.fixture
def function() -> Recorder:
    return Recorder()


@pytest.fixture
def gateway(function: Recorder) -> Iterator[Gateway]:
    server = Gateway(function, 0, time.time, read_timeout=0.5)
    server.start()
    yield server
    server.stop()


SIGNED = "AWS4-HMAC-SHA256 Credential=demo/20261201/us-east-1/execute-api/aws4_request"


def _raw(gateway: Gateway, request: bytes) -> tuple[int, dict[str, Any]]:
    """Send bytes as they are; the status and JSON body of the answer."""
    host, port = gateway.server.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=10) as connection:
        connection.sendall(request)
        answer = http.client.HTTPResponse(connection)
        answer.begin()
        return answer.status, json.loads(answer.read())


def _assert_error_shape(body: dict[str, Any]) -> dict[str, Any]:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "fields", "details"}
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(
    ("length", "reason"), [("abc", "is not a length"), ("-1", "is not a length")]
)
def test_gateway_answers_a_content_length_that_is_not_a_length(
    gateway: Gateway, function: Recorder, length: str, reason: str
):
    # WHEN a request's Content-Length is not a length
    status, body = _raw(
        gateway,
        f"POST /v1/schedules HTTP/1.1\r\nHost: x\r\nAuthorization: {SIGNED}\r\n"
        f"Content-Length: {length}\r\n\r\n{{}}".encode(),
    )
    # THEN 400 in the one error shape naming the header, and the function never ran
    error = _assert_error_shape(body)
    assert (status, error["fields"][0]["field"]) == (400, "Content-Length")
    assert reason in error["message"]
    assert function.events == []


def test_gateway_answers_a_body_shorter_than_its_content_length(
    gateway: Gateway, function: Recorder
):
    # WHEN a client promises 100 bytes, sends 2 and waits
    status, body = _raw(
        gateway,
        f"POST /v1/targets HTTP/1.1\r\nHost: x\r\nAuthorization: {SIGNED}\r\n"
        "Content-Length: 100\r\n\r\n{}".encode(),
    )
    # THEN after the read timeout it gets a 400 (not a hung or dropped connection)
    assert status == 400
    assert "ended after 2 of 100 bytes" in _assert_error_shape(body)["message"]
    assert function.events == []


def test_gateway_passes_any_method_and_a_binary_body_to_the_function(
    gateway: Gateway, function: Recorder
):
    # WHEN a TRACE request and a POST with bytes that are not UTF-8 arrive
    trace = _raw(
        gateway, f"TRACE /v1/meta HTTP/1.1\r\nHost: x\r\nAuthorization: {SIGNED}\r\n\r\n".encode()
    )
    post = _raw(
        gateway,
        f"POST /v1/targets HTTP/1.1\r\nHost: x\r\nAuthorization: {SIGNED}\r\n"
        "Content-Length: 3\r\n\r\n".encode()
        + b"\xff\xfe\x00",
    )
    # THEN both reach the function (which decides: 405, 400), the body base64-encoded
    assert trace[0] == post[0] == 200
    traced, posted = function.events
    assert (traced["httpMethod"], posted["isBase64Encoded"]) == ("TRACE", True)
    assert base64.b64decode(posted["body"]) == b"\xff\xfe\x00"


def test_gateway_own_refusals_take_the_one_error_shape(gateway: Gateway, function: Recorder):
    # WHEN a request is unsigned, malformed (more headers than http.server reads), or the
    # function raises
    unsigned = _raw(gateway, b"GET /v1/meta HTTP/1.1\r\nHost: x\r\n\r\n")
    headers = "".join(f"X-{n}: {n}\r\n" for n in range(101))
    malformed = _raw(gateway, f"GET /v1/meta HTTP/1.1\r\n{headers}\r\n".encode())
    failed = _raw(
        gateway, f"GET /boom HTTP/1.1\r\nHost: x\r\nAuthorization: {SIGNED}\r\n\r\n".encode()
    )
    # THEN 403, 431 and 502, each in the one error shape
    assert [status for status, _ in (unsigned, malformed, failed)] == [403, 431, 502]
    codes = [_assert_error_shape(body)["code"] for _, body in (unsigned, malformed, failed)]
    assert codes == ["MISSING_AUTHENTICATION_TOKEN", "invalid_input", "INTERNAL_SERVER_ERROR"]


def test_gateway_runs_the_function_for_one_request_at_a_time(gateway: Gateway, function: Recorder):
    # GIVEN a function that takes a while
    function.pause = 0.05
    paths = [f"/v1/schedules/s{n}" for n in range(16)]

    # WHEN 16 clients call at once
    def call(path: str) -> Any:
        request = urllib.request.Request(gateway.url + path, headers={"Authorization": SIGNED})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())["path"]

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(call, paths))

    # THEN the function was never entered twice at once (as on Lambda), and each caller got
    # the answer to its own request
    assert function.most_at_once == 1
    assert answers == paths
