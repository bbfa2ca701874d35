"""The upstream's tools as the proxy lists them.

A guarded tool gains a required ``task_id``, loses the argument the proxy fills in with the downstream key,
says it is safe to retry (``idempotentHint: true``; the upstream's other hints, ``destructiveHint`` first,
are kept) and, with ``mark_structured``, declares the replay flag in its output schema.

MCP tasks (2025-11-25 ``execution.taskSupport``) are not relayed: the proxy runs every call as an ordinary
request. A tool that requires a task is not listed (a call to it is refused), one that merely allows one is
listed without ``execution``, so no host asks for a task; a guarded tool that requires one is a config problem.
Reserved ``_meta`` keys of every tool are left out.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from ._config import Config, ToolConfig
from ._meta import TASK_ID_DESCRIPTION, clean_meta

GUARDED_NOTE = "Guarded by agentguard: safe to retry with the same task_id; a repeat returns the first result."


def needs_task(tool: types.Tool | None) -> bool:
    """Whether the upstream says the tool can only be called as an MCP task."""
    return tool is not None and tool.execution is not None and tool.execution.task_support == "required"


def task_problems(config: Config, tools: list[types.Tool]) -> dict[str, list[str]]:
    """Guarded tools the upstream offers only as MCP tasks, which the proxy does not relay."""
    return {
        t.name: [f"{config.where('tools', t.name)}: the upstream offers {t.name} only as an MCP task "
                 "(execution.taskSupport = \"required\"), which the proxy does not relay, so it cannot be guarded"]
        for t in tools if t.name in config.tools and needs_task(t)
    }


def listed(tools: list[types.Tool], config: Config, problems: dict[str, list[str]]) -> list[types.Tool]:
    """The tools the proxy lists: those it can serve, each as :func:`relay_tool` shows it."""
    return [relay_tool(t, config.tools.get(t.name)) for t in tools if t.name not in problems and not needs_task(t)]


def relay_tool(tool: types.Tool, cfg: ToolConfig | None) -> types.Tool:
    """One upstream tool as the host sees it (guarded if ``cfg`` is given)."""
    update: dict[str, Any] = {"execution": None, "meta": clean_meta(tool.meta) or None}
    if cfg is None:
        return tool.model_copy(update=update)
    schema = json.loads(json.dumps(tool.input_schema))
    props: dict[str, Any] = schema.setdefault("properties", {})
    required: list[str] = [r for r in schema.get("required", []) if r != cfg.forward_key_to]
    if cfg.forward_key_to:
        props.pop(cfg.forward_key_to, None)  # the proxy fills it in: the model never chooses the key
    props["task_id"] = {"type": "string", "minLength": 1, "description": TASK_ID_DESCRIPTION}
    if "task_id" not in required:
        required.append("task_id")
    schema["required"] = required
    hints = tool.annotations or types.ToolAnnotations()
    update.update(
        input_schema=schema,
        description=((tool.description or "").rstrip() + "\n\n" if tool.description else "") + GUARDED_NOTE,
        annotations=hints.model_copy(update={"idempotent_hint": True}),
    )
    if cfg.mark_structured and tool.output_schema is not None:
        out = json.loads(json.dumps(tool.output_schema))
        out.setdefault("properties", {})[cfg.mark_structured] = {
            "type": "boolean", "description": "true when this result is a replay of an earlier call",
        }
        update["output_schema"] = out
    return tool.model_copy(update=update)
