"""An HTTPS client for the Punctual API: SigV4-signed (service execute-api) with the
standard AWS credential chain, against a deployed stage or the local stack."""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

DEFAULT_LOCAL_ENDPOINT = "http://127.0.0.1:8766"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
# How much of an answer that is not the API's an error message quotes (one line).
EXCERPT_CHARS = 120


class BadEndpoint(ValueError):
    """An endpoint that is not an http(s) URL of an API; the message says why, in one line."""


class BadArgument(ValueError):
    """A value that cannot be one segment of a request's path (empty, ``.`` or ``..``)."""


def endpoint_url(text: str, source: str = "--endpoint") -> str:
    """``text`` as the API's base URL: http(s), a host, no query or fragment, no trailing
    slash. Without a scheme, a loopback host (the local stack, ``127.0.0.1:8766``) is taken
    as http://; any other host is refused rather than guessed (http or https?)."""
    given = text.strip()
    url = given if "://" in given else f"http://{given}"
    try:
        parts = urlsplit(url)
        port = parts.port  # (a ValueError for a port that is not one)
    except ValueError as error:
        raise BadEndpoint(f"{source} {text!r} is not a URL ({error})") from None
    if port == 0:
        raise BadEndpoint(f"{source} {text!r} is not a URL (port 0)")
    if "://" not in given and parts.hostname not in LOOPBACK:
        raise BadEndpoint(
            f"{source} {text!r} has no scheme: give the whole URL, "
            "e.g. https://API_ID.execute-api.REGION.amazonaws.com/prod"
        )
    if parts.scheme not in ("http", "https"):
        raise BadEndpoint(f"{source} {text!r}: only http:// and https:// URLs are APIs")
    if any(c.isspace() or not c.isprintable() for c in given):
        raise BadEndpoint(f"{source} {text!r} is not a URL (a space or a control character)")
    if not parts.hostname:
        raise BadEndpoint(f"{source} {text!r} names no host")
    if parts.query or parts.fragment or "#" in given or "?" in given:
        raise BadEndpoint(f"{source} {text!r}: the API's base URL has no query or fragment")
    return url.rstrip("/")


def segment(value: str) -> str:
    """``value`` percent-encoded as one path segment: whatever it holds (``/``, ``?``,
    ``#``, spaces, any script) stays inside it. ``.`` and ``..`` are refused: a server or
    proxy may resolve them as "this folder" and "the parent", another route."""
    if value in ("", ".", ".."):
        raise BadArgument("must not be empty" if not value else f"{value!r} is not an id")
    return quote(value, safe="")


def _one_line(text: str, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class ApiError(Exception):
    """The API answered an error; ``status`` 4xx is the caller's fault."""

    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else {}
        message = error.get("message") or (body.get("message") if isinstance(body, dict) else "")
        fields = "; ".join(
            f"{f.get('field')}: {f.get('reason')}"
            for f in error.get("fields") or []
            if isinstance(f, dict)
        )
        # One line whatever answered: the API's message, or an excerpt of someone else's
        # page (a proxy's HTML, a load balancer's text).
        text = f"{status} {_one_line(str(message or body or 'no body'), 1000)}"
        if fields and fields not in text:
            text += f" ({_one_line(fields, 1000)})"
        super().__init__(text)
        self.status = status
        self.body = body


class NoCredentials(Exception):
    pass


class BadAnswer(Exception):
    """Something answered at the endpoint, but not as the Punctual API does."""

    def __init__(self, endpoint: str, what: str) -> None:
        super().__init__(
            f"the API at {endpoint} {what}: is that the Punctual API? "
            "(check --endpoint or PUNCTUAL_ENDPOINT)"
        )


class Unreachable(ConnectionError):
    """Nothing answered at the endpoint; the message says where and what to check."""

    def __init__(self, endpoint: str, reason: object) -> None:
        host = urlsplit(endpoint).hostname or ""
        hint = (
            "is the local stack running? Start it with `make run` (or `punctual local up`)"
            if host in LOOPBACK
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
        """BadEndpoint for an endpoint that is not an http(s) URL (the message names where it
        came from: --endpoint or PUNCTUAL_ENDPOINT)."""
        if endpoint is not None:
            url = endpoint_url(endpoint)
        elif os.environ.get("PUNCTUAL_ENDPOINT"):
            url = endpoint_url(os.environ["PUNCTUAL_ENDPOINT"], "PUNCTUAL_ENDPOINT")
        else:
            url = DEFAULT_LOCAL_ENDPOINT
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        return cls(url, region)

    def _signed(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str]
    ) -> dict[str, str]:
        import boto3
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
        from botocore.exceptions import BotoCoreError

        if self.access_key_id is not None:
            credentials = Credentials(self.access_key_id, "local-secret")
        else:
            try:
                credentials = boto3.Session().get_credentials()
            except BotoCoreError as error:  # a profile that is not there, an expired SSO login
                raise NoCredentials(f"AWS credentials: {error}") from None
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
        """The answer's JSON body; ApiError for a 4xx or 5xx answer, Unreachable when
        nothing answers, BadAnswer when what answers is not the API. ``path`` is sent as
        given: its variable parts are the caller's to encode (``segment``)."""
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
                status, kind = answer.status, answer.headers.get_content_type()
        except urllib.error.HTTPError as error:
            try:
                raw = error.read()
            except (OSError, http.client.HTTPException):
                raw = b""
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            raise ApiError(error.code, parsed) from None
        except urllib.error.URLError as error:
            raise Unreachable(self.endpoint, _reason(error.reason)) from None
        except http.client.RemoteDisconnected:
            raise BadAnswer(self.endpoint, "closed the connection without answering") from None
        except http.client.HTTPException as error:  # not HTTP, or an answer cut short
            what = f"{type(error).__name__}: {_one_line(str(error))}"
            raise BadAnswer(self.endpoint, f"did not answer in HTTP ({what})") from None
        except OSError as error:  # reset, or timed out while answering
            raise Unreachable(self.endpoint, _reason(error)) from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            excerpt = _one_line(raw.decode("utf-8", "replace"))
            raise BadAnswer(
                self.endpoint, f"answered {status} with {kind} that is not JSON ({excerpt!r})"
            ) from None

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
        return self.call("POST", path, {} if body is None else body, headers=headers)

    def each_page(self, path: str, **query: Any) -> Iterator[dict[str, Any]]:
        """Each page of a paged list, the first one first."""
        token = None
        while True:
            page: dict[str, Any] = self.get(path, **query, next_token=token)
            yield page
            token = page.get("next_token")
            if not token:
                return

    def pages(self, path: str, key: str, **query: Any) -> list[Any]:
        """Every item of a paged list."""
        return [item for page in self.each_page(path, **query) for item in page[key]]


def _reason(reason: object) -> str:
    """``connection refused`` rather than ``[Errno 111] Connection refused``."""
    text = reason.strerror if isinstance(reason, OSError) and reason.strerror else str(reason)
    return text[:1].lower() + text[1:]
