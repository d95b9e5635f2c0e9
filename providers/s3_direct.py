"""GETs and PUTs of one bucket signed and sent with the botocore client's own parts, without a client call.

A botocore client call does much besides its request: it resolves the endpoint from S3's rule set,
serializes the parameters, fires a dozen events, builds the user agent and parses every response
header (dates with dateutil). Measured on moto, a GET of a 3.6 MB chunk object costs 3.2 ms of CPU
through ``get_object`` and 1.6 ms sent this way; a read-ahead window, a restore step and a Spark split
are each one such GET, so that machinery was half of what a cold read spent on its GETs. Every
archiver commit is one or two PUTs, which pay the same machinery.

``DirectRequests.learn`` takes, from one GET or PUT the client made, the URL it sent (captured by
``capture_sent_url`` at ``before-send``), and keeps the part before the key when the rest is exactly
the key as botocore quotes it. Later requests for that bucket go to that URL prefix plus their key,
signed with SigV4 as the client signs them (its credentials, region and configuration, so the
payload is hashed or left unsigned as the client would), through the client's own HTTP session: its
connection pool, timeouts, proxies and TLS settings. Their answers mean what the client's would:

- 2xx: for a GET the body and the response headers (the caller checks length and checksum as it
  does for the client's answers);
- 416 for a GET: ``None``, the object ends before the range starts;
- a redirect, a 400 (another region, an endpoint that moved) or a signature the server does not
  accept: ``DirectRequestUnusable``; the caller has the client, which handles those, make the call,
  and stops using this object if the client's call succeeds;
- any other status: ``botocore.exceptions.ClientError`` with the error body's code and the HTTP
  status, as the client raises it; a reply cut short: ``ResponseStreamingError``.
"""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import botocore.exceptions
import urllib3.exceptions
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest

__all__ = ["DirectRequestUnusable", "DirectRequests", "capture_sent_url", "last_sent_url"]

_KEY_SAFE = "/~"  # what botocore leaves unquoted in an S3 key (its ``{Key+}`` URI label)
_SENT = threading.local()


class DirectRequestUnusable(Exception):
    """The learned URL or signature no longer reaches this bucket's objects (a redirect or a 400)."""


def capture_sent_url(request: Any, **_: Any) -> None:
    """``before-send`` handler: remember, per thread, the URL of the request the client sends."""
    _SENT.url = request.url


def last_sent_url() -> str | None:
    """The URL of the last request a client with ``capture_sent_url`` sent from this thread."""
    return getattr(_SENT, "url", None)


@dataclass(frozen=True, slots=True)
class DirectRequests:
    """Requests for one bucket's objects: ``prefix`` + quoted key, signed as ``client`` signs, sent on its session."""

    prefix: str
    region: str
    credentials: Any = field(repr=False)  # botocore Credentials (refreshable ones refresh when frozen)
    config: Any = field(repr=False)  # the client's botocore Config: it decides whether a payload is signed
    http: Any = field(repr=False)  # the client's botocore URLLib3Session

    @classmethod
    def learn(cls, client: Any, credentials: Any, key: str, sent_url: str | None) -> DirectRequests | None:
        """From a request for ``key`` that ``client`` sent to ``sent_url``; None when it cannot be repeated exactly."""
        http = getattr(getattr(client, "_endpoint", None), "http_session", None)
        region = client.meta.region_name
        suffix = "/" + quote(key, safe=_KEY_SAFE)
        if (
            sent_url is None
            or http is None
            or credentials is None
            or not region
            or "?" in sent_url
            or not sent_url.endswith(suffix)
        ):
            return None
        return cls(sent_url[: -len(suffix)], region, credentials, client.meta.config, http)

    def get(self, key: str, start: int, length: int) -> tuple[bytes, Mapping[str, str]] | None:
        """Bytes [start, start + length) of ``key`` and the response headers; None if the object ends first."""
        status, body, headers = self._send(
            "GET", key, {"Range": f"bytes={start}-{start + length - 1}", "x-amz-checksum-mode": "ENABLED"}
        )
        if status == 416:
            return None
        return body, headers

    def put(self, key: str, data: bytes | bytearray, headers: Mapping[str, str]) -> None:
        """Store ``data`` at ``key`` with ``headers`` (checksum, conditions, encryption)."""
        self._send("PUT", key, headers, data)

    def signed(
        self, method: str, key: str, headers: Mapping[str, str], data: bytes | bytearray | None = None
    ) -> AWSPreparedRequest:
        """The request for ``key``, signed with SigV4 as the client signs a GetObject or PutObject."""
        url = self.prefix + "/" + quote(key, safe=_KEY_SAFE)
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        # The client's Config decides whether the payload is signed; like the client's PutObject with a
        # checksum we supply, a body is signed (SHA-256) unless the Config turns payload signing off.
        request.context["client_config"] = self.config
        S3SigV4Auth(self.credentials.get_frozen_credentials(), "s3", self.region).add_auth(request)
        return request.prepare()

    def _send(
        self, method: str, key: str, headers: Mapping[str, str], data: bytes | bytearray | None = None
    ) -> tuple[int, bytes, Mapping[str, str]]:
        prepared = self.signed(method, key, headers, data)
        prepared.stream_output = True
        response = self.http.send(prepared)
        raw = response.raw
        try:
            body = raw.read()
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise botocore.exceptions.ResponseStreamingError(error=error) from error
        finally:
            raw.release_conn()
        status = response.status_code
        if 200 <= status < 300 or (status == 416 and method == "GET"):
            return status, body, response.headers
        code = _error_code(body) or str(status)
        if 300 <= status < 400 or status == 400 or code == "SignatureDoesNotMatch":
            raise DirectRequestUnusable(f"HTTP {status} {code}")
        parsed: dict[str, Any] = {
            "Error": {"Code": code},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }
        raise botocore.exceptions.ClientError(parsed, "GetObject" if method == "GET" else "PutObject")  # type: ignore[arg-type]


def _error_code(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document, if the body is one."""
    try:
        return ElementTree.fromstring(body).findtext("Code")
    except ElementTree.ParseError:
        return None
