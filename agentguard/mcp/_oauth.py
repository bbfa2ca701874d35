"""``--http`` as an OAuth 2.1 resource server (``[proxy.oauth]``), as the MCP authorization spec describes it.

The proxy publishes its protected-resource metadata (RFC 9728: its URL, its authorization server, the scopes it
needs) and answers a request without a usable token with ``401`` and a ``WWW-Authenticate`` header naming that
metadata, so a host can find whom to ask for a token; a token without a required scope gets ``403``. An access
token is a JWT signed by the configured issuer, checked here, locally, against the issuer's published keys
(fetched once at startup: an issuer whose keys cannot be had stops the proxy; fetched again, at most once a
minute, for a key id not seen yet): its signature, its issuer, its expiry, and its audience, which must name
this proxy (RFC 8707). A token meant for another server is refused, however valid otherwise. The SDK's
bearer middleware and metadata routes do the HTTP side (``mcp.server.auth``); pyjwt checks the token.

The host's token ends here: the upstream is reached with the proxy's own credentials (``[upstream] headers``),
never the host's (the spec forbids passing a token through). The static bearer token, if one is configured
too, is accepted beside the access tokens (for the operator's own agents).
"""

from __future__ import annotations

import hmac
import logging
from typing import Any
from urllib.parse import urlsplit

import anyio
import jwt
from mcp.server import Server
from mcp.server.auth.provider import AccessToken

from ._config import OAuthConfig

log = logging.getLogger("agentguard.mcp")

STATIC_CLIENT = "agentguard-proxy-token"
"""The client id the proxy's own bearer token stands for."""

_REFETCH_AFTER = 60.0  # seconds: a token naming an unknown key fetches the issuer's keys again, no more often


class KeysUnavailable(Exception):
    """The issuer's signing keys cannot be had (its metadata or its JWKS cannot be fetched or read)."""


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer publishes its metadata: RFC 8414 (the well-known path before the issuer's own path),
    then OpenID Connect Discovery (after it)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    base = f"{parts.scheme}://{parts.netloc}"
    return [f"{base}/.well-known/oauth-authorization-server{path}", f"{base}{path}/.well-known/openid-configuration"]


class AccessTokens:
    """The proxy's ``TokenVerifier`` (``mcp.server.auth.provider``): an access token of its issuer, meant for
    this proxy, or the proxy's own bearer token."""

    def __init__(self, oauth: OAuthConfig, resource: str, static_token: str | None) -> None:
        self.oauth = oauth
        self.resource = resource
        self._audiences = sorted({resource.rstrip("/"), resource.rstrip("/") + "/"})
        self._static = static_token.encode() if static_token else None
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at = -_REFETCH_AFTER
        self._lock = anyio.Lock()

    async def load(self) -> None:
        """Fetch the issuer's signing keys; KeysUnavailable if they cannot be had."""
        async with self._lock:
            await self._fetch()

    async def _fetch(self) -> None:
        import httpx2

        self._fetched_at = anyio.current_time()
        async with httpx2.AsyncClient(timeout=10.0, follow_redirects=False) as http:
            url = self.oauth.jwks_url or await self._jwks_uri(http)
            try:
                answer = await http.get(url)
                answer.raise_for_status()
                keys = jwt.PyJWKSet.from_dict(answer.json())
            except (httpx2.HTTPError, ValueError, jwt.PyJWKSetError) as exc:
                raise KeysUnavailable(f"cannot read the signing keys at {url}: {exc}") from None
        self._keys = {key.key_id: key for key in keys.keys}

    async def _jwks_uri(self, http: Any) -> str:
        import httpx2

        problems = []
        for url in metadata_urls(self.oauth.issuer):
            try:
                answer = await http.get(url)
                if answer.status_code == 404:
                    problems.append(f"{url}: 404")
                    continue
                answer.raise_for_status()
                metadata = answer.json()
            except (httpx2.HTTPError, ValueError) as exc:
                problems.append(f"{url}: {exc}")
                continue
            if not isinstance(metadata, dict) or metadata.get("issuer") != self.oauth.issuer:
                # RFC 8414 section 3.3: metadata naming another issuer is not this issuer's.
                raise KeysUnavailable(f"the metadata at {url} is not the issuer {self.oauth.issuer!r}'s")
            if not isinstance(metadata.get("jwks_uri"), str):
                raise KeysUnavailable(f"the metadata at {url} names no jwks_uri; set `jwks_url`")
            return str(metadata["jwks_uri"])
        raise KeysUnavailable("cannot fetch the issuer's metadata (" + "; ".join(problems) + "); set `jwks_url`")

    async def _key(self, kid: str | None) -> jwt.PyJWK | None:
        key = self._keys.get(kid) if kid is not None or len(self._keys) != 1 else next(iter(self._keys.values()))
        if key is not None:
            return key
        async with self._lock:  # a key the issuer has added since: fetched again, at most once a minute
            if anyio.current_time() - self._fetched_at >= _REFETCH_AFTER:
                try:
                    await self._fetch()
                except KeysUnavailable as exc:
                    log.warning("%s", exc)
        return self._keys.get(kid)

    async def verify_token(self, token: str) -> AccessToken | None:
        if self._static is not None and hmac.compare_digest(token.encode(), self._static):
            return AccessToken(token=token, client_id=STATIC_CLIENT, scopes=list(self.oauth.scopes),
                               resource=self.resource)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return _refused("it is neither the proxy's token nor a signed access token (JWT)")
        key = await self._key(header.get("kid") if isinstance(header.get("kid"), str) else None)
        if key is None:
            return _refused(f"it is signed with a key the issuer {self.oauth.issuer!r} does not publish")
        try:
            claims = jwt.decode(token, key=key, algorithms=list(self.oauth.algorithms), audience=self._audiences,
                                issuer=self.oauth.issuer, leeway=self.oauth.leeway,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.InvalidAudienceError:
            return _refused(f"it is meant for another server, not {self.resource}")
        except jwt.InvalidIssuerError:
            return _refused(f"it was issued by another authorization server than {self.oauth.issuer!r}")
        except jwt.ExpiredSignatureError:
            return _refused("it has expired")
        except jwt.InvalidTokenError as exc:
            return _refused(f"it is not valid ({exc})")
        return AccessToken(token=token, client_id=_client_id(claims), scopes=_scopes(claims),
                           expires_at=int(claims["exp"]), resource=self.resource,
                           subject=claims["sub"] if isinstance(claims.get("sub"), str) else None,
                           claims={"iss": claims["iss"]})


def _refused(why: str) -> AccessToken | None:
    log.warning("refused an HTTP request's access token: %s", why)  # (never the token itself)
    return None


def _client_id(claims: dict[str, Any]) -> str:
    for name in ("client_id", "azp", "sub"):  # RFC 9068's, then OpenID's
        if isinstance(claims.get(name), str):
            return str(claims[name])
    return "unknown"


def _scopes(claims: dict[str, Any]) -> list[str]:
    scope = claims.get("scope")
    if isinstance(scope, str):
        return scope.split()
    scp = claims.get("scp")
    return [s for s in scp if isinstance(s, str)] if isinstance(scp, list) else []


def oauth_app(server: Server[Any], host: str, oauth: OAuthConfig, verifier: AccessTokens) -> Any:
    """The proxy's Starlette app with the SDK's resource-server side: the bearer middleware, the 401/403
    answers naming the metadata, and the metadata route."""
    from mcp.server.auth.settings import AuthSettings

    # Parsed by the settings themselves, which keep a path-less issuer as it is written (no trailing slash):
    # RFC 8414 compares issuers as strings.
    auth = AuthSettings.model_validate({"issuer_url": oauth.issuer, "resource_server_url": verifier.resource,
                                        "required_scopes": oauth.scopes or None, "validate_token_resource": True})
    return server.streamable_http_app(host=host, auth=auth, token_verifier=verifier)
