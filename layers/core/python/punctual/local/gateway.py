"""The local stand-in for API Gateway: HTTP requests -> REST proxy events -> the API Lambda.

Requests are signed with SigV4 as against AWS; locally the access key id names the
caller's principal (``arn:aws:iam::000000000000:user/<access key id>``) and the signature
is NOT verified: the server listens on loopback only.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from punctual.local.engines import ACCOUNT

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


STAGE = "prod"  # the deployed stage (infra/api.py): its URLs carry it, locally optional


def api_path(path: str) -> str:
    """The path the API routes on: ``/prod/v1/...`` (a deployed stage's URL) as ``/v1/...``."""
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
    body: str | None = None,
    query: dict[str, list[str]] | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An API Gateway REST proxy event, as the IAM-authorized proxy integration sends it."""
    query = query or {}
    request_id = str(uuid.uuid4())
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": {"Content-Type": "application/json", **(headers or {})},
        "multiValueHeaders": {},
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "body": body,
        "isBase64Encoded": False,
        "requestContext": {
            "httpMethod": method,
            "path": f"/{STAGE}{path}",
            "resourcePath": "/{proxy+}",
            "stage": STAGE,
            "requestId": request_id,
            "identity": {"userArn": principal, "sourceIp": "127.0.0.1"},
        },
    }


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


class Gateway:
    """A threaded HTTP server on 127.0.0.1 that invokes ``handler`` per request."""

    def __init__(self, handler: LambdaHandler, port: int, clock: Callable[[], float]) -> None:
        gateway = self

        class Request(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode("utf-8") if length else None
                event = rest_event(
                    self.command,
                    api_path(url.path) or "/",
                    principal_of(self.headers.get("Authorization")),
                    body,
                    parse_qs(url.query),
                    dict(self.headers.items()),
                )
                if event["requestContext"]["identity"]["userArn"] is None:
                    # API Gateway with AWS_IAM auth refuses unsigned requests itself.
                    answer: dict[str, Any] = {
                        "statusCode": 403,
                        "body": json.dumps({"message": "Missing Authentication Token"}),
                    }
                else:
                    answer = gateway.handler(event, LambdaContext("api", 29, gateway.clock))
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
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per request would drown the demo's output

        self.handler = handler
        self.clock = clock
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Request)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
