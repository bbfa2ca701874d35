"""The upstream's tools as the proxy lists them.

A guarded tool gains a required ``task_id``, loses the argument the proxy fills in with the downstream key,
says it is safe to retry (``idempotentHint: true``; the upstream's other hints, ``destructiveHint`` first,
are kept) and, with ``mark_structured``, declares the replay flag in its output schema. Where the proxy fills
in the key, the sentences of the upstream's description that ask for one are left out: the model cannot
choose the key, and must not be told to make it new on a retry (:func:`key_warnings` says so at startup).

MCP tasks are never handed to a host: the proxy answers every call with its result. A 2026-07-28 upstream may
answer with a task, which the proxy follows to its end itself (``_tasks.py``). A 2025-11-25 task must be asked
for, and the proxy does not: a tool that requires one (``execution.taskSupport``) is not listed (a call to it is
refused), one that merely allows one is listed without ``execution``, so no host asks for a task; a guarded
tool that requires one is a config problem. Reserved ``_meta`` keys of every tool are left out.
"""

from __future__ import annotations

import json
import re
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


def _key_mention(param: str | None) -> re.Pattern[str]:
    """A sentence about the idempotency key: ``idempotency key`` however it is spelt, or the forwarded
    parameter's own name (``idempotency_key``, ``idempotency key``, ``Idempotency-Key``)."""
    names = [r"idempotency[\s_\-]*keys?"]
    if param:
        names.append(r"[\s_\-]*".join(re.escape(w) for w in re.split(r"[\s_\-]+", param) if w))
    return re.compile(rf"(?<![A-Za-z0-9_])(?:{'|'.join(names)})(?![A-Za-z0-9_])", re.IGNORECASE)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
# "unique for every request", "a new key for each call", "a fresh key per attempt": a key made anew per request.
_PER_REQUEST = re.compile(r"\b(?:unique|new|fresh|different|random)\b.*\b(?:every|each|per|any)\b",
                          re.IGNORECASE | re.DOTALL)


def _paragraphs(text: str) -> list[list[str]]:
    """``text`` as paragraphs of items: a list item each, or the lines of prose that a docstring wrapped."""
    out: list[list[str]] = []
    for paragraph in re.split(r"\n\s*\n", text):
        items: list[str] = []
        for line in paragraph.splitlines():
            if items and not _LIST_ITEM.match(line):
                items[-1] += "\n" + line
            else:
                items.append(line)
        out.append(items)
    return out


def without_key_sentences(description: str, param: str) -> str:
    """``description`` without its sentences about the idempotency key (the proxy supplies it, the same on
    every retry: a model told to pass a unique one would be told wrong). Paragraphs and list items are kept."""
    mention = _key_mention(param)
    paragraphs: list[str] = []
    for items in _paragraphs(description):
        kept_items: list[str] = []
        for item in items:
            sentences = _SENTENCE_END.split(item)
            kept = [s for s in sentences if not mention.search(s)]
            if kept == sentences:
                kept_items.append(item)
            elif "".join(kept).strip():
                kept_items.append(" ".join(kept))
        if kept_items:
            paragraphs.append("\n".join(kept_items))
    return "\n\n".join(paragraphs).strip()


def asks_unique_key(tool: types.Tool, param: str | None) -> bool:
    """Whether the upstream describes the tool's idempotency key as unique for every request (its description
    or that of one of its arguments)."""
    mention = _key_mention(param)
    texts = [tool.description or ""]
    for prop in (tool.input_schema.get("properties") or {}).values():
        if isinstance(prop, dict) and isinstance(prop.get("description"), str):
            texts.append(prop["description"])
    return any(mention.search(s) and _PER_REQUEST.search(s)
               for text in texts for items in _paragraphs(text) for item in items for s in _SENTENCE_END.split(item))


def key_warnings(config: Config, tools: list[types.Tool]) -> list[str]:
    """A warning for each guarded tool whose upstream asks for an idempotency key unique for every request:
    agentguard sends one key per operation, the same on every retry (that is how a provider deduplicates a
    retry), and a model that made a new key per request would make each retry another operation."""
    out = []
    for tool in tools:
        cfg = config.tools.get(tool.name)
        if cfg is None or not asks_unique_key(tool, cfg.forward_key_to):
            continue
        if cfg.forward_key_to:
            out.append(f"{tool.name}: the upstream's description asks for an idempotency key unique for every "
                       f"request, but agentguard sends `{cfg.forward_key_to}` once per operation, the same on every "
                       "retry (that is how the provider deduplicates a retry): check that the provider answers a "
                       "repeated key with the first result rather than refusing it. The model is not shown that "
                       "sentence.")
        else:
            out.append(f"{tool.name}: the upstream's description asks for an idempotency key unique for every "
                       "request, and the model fills it in: a retry with a new key is another call to the "
                       f"provider. Set `forward_key_to` under [tools.{tool.name}] so that agentguard supplies it, "
                       "the same on every retry.")
    return out


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
    description = tool.description or ""
    if cfg.forward_key_to:
        description = without_key_sentences(description, cfg.forward_key_to)
    update.update(
        input_schema=schema,
        description=(description.rstrip() + "\n\n" if description.strip() else "") + GUARDED_NOTE,
        annotations=hints.model_copy(update={"idempotent_hint": True}),
    )
    if cfg.mark_structured and tool.output_schema is not None:
        out = json.loads(json.dumps(tool.output_schema))
        out.setdefault("properties", {})[cfg.mark_structured] = {
            "type": "boolean", "description": "true when this result is a replay of an earlier call",
        }
        update["output_schema"] = out
    return tool.model_copy(update=update)
