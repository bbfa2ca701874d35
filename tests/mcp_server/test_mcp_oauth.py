"""``agentguard mcp-proxy --http`` as an OAuth 2.1 resource server (``[proxy.oauth]``), run as the real command:
it publishes its protected-resource metadata, answers a request without a usable token with 401 naming that
metadata, accepts an access token of its authorization server meant for it (hosts of both eras, the real ``mcp``
Client), and refuses one meant for another server, expired, from another issuer or signed with another key;
the host's token never reaches the upstream. The authorization server is a small one on loopback: its metadata
(RFC 8414) and its signing keys (a JWKS), tokens signed with pyjwt."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from http_proxies import ROOT, TOKEN, env, free_socket, host, http_proxy, serve_asgi
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from task_upstream import TaskUpstream
from upstream_log import events

from agentguard.mcp import META_REPLAYED

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.storeless]

TOOLS = '[tools.pay]\nkey = ["order_id"]\nforward_key_to = "idempotency_key"\n'


class Issuer:
    """An authorization server: its metadata and its public keys; it signs access tokens with its private key."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.url = ""

    def app(self) -> Starlette:
        async def metadata(request: Request) -> JSONResponse:
            base = self.url
            return JSONResponse({"issuer": base, "jwks_uri": f"{base}/jwks", "token_endpoint": f"{base}/token",
                                 "authorization_endpoint": f"{base}/authorize"})

        async def jwks(request: Request) -> JSONResponse:
            public = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
            return JSONResponse({"keys": [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]})

        return Starlette(routes=[Route("/.well-known/oauth-authorization-server", metadata), Route("/jwks", jwks)])

    def token(self, audience: str, *, scope: str = "payments", issuer: str | None = None, expires_in: float = 300,
              key: Any = None, kid: str = "k1") -> str:
        now = int(time.time())
        claims = {"iss": issuer or self.url, "aud": audience, "sub": "alice", "client_id": "claude-code",
                  "scope": scope, "iat": now, "exp": now + int(expires_in)}
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": kid})


@contextlib.asynccontextmanager
async def setting(tmp_path: Path, store_url: str, *, token: str | None = None,
                  issuer_url: str | None = None) -> AsyncIterator[tuple[Issuer, Any, TaskUpstream]]:
    """The authorization server, the upstream (over HTTP, with credentials of the proxy's own), the proxy."""
    issuer = Issuer()
    upstream = TaskUpstream(tmp_path / "upstream.jsonl")
    async with serve_asgi(issuer.app(), path="") as issuer_served, \
            serve_asgi(upstream.server.streamable_http_app(host="127.0.0.1")) as upstream_url:
        issuer.url = issuer_url or issuer_served
        config = tmp_path / "agentguard.toml"
        config.write_text(
            f'[store]\nurl = "{store_url}"\n\n'
            f'[upstream]\nurl = "{upstream_url}"\nheaders = {{ Authorization = "Bearer upstream-secret" }}\n\n'
            f'[proxy]\ngrace = 1\n{f"token = {TOKEN!r}" if token else ""}\n\n'
            f'[proxy.oauth]\nissuer = "{issuer.url}"\nscopes = ["payments"]\n\n{TOOLS}')
        async with http_proxy(config, token=None) as proxy:
            yield issuer, proxy, upstream


async def test_the_proxy_accepts_the_access_tokens_meant_for_it(tmp_path: Path, store_url: str) -> None:
    async with setting(tmp_path, store_url, token=TOKEN) as (issuer, proxy, upstream), httpx2.AsyncClient() as http:
        metadata = await http.get(proxy.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp"))
        challenge = await http.post(proxy.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                    headers={"Accept": "application/json, text/event-stream"})
        access = issuer.token(proxy.url)
        results = []
        for mode in ("legacy", "auto"):
            async with host(proxy.url, mode, token=access) as client:
                results.append(await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-1"}))
        async with host(proxy.url, "auto", token=TOKEN) as client:  # the operator's own token, beside them
            results.append(await client.call_tool("pay", {"order_id": "o-1", "task_id": "t-1"}))
    assert metadata.status_code == 200
    assert metadata.json()["resource"] == proxy.url and metadata.json()["authorization_servers"] == [issuer.url]
    assert metadata.json()["scopes_supported"] == ["payments"]
    assert challenge.status_code == 401
    assert f'resource_metadata="{metadata.url}"' in challenge.headers["www-authenticate"]
    assert [bool(r.meta and r.meta[META_REPLAYED]) for r in results] == [False, True, True]
    assert len(events(upstream.log, "pay")) == 1
    # The host's token ends at the proxy: the upstream saw the proxy's own credentials on every request.
    seen = events(upstream.log, "call") + events(upstream.log, "get")
    assert seen and {e["authorization"] for e in seen} == {"Bearer upstream-secret"}


async def test_a_token_not_meant_for_this_proxy_is_refused(tmp_path: Path, store_url: str) -> None:
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    async with setting(tmp_path, store_url) as (issuer, proxy, upstream), httpx2.AsyncClient() as http:
        cases = {
            "another server's": (issuer.token("http://127.0.0.1:1/mcp"), 401, "meant for another server"),
            "another issuer's": (issuer.token(proxy.url, issuer="http://evil.example"), 401, "another authorization"),
            "forged": (issuer.token(proxy.url, key=other_key), 401, "not valid"),
            "unknown key": (issuer.token(proxy.url, kid="k2"), 401, "does not publish"),
            "expired": (issuer.token(proxy.url, expires_in=-120), 401, "has expired"),
            "not a JWT": ("x" * 40, 401, "neither the proxy's token nor"),
            "the proxy's bearer token, not configured": (TOKEN, 401, "neither the proxy's token nor"),
            "without the scope": (issuer.token(proxy.url, scope="read"), 403, None),
        }
        answers = {}
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "pay", "arguments": {"order_id": "o-1", "task_id": "t-1"}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}}}}
        for name, (token, _, _) in cases.items():
            answers[name] = await http.post(proxy.url, json=call, headers={
                "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                "Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "pay"})
        stderr = "\n".join(proxy.stderr)
    for name, (_, status, said) in cases.items():
        assert answers[name].status_code == status, name
        assert said is None or said in stderr, name
    assert events(upstream.log, "call") == []  # none reached the upstream
    assert "x" * 40 not in stderr  # (a token is never logged)


async def test_an_issuer_whose_keys_cannot_be_had_stops_the_proxy(tmp_path: Path, store_url: str) -> None:
    with free_socket() as closed:  # an address nobody answers on
        issuer = f"http://127.0.0.1:{closed.getsockname()[1]}"
    config = tmp_path / "agentguard.toml"
    config.write_text(f'[store]\nurl = "{store_url}"\n\n'
                      f'[upstream]\ncommand = ["python", "{ROOT / "tests" / "full_upstream.py"}"]\n'
                      f'env = {{ FULL_LOG = "{tmp_path / "upstream.jsonl"}" }}\n\n[proxy.oauth]\nissuer = "{issuer}"\n')
    cmd = [sys.executable, "-m", "agentguard.cli", "mcp-proxy", "--config", str(config), "--http", "0"]
    with anyio.fail_after(60):
        out = await anyio.run_process(cmd, env=env(), cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)
    stderr = out.stderr.decode()
    assert out.returncode == 2 and "proxy.oauth" in stderr and "cannot fetch the issuer's metadata" in stderr, stderr
