"""The proxy's TOML configuration, validated with pydantic, then against the upstream's tools.

Every mistake is collected and reported with its field (and its line, where it can be found) before the
proxy serves anything: first the file itself (:func:`parse_config`), then, once the upstream is connected,
every ``[tools.NAME]`` against the tools it offers (:func:`tool_problems`). Relative paths (a SQLite store,
the upstream's working directory) are relative to the directory of the config file, so a config works the
same whichever directory a host starts it from.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from .. import _names
from .._shapes import SHAPES, SHORTEST, key_shape, unknown_shape
from .._storeconfig import DEFAULT_URL, ENV_URL, absolute_sqlite

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
PositiveSeconds = Annotated[float, Field(gt=0)]


def _url(*schemes: str, problem: str) -> AfterValidator:
    """A URL field that must start with one of ``schemes``."""

    def check(v: str) -> str:
        if not v.startswith(schemes):
            raise ValueError(problem)
        return v

    return AfterValidator(check)


def _shape(v: str | int) -> str | int:
    if isinstance(v, str) and v not in SHAPES:
        raise ValueError(f"{unknown_shape(v)}; or give the provider's maximum key length (at least {SHORTEST})")
    if isinstance(v, int) and v < SHORTEST:
        raise ValueError(f"a key of at most {v} characters cannot hold 160 bits of the key; give at least {SHORTEST}")
    key_shape(v)
    return v


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreConfig(_Model):
    url: Annotated[str, _url("sqlite+aiosqlite://", "postgresql+asyncpg://",
                             problem="must start with sqlite+aiosqlite:// or postgresql+asyncpg://")] | None = None
    """SQLAlchemy async URL; default ``$AGENTGUARD_URL``, else ``sqlite+aiosqlite:///agentguard.db``."""
    scope: str = Field(default="default", min_length=1, max_length=255)
    lease: PositiveSeconds = 30.0
    retention: PositiveSeconds = 7 * 86400.0
    startup_wait: Annotated[float, Field(ge=0)] = 10.0
    """Seconds the proxy keeps retrying, at startup, a store it cannot reach (connection refused or timed
    out) before it exits with status 2. A store that answers but cannot be used (bad credentials, no such
    database, an unwritable SQLite folder) stops it at once."""


class UpstreamConfig(_Model):
    command: list[str] | None = Field(default=None, min_length=1)
    url: Annotated[str, _url("http://", "https://", problem="must be an http:// or https:// URL")] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[str] = Field(default_factory=list)
    cwd: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    mode: str = "auto"
    """How the proxy talks to the upstream: ``auto`` (probe, fall back), ``legacy`` or a protocol version."""
    timeout: PositiveSeconds = 120.0
    """Seconds to wait for one upstream tool call; past it the outcome is unknown."""

    @field_validator("pass_env")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
        if bad:
            raise ValueError(f"not environment variable names: {', '.join(map(repr, bad))}")
        return v

    @model_validator(mode="after")
    def _one_target(self) -> UpstreamConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (a stdio server) or `url` (streamable HTTP)")
        if self.url is not None and (self.env or self.pass_env or self.cwd):
            raise ValueError("`env`, `pass_env` and `cwd` apply to a `command` upstream only")
        if self.command is not None and self.headers:
            raise ValueError("`headers` apply to a `url` upstream only")
        return self


class ToolConfig(_Model):
    key: list[str] = Field(default_factory=list)
    """Arguments whose values tell operations apart within a task (none: one operation per task)."""
    ignore: list[str] = Field(default_factory=list)
    """Arguments left out of the fingerprint (cosmetic: a memo, a description)."""
    forward_key_to: str | None = None
    """An upstream argument that receives the downstream key (``idempotency_key`` for Stripe-like servers)."""
    forward_key_shape: Annotated[StrictStr | StrictInt, AfterValidator(_shape)] | None = None
    """The forwarded key written for a provider that takes shorter keys: ``"square"`` (45 characters), a
    maximum length; default: as it is (51 characters: Stripe, Adyen). ``_meta`` carries the key as it is."""
    errors_final: bool = False
    """Store an upstream error result and replay it; otherwise an error releases the claim for a retry."""
    on_unknown: Literal["retry", "hold"] | None = None
    """When the upstream call's outcome is unknown (the upstream died or timed out mid-call): ``retry``
    releases the claim so a retry goes upstream with the same key; ``hold`` records the call as unknown
    and refuses to run it again. Default: ``retry`` if ``forward_key_to`` is set, else ``hold``."""
    on_conflict: Literal["wait", "error"] | None = None
    wait_timeout: PositiveSeconds | None = None
    mark_structured: str | None = None
    """Add this boolean to a replayed structuredContent (and, optional, to the relayed outputSchema)."""
    confirm: bool = False
    """Ask the user (MCP elicitation) before the first run of a call, never on a replay; a call the user does
    not confirm is refused and its claim released."""
    confirm_without_elicitation: Literal["refuse", "run"] | None = None
    """With ``confirm``, a host that cannot ask its user: ``refuse`` the call (the default) or ``run`` it."""

    @model_validator(mode="after")
    def _consistent(self) -> ToolConfig:
        both = sorted(set(self.key) & set(self.ignore))
        if both:
            raise ValueError(f"{', '.join(both)} cannot be both in `key` and in `ignore`")
        if self.forward_key_to is not None and self.forward_key_to in self.key:
            raise ValueError(f"`forward_key_to` ({self.forward_key_to}) cannot also be a key field")
        names = [*self.key, *self.ignore, *([self.forward_key_to] if self.forward_key_to else [])]
        if "task_id" in names:
            raise ValueError("`task_id` is added by the proxy; it cannot be a key, ignored or forwarded field")
        if self.confirm_without_elicitation is not None and not self.confirm:
            raise ValueError("`confirm_without_elicitation` applies only with `confirm = true`")
        return self

    @model_validator(mode="after")
    def _shape_has_a_key(self) -> ToolConfig:
        if self.forward_key_shape is not None and self.forward_key_to is None:
            raise ValueError("`forward_key_shape` applies only with `forward_key_to`")
        return self

    @property
    def unknown_policy(self) -> Literal["retry", "hold"]:
        if self.on_unknown is not None:
            return self.on_unknown
        return "retry" if self.forward_key_to else "hold"


_ASYMMETRIC = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


def _usual_algorithms() -> list[_ASYMMETRIC]:
    return ["RS256", "ES256"]


class OAuthConfig(_Model):
    """``--http`` as an OAuth 2.1 resource server: access tokens (signed JWTs) from one authorization server."""

    issuer: Annotated[str, _url("https://", "http://", problem="must be an https:// (or http://) URL")]
    """The authorization server: a token's ``iss`` must be exactly this; advertised in the protected-resource
    metadata, where hosts find whom to ask for a token."""
    resource: Annotated[str, _url("https://", "http://", problem="must be an https:// (or http://) URL")] | None = None
    """This proxy's URL as its hosts reach it (``https://mcp.example.com/mcp``): a token's audience (``aud``)
    must name it. Default: the URL the proxy serves (right when hosts connect to it directly)."""
    jwks_url: Annotated[str, _url("https://", "http://", problem="must be an https:// (or http://) URL")] | None = None
    """The issuer's signing keys (a JWKS). Default: the ``jwks_uri`` of the issuer's metadata (RFC 8414)."""
    scopes: list[str] = Field(default_factory=list)
    """Scopes every token must carry (``scope``/``scp``); a token without one of them gets 403."""
    algorithms: list[_ASYMMETRIC] = Field(default_factory=_usual_algorithms, min_length=1)
    """The signature algorithms accepted (asymmetric only: the proxy holds no shared secret)."""
    leeway: Annotated[float, Field(ge=0, le=300)] = 30.0
    """Seconds of clock difference tolerated on ``exp`` and ``nbf``."""


class ProxyConfig(_Model):
    name: str = "agentguard-proxy"
    on_conflict: Literal["wait", "error"] = "wait"
    wait_timeout: PositiveSeconds = 20.0
    """How long an in-flight duplicate waits for the first call; keep it well under the host's tool timeout."""
    grace: Annotated[float, Field(ge=0)] = 5.0
    """Seconds in-flight calls get to finish on SIGINT/SIGTERM; claims still held then are left to expire."""
    input_timeout: PositiveSeconds = 300.0
    """Seconds the proxy waits for a host to answer a question (a confirmation, an upstream's elicitation or
    sampling request); then the question counts as cancelled."""
    token: str | None = Field(default=None, min_length=16)
    """The bearer token every HTTP request must carry (``--http``); default ``$AGENTGUARD_PROXY_TOKEN``. With
    ``[proxy.oauth]`` it is optional, and a request may carry either it or an access token."""
    oauth: OAuthConfig | None = None
    """``--http``: accept OAuth 2.1 access tokens from an authorization server (``[proxy.oauth]``)."""


class Config(_Model):
    store: StoreConfig = StoreConfig()
    upstream: UpstreamConfig
    proxy: ProxyConfig = ProxyConfig()
    tools: dict[str, ToolConfig] = Field(default_factory=dict)

    _base_dir: Path = PrivateAttr(default_factory=lambda: Path("."))
    _source: str = PrivateAttr(default="")

    @property
    def base_dir(self) -> Path:
        """The directory of the config file; relative paths are resolved against it."""
        return self._base_dir

    def where(self, *loc: str) -> str:
        """``loc`` as a field name with its line in the config file, as every problem is reported."""
        line = _line_of(self._source, loc) if self._source else None
        return ".".join(loc) + (f" (line {line})" if line else "")

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, v: dict[str, ToolConfig]) -> dict[str, ToolConfig]:
        bad = [n for n in v if not _NAME.match(n)]
        if bad:
            raise ValueError(f"invalid tool names: {', '.join(map(repr, bad))}")
        return v

    # -- resolved values ----------------------------------------------------------------------------

    def store_url(self, environ: Mapping[str, str] | None = None) -> str:
        environ = os.environ if environ is None else environ
        return absolute_sqlite(self.store.url or environ.get(ENV_URL) or DEFAULT_URL, self.base_dir)

    def upstream_cwd(self) -> Path:
        cwd = Path(self.upstream.cwd) if self.upstream.cwd else Path(".")
        return cwd if cwd.is_absolute() else (self.base_dir / cwd).resolve()

    def upstream_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """What the upstream process gets on top of the stdio client's minimal defaults."""
        environ = os.environ if environ is None else environ
        env = {n: environ[n] for n in self.upstream.pass_env if n in environ}
        env.update(self.upstream.env)
        return env

    def upstream_command(self) -> tuple[str, list[str]]:
        assert self.upstream.command is not None
        cmd, *args = self.upstream.command
        # "python" means the interpreter running the proxy: a venv's python is rarely first on a host's PATH.
        if cmd in ("python", "python3"):
            cmd = sys.executable
        return cmd, args


class ConfigError(Exception):
    """The config file is missing, is not TOML, or does not validate; ``problems`` lists every mistake."""

    def __init__(self, path: str, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = list(problems)
        super().__init__(f"{path}: " + "; ".join(self.problems))


def _line_of(text: str, loc: Sequence[str | int]) -> int | None:
    """Best effort: the line of the TOML key (or table) that ``loc`` names."""
    want = [str(p) for p in loc]
    table: list[str] = []
    best: int | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = re.fullmatch(r"\[\s*([^\[\]]+?)\s*\]", line)
        if header:
            table = [p.strip().strip('"\'') for p in header.group(1).split(".")]
            if table == want:
                return no
            if best is None and table and table == want[: len(table)]:
                best = no
            continue
        key = re.match(r"([A-Za-z0-9_\-\"'.]+)\s*=", line)
        if key:
            path = table + [p.strip().strip('"\'') for p in key.group(1).split(".")]
            if path == want[: len(path)] and len(path) <= len(want):
                return no
    return best


def tool_problems(config: Config, tools: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each ``[tools.NAME]`` that does not match the upstream's tools (NAME -> its input schema), with every
    mismatch worded as a config problem: the field, its line, what the upstream offers and the closest name.

    A guarded tool must be offered, and every name in ``key``, ``ignore`` and ``forward_key_to`` must be a
    property of its input schema: a misspelt tool would pass through unguarded, a misspelt key field would
    key every call on ``null``, and a misspelt ``forward_key_to`` would show ``idempotency_key`` to the model.
    The check is agentguard's one check of names (``agentguard._names``), as in the decorator and the adapters.
    """
    wanted = {
        name: {"key": cfg.key, "ignore": cfg.ignore,
               "forward_key_to": [cfg.forward_key_to] if cfg.forward_key_to is not None else []}
        for name, cfg in config.tools.items()
    }
    offered = {name: _names.argument_names(s if isinstance(s, Mapping) else None) for name, s in tools.items()}
    out: dict[str, list[str]] = {}
    for p in _names.tool_problems(wanted, offered, offered_by="the upstream", say_field=False):
        where = config.where("tools", p.tool) if p.field is None else config.where("tools", p.tool, p.field)
        out.setdefault(p.tool, []).append(f"{where}: {p.text}")
    return out


def _format(err: Mapping[str, Any]) -> tuple[Sequence[str | int], str]:
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    msg = str(err["msg"])
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    msg = msg.removeprefix("Value error, ")
    return loc, msg


def parse_config(text: str, *, path: str = "<config>", base_dir: Path | None = None) -> Config:
    """Parse and validate; raises ConfigError listing every problem with its field and line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [f"not valid TOML: {exc}"]) from None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc, msg = _format(err)
            field = ".".join(str(p) for p in loc) or "(top level)"
            line = _line_of(text, loc) if loc else None
            problems.append(f"{field}{f' (line {line})' if line else ''}: {msg}")
        raise ConfigError(path, problems) from None
    config._base_dir = base_dir or Path(".")
    config._source = text
    return config


def load_config(path: str | os.PathLike[str]) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read the config file: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), ["the config file is not UTF-8 text"]) from None
    return parse_config(text, path=str(path), base_dir=p.resolve().parent)
