"""The guarding MCP proxy: ``agentguard mcp-proxy --config agentguard.toml``.

It sits between a host (Claude Code, Codex, any MCP client) and an upstream MCP server. ``tools/list`` is
relayed; each tool the config names gains a required ``task_id`` argument. A guarded call is claimed in the
store under ``(scope, task, tool + key fields)`` and forwarded upstream at most once, with the downstream key
in ``_meta["dev.agentguard/idempotency_key"]`` (and in ``forward_key_to``); its result is stored and replayed
to every later call, labelled as a replay. Every other tool passes through untouched.

This module is the proxy's front door; the code lives in one module per concept:

    _config.py     the TOML config, and the check of each guarded tool against the upstream's tools
    _upstream.py   the upstream connection: transports, reconnection, the watched end of file
    _startup.py    checked first, served second: store and upstream opened and checked before serving
    _guarding.py   GuardingProxy: tools/list and tools/call, the guarded call through Guard.run
    _results.py    payloads stored, results sent, replay marking, the proxy's own refusal texts
    _meta.py       the wire: _meta keys, the task id rule, audit ids, the replay note
    _command.py    the command: logging, stdin, signals, serving over stdio, exit codes

Logs go to stderr only: stdout is the protocol.
"""

from __future__ import annotations

from ._command import main
from ._guarded import _FinalError as _FinalError  # stored records name it agentguard.mcp.proxy:_FinalError
from ._guarded import _HeldUnknown as _HeldUnknown  # (and this one likewise)
from ._guarding import GuardingProxy
from ._startup import StartupError
from ._transports import UpstreamTarget
from ._upstream import Upstream

__all__ = ["GuardingProxy", "StartupError", "Upstream", "UpstreamTarget", "main"]
