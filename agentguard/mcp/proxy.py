"""The guarding MCP proxy: ``agentguard mcp-proxy --config agentguard.toml [--http [HOST:]PORT]``.

It sits between a host (Claude Code, Codex, any MCP client) and an upstream MCP server. ``tools/list`` is
relayed; each tool the config names gains a required ``task_id`` argument. A guarded call is claimed in the
store under ``(scope, task, tool + key fields)`` and forwarded upstream at most once, with the downstream key
in ``_meta["dev.agentguard/idempotency_key"]`` (and in ``forward_key_to``); its result is stored and replayed
to every later call, labelled as a replay. Every other tool passes through untouched.

This module is the proxy's front door; the code lives in one module per concept:

    _config.py      the TOML config, and the check of each guarded tool against the upstream's tools
    _transports.py  how the upstream is reached: stdio, Streamable HTTP, in process; the watched end of file
    _upstream.py    the upstream connection: reconnection, its tools, its notifications and subscriptions,
                    what a failure means for a call
    _startup.py     checked first, served second: store and upstream opened and checked before serving
    _server.py      GuardingProxy: the server, tools/list and tools/call
    _guarded_call.py  one guarded call through Guard.run
    _tasks.py       an upstream's answer with a task (2026-07-28): followed to its end, its handle recorded
    _confirm.py     the user's confirmation before a guarded call first runs (confirm = true)
    _exchange.py    a host's request answered by calling upstream, and the questions asked on the way
    _relay.py       everything but tools, passed through: resources, prompts, completions, logging
    _hub.py         the hosts: change notifications, subscriptions, log levels, requests that name no call
    _tools.py       the upstream's tools as the proxy lists them (task_id, idempotentHint, tasks)
    _results.py     payloads stored, results sent, replay marking, the proxy's own refusal texts
    _meta.py        the wire: _meta keys (reserved ones stripped), the task id rule, audit ids
    _http.py        --http: Streamable HTTP for many hosts, behind a bearer token
    _command.py     the command: logging, stdin, signals, serving over stdio or HTTP, exit codes

Logs go to stderr only: stdout is the protocol.
"""

from __future__ import annotations

from ._command import main
from ._guarded_call import _FinalError as _FinalError  # stored records name it agentguard.mcp.proxy:_FinalError
from ._guarded_call import _HeldUnknown as _HeldUnknown  # (and this one likewise)
from ._server import GuardingProxy
from ._startup import StartupError
from ._transports import UpstreamTarget
from ._upstream import Upstream

__all__ = ["GuardingProxy", "StartupError", "Upstream", "UpstreamTarget", "main"]
