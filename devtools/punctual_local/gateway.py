"""The local stand-in for API Gateway: HTTP requests -> REST proxy events -> the API Lambda.

Requests are signed with SigV4 as against AWS; locally the access key id names the
caller's principal (``arn:aws:iam::000000000000:user/<access key id>``) and the signature
is NOT verified: the server listens on loopback only.

Like Lambda, which gives an execution environment one event at a time, the gateway runs
the handler for one request at a time: connections are served on threads, but the
handler (and the Powertools resolver's per-request state in it) is never entered twice.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

from punctual_local.engines import ACCOUNT

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]
# Pages the gateway serves itself under a path prefix (the local console): (method, path,
# query) -> an answer in the Lambda proxy answer's shape. Not signed, not the API's lock.
Pages = Callable[[str, str, dict[str, list[str]]], dict[str, Any]]
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
# API Gateway's payload limit; a larger body is refused before it is read.
MAX_BODY_BYTES = 10 * 1024 * 1024
# How long a connection may sit idle, e.g. a body shorter than its Content-Length.
READ_TIMEOUT_SECONDS = 30

STAGE = "prod"  # the deployed stage (infra/api.py): its URLs carry it, locally optional

_log = logging.getLogger(__name__)


def api_path(path: str) -> str:
    """The path the API routes on: ``/prod/v1/...`` (a deployed stage's URL) as ``/v1/...``,
    percent-decoded as API Gateway hands it to the function."""
    path = unquote(path)
    prefix = f"/{STAGE}"
    return path[len(prefix) :] if path == prefix or path.startswith(prefix + "/") else path


def principal_of(authorization: str | None) -> str | None:
    """The caller a SigV4 Authorization header names, or None when unsigned."""
    match = _CREDENTIAL.search(authorization or "")
    return f"arn:aws:iam::{ACCOUNT}:user/{match.group(1)}" if match else None


def rest_event(
    method: str,
    path: str,
    principal: str | None,
    body: str | bytes | None = None,
    query: dict[str, list[str]] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event, as the IAM-authorized proxy integration sends it.
    A body that is not UTF-8 text arrives base64-encoded, as API Gateway passes binary."""
    query = query or {}
    request_id = str(uuid.uuid4())
    encoded = False
    if isinstance(body, bytes):
        try:
            text: str | None = body.decode("utf-8")
        except UnicodeDecodeError:
            text, encoded = base64.b64encode(body).decode("ascii"), True
    else:
        text = body
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": dict(headers or {}),
        "multiValueHeaders": {},
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "body": text,
        "isBase64Encoded": encoded,
        "requestContext": {
            "httpMethod": method,
            "path": f"/{STAGE}{path}",
            "resourcePath": "/{proxy+}",
            "stage": STAGE,
            "requestId": request_id,
            "identity": {"userArn": principal, "sourceIp": "127.0.0.1"},
        },
    }


def gateway_error(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """An answer the gateway gives itself, in the API's one error shape (as the deployed
    API's gateway responses are, infra/api.py)."""
    fields = [{"field": field, "reason": message}] if field else []
    details = {"request_id": str(uuid.uuid4())}
    error = {"code": code, "message": message, "fields": fields, "details": details}
    return {"statusCode": status, "body": json.dumps({"error": error})}


class LambdaContext:
    """The parts of the Lambda context the handlers and Powertools read."""

    def __init__(self, function_name: str, timeout_seconds: float, clock: Callable[[], float]):
        self.function_name = function_name
        self.memory_limit_in_mb = 1024
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:{function_name}"
        self.aws_request_id = str(uuid.uuid4())
        self._deadline = clock() + timeout_seconds
        self._clock = clock

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock()) * 1000))


class _Refused(Exception):
    """The gateway answers this request itself, without reading on."""

    def __init__(self, status: int, message: str, code: str = "invalid_input") -> None:
        self.answer = gateway_error(
            status, code, message, "Content-Length" if status < 413 else None
        )


def _content_length(value: str | None) -> int:
    if value is None:
        return 0
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise _Refused(400, f"{value!r} is not a length")
    length = int(text)
    if length > MAX_BODY_BYTES:
        raise _Refused(413, f"the body may be at most {MAX_BODY_BYTES} bytes", "REQUEST_TOO_LARGE")
    return length


class _Request(BaseHTTPRequestHandler):
    """One connection's requests: each answered by the gateway that made the subclass
    (``Gateway.answer``), or refused here as API Gateway would refuse it."""

    gateway: ClassVar[Gateway]  # set on the subclass each Gateway makes
    protocol_version = "HTTP/1.1"  # keep-alive: a client's session reuses its connection
    # Headers and body are written separately: without this, Nagle's algorithm and the
    # client's delayed ACK hold every answer back by about 40 ms.
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        try:
            event = self._event()
        except _Refused as refused:
            # The body was not (fully) read: the connection cannot carry another request.
            self.close_connection = True
            self._answer(refused.answer)
            return
        self._answer(self.gateway.answer(self.command, event))

    def _event(self) -> dict[str, Any]:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise _Refused(411, "send the body with a Content-Length")
        length = _content_length(self.headers.get("Content-Length"))
        body = self._read(length) if length else None
        if body is not None and len(body) < length:
            raise _Refused(400, f"the body ended after {len(body)} of {length} bytes")
        url = urlsplit(self.path)
        return rest_event(
            self.command,
            api_path(url.path) or "/",
            principal_of(self.headers.get("Authorization")),
            body,
            parse_qs(url.query, keep_blank_values=True),
            dict(self.headers.items()),
        )

    def _read(self, length: int) -> bytes:
        """Up to ``length`` bytes: fewer when the client stops sending (closes, or goes quiet
        for the read timeout)."""
        chunks: list[bytes] = []
        received = 0
        try:
            while received < length:
                chunk = self.rfile.read1(length - received)
                if not chunk:
                    break
                chunks.append(chunk)
                received += len(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)

    def _answer(self, answer: dict[str, Any]) -> None:
        payload = (answer.get("body") or "").encode("utf-8")
        self.send_response(int(answer["statusCode"]))
        headers = dict(answer.get("headers") or {})
        for name, values in (answer.get("multiValueHeaders") or {}).items():
            headers[name] = values[-1]
        headers.setdefault("Content-Type", "application/json")
        for name, value in headers.items():
            if name.lower() != "content-length":
                self.send_header(name, str(value))
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def __getattr__(self, name: str) -> Any:
        # Every method reaches the function, which answers 405 where a path does not have
        # it (http.server looks up do_<METHOD> and would answer 501 itself).
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, an unknown method, headers too
        large) in the one error shape instead of an HTML page."""
        self.close_connection = True
        status = HTTPStatus(code)
        kind = "invalid_input" if code < 500 else status.name.lower()
        self._answer(gateway_error(code, kind, message or status.phrase))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the demo's output


class Gateway:
    """A threaded HTTP server on 127.0.0.1 that invokes ``handler`` per request, one at a
    time (the ``pages`` aside)."""

    def __init__(
        self,
        handler: LambdaHandler,
        port: int,
        clock: Callable[[], float],
        read_timeout: float = READ_TIMEOUT_SECONDS,
        pages: tuple[str, Pages] | None = None,
    ) -> None:
        """``pages``: a path prefix and what serves the requests under it."""
        owner = self

        class Request(_Request):
            gateway = owner
            timeout = read_timeout

        self.handler = handler
        self.clock = clock
        self.pages = pages
        self._one_at_a_time = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Request)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, method: str, event: dict[str, Any]) -> dict[str, Any]:
        """A request's answer: the pages' under their prefix, a refusal of an unsigned one,
        else the function's."""
        path = event["path"]
        if self.pages is not None and (
            path == self.pages[0] or path.startswith(self.pages[0] + "/")
        ):
            # (outside the one-at-a-time lock: the console calls the API over HTTP)
            query = event["multiValueQueryStringParameters"] or {}
            return self.pages[1](method, path, query)
        if event["requestContext"]["identity"]["userArn"] is None:
            # API Gateway with AWS_IAM auth refuses unsigned requests itself.
            return gateway_error(
                403, "MISSING_AUTHENTICATION_TOKEN", "Missing Authentication Token"
            )
        return self.invoke(event)

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        """The function's answer; a function that fails answers 502, as API Gateway does."""
        with self._one_at_a_time:
            try:
                return self.handler(event, LambdaContext("api", 29, self.clock))
            except Exception:
                _log.exception("the API function failed")
                return gateway_error(502, "INTERNAL_SERVER_ERROR", "Internal server error")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
