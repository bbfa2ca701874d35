"""Who may act: the token printed at start, a cookie that carries it, and the checks every action passes.

The console is read-only to anyone who can reach it; settling an operation, and opening a record's values
(arguments, results), need the token printed with the URL at start (as notebook servers do). Opening
``/?token=...`` once sets a cookie (HttpOnly, SameSite=Strict, named after the port so two consoles on one
host do not overwrite each other's) and redirects to the page without the token in its address.

An action is a POST that passes all of these, else 403:

- the cookie matches the token (compared in constant time);
- the form's ``csrf`` field matches (an HMAC of the token: only pages served to the token holder carry it);
- a browser's ``Origin`` header, when sent, is this console's own, and ``Sec-Fetch-Site`` is not cross-site.

Every request's ``Host`` must name the address the console listens on (a loopback name when it listens on a
loopback address), so a page elsewhere cannot reach it through a rebound DNS name.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _mac(token: str, purpose: str) -> str:
    return hmac.new(token.encode(), purpose.encode(), hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class Gate:
    """The token's checks for one console listening on ``host:port``."""

    def __init__(self, token: str, host: str, port: int) -> None:
        self._token = token
        self.cookie = f"agentguard_console_{port}"
        self._session = _mac(token, "session")
        self.csrf = _mac(token, "csrf")
        self.port = port
        names: tuple[str, ...]
        if is_loopback(host):
            names = LOOPBACK_NAMES
        elif host in ("0.0.0.0", "::", ""):  # told to listen everywhere: any name that reaches it
            names = ()
        else:
            names = (f"[{host}]" if ":" in host else host,)
        self._hosts = frozenset(f"{n}:{port}" for n in names)

    def host_allowed(self, host_header: str | None) -> bool:
        return not self._hosts or (host_header or "").lower() in self._hosts

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self._token.encode())

    def session_value(self) -> str:
        return self._session

    def signed_in(self, cookies: Mapping[str, str]) -> bool:
        return hmac.compare_digest(cookies.get(self.cookie, "").encode(), self._session.encode())

    def action_refused(self, cookies: Mapping[str, str], headers: Mapping[str, str], csrf: str | None,
                       own_origin: str) -> str | None:
        """Why an action is refused (403), or None if it may go ahead."""
        if not self.signed_in(cookies):
            return ("actions need the token printed when the console started: open the console's URL with "
                    "?token=... once")
        if not hmac.compare_digest((csrf or "").encode(), self.csrf.encode()):
            return "the form's anti-forgery field is missing or wrong: reload the page and try again"
        origin = headers.get("origin")
        if origin is not None and origin != own_origin:
            return f"a cross-site request (from {origin}) cannot act here"
        if headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            return "a cross-site request cannot act here"
        return None
