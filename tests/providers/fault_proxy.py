"""An HTTP proxy in front of the moto server that answers chosen requests with S3 errors.

A rule matches by method (and optionally a path substring) for its next ``times`` requests; it
either answers with the error instead of forwarding (the request never reached S3) or forwards
first and then answers with the error (the bytes landed, the reply was lost).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "host"}


@dataclass
class FaultRule:
    method: str
    status: int
    code: str
    times: int = 1
    path_contains: str = ""
    after_forwarding: bool = False

    def matches(self, request: web.Request) -> bool:
        return self.times > 0 and request.method == self.method and self.path_contains in request.path_qs


class FaultProxy:
    """Forwards to ``upstream``; records every request as ``(method, path)``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.rules: list[FaultRule] = []
        self.requests: list[tuple[str, str]] = []
        self.endpoint_url = ""
        self._session: aiohttp.ClientSession | None = None

    def fail(self, rule: FaultRule) -> FaultRule:
        self.rules.append(rule)
        return rule

    def count(self, method: str) -> int:
        return sum(1 for seen, _ in self.requests if seen == method)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.method, request.path_qs))
        rule = next((rule for rule in self.rules if rule.matches(request)), None)
        if rule is not None:
            rule.times -= 1
            if not rule.after_forwarding:
                return self._error(rule)
        assert self._session is not None
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method, f"{self.upstream}{request.path_qs}", headers=headers, data=body
        ) as upstream:
            payload = await upstream.read()
            reply_headers = {
                name: value
                for name, value in upstream.headers.items()
                if name.lower() not in _HOP_BY_HOP | {"content-encoding"}
            }
            status = upstream.status
        if rule is not None:
            return self._error(rule)
        return web.Response(status=status, body=payload, headers=reply_headers)

    @staticmethod
    def _error(rule: FaultRule) -> web.Response:
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f"<Error><Code>{rule.code}</Code><Message>injected by the test proxy</Message></Error>"
        )
        return web.Response(status=rule.status, body=xml.encode(), content_type="application/xml")

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FaultProxy]:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.endpoint_url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(auto_decompress=False)
        try:
            yield self
        finally:
            await self._session.close()
            await runner.cleanup()
