"""An HTTPS client for the Punctual API: SigV4-signed (service execute-api) with the
standard AWS credential chain, against a deployed stage or the local stack."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

DEFAULT_LOCAL_ENDPOINT = "http://127.0.0.1:8766"


class ApiError(Exception):
    """The API answered an error; ``status`` 4xx is the caller's fault."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = error.get("message") or (body.get("message") if isinstance(body, dict) else "")
        fields = "; ".join(f"{f['field']}: {f['reason']}" for f in error.get("fields", []))
        text = f"{status} {message or body}"
        if fields and fields not in text:
            text += f" ({fields})"
        super().__init__(text)
        self.status = status
        self.body = body


class NoCredentials(Exception):
    pass


class Unreachable(ConnectionError):
    """Nothing answered at the endpoint; the message says where and what to check."""

    def __init__(self, endpoint: str, reason: object) -> None:
        host = urlsplit(endpoint).hostname or ""
        hint = (
            "is the local stack running? Start it with `make run` (or `punctual local up`)"
            if host in ("127.0.0.1", "localhost", "::1")
            else "check --endpoint or PUNCTUAL_ENDPOINT, and the network"
        )
        super().__init__(f"cannot reach the Punctual API at {endpoint} ({reason}): {hint}")


@dataclass
class Client:
    endpoint: str
    region: str = "us-east-1"
    timeout: float = 30
    # Sign as this access key id instead of the credential chain (the local stack's demo).
    access_key_id: str | None = None

    @classmethod
    def from_environment(cls, endpoint: str | None = None) -> Client:
        url = endpoint or os.environ.get("PUNCTUAL_ENDPOINT") or DEFAULT_LOCAL_ENDPOINT
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        return cls(url.rstrip("/"), region)

    def _signed(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str]
    ) -> dict[str, str]:
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        if self.access_key_id is not None:
            credentials = Credentials(self.access_key_id, "local-secret")
        else:
            credentials = boto3.Session().get_credentials()
            if credentials is None:
                raise NoCredentials("no AWS credentials found (environment, profile or role)")
        request = AWSRequest(method=method, url=url, data=body, headers=headers)
        SigV4Auth(credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(
            request
        )
        return dict(request.headers.items())

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The answer's JSON body; ApiError for a 4xx or 5xx answer."""
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.endpoint + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        signed = self._signed(
            method, url, data, {"Content-Type": "application/json", **(headers or {})}
        )
        request = urllib.request.Request(url, data=data, method=method, headers=signed)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                raw = answer.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            raise ApiError(error.code, parsed) from None
        except urllib.error.URLError as error:
            raise Unreachable(self.endpoint, _reason(error.reason)) from None

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.call("POST", path, {} if body is None else body, headers=headers)

    def pages(self, path: str, key: str, **query: Any) -> list[Any]:
        """Every item of a paged list."""
        items: list[Any] = []
        token = None
        while True:
            page = self.get(path, **query, next_token=token)
            items += page[key]
            token = page.get("next_token")
            if not token:
                return items


def _reason(reason: object) -> str:
    """``connection refused`` rather than ``[Errno 111] Connection refused``."""
    text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
    return text[:1].lower() + text[1:]
