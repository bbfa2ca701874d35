"""The one check of every name a user writes: a tool, a key field, an argument left out of the fingerprint,
the argument the downstream key is forwarded to.

A guard that names something that is not there is not in place: a misspelt tool passes through unguarded, a
misspelt key field keys every call on ``null`` (a second refund of another charge refused as a reuse), a
misspelt forwarded argument never reaches the provider. So a name is checked against the names that really
exist — a tool's parameters (its signature) or its JSON schema's ``properties``, the tools an agent, a
toolset or an upstream really has — and refused with the names that exist and the closest one. The
decorator, the MCP proxy's config, native MCP tools and every adapter call these functions; none words its
own.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

Fields = Mapping[str, Sequence[str]]
"""The names a user wrote for one tool, by the option that holds them: ``{"key": [...], "ignore": [...]}``."""


class Problem(NamedTuple):
    """One name that does not exist: the tool it was written for, the option (None: the tool's own name)."""

    tool: str
    field: str | None
    name: str
    text: str


def closest(name: str, names: Iterable[str]) -> str | None:
    """The existing name nearest to ``name`` (difflib's ratio, at least 0.6), else None."""
    match = difflib.get_close_matches(name, sorted(set(names)), n=1)
    return match[0] if match else None


def _did_you_mean(name: str, names: Iterable[str]) -> str:
    match = closest(name, names)
    return f" (did you mean {match!r}?)" if match else ""


def _listing(names: Iterable[str]) -> str:
    return ", ".join(sorted(set(names))) or "none"


def argument_names(source: Callable[..., Any] | inspect.Signature | Mapping[str, Any] | None) -> list[str]:
    """The arguments a tool really takes: a signature's parameters, or a JSON schema's ``properties``."""
    if source is None:
        return []
    if isinstance(source, Mapping):
        props = source.get("properties")
        return sorted(props) if isinstance(props, Mapping) else []
    sig = source if isinstance(source, inspect.Signature) else inspect.signature(source)
    return list(sig.parameters)


def unknown_tool(name: str, tools: Iterable[str], *, offered_by: str) -> str | None:
    """None if ``tools`` has ``name``, else why not: ``{offered_by} offers no tool named ...``."""
    tools = list(tools)
    if name in tools:
        return None
    return f"{offered_by} offers no tool named {name!r}{_did_you_mean(name, tools)}; it offers: {_listing(tools)}"


def unknown_argument(name: str, arguments: Iterable[str], *, tool: str, field: str | None = None) -> str | None:
    """None if ``arguments`` has ``name``, else why not; ``field`` (``key``, ``ignore``, ...) names the option
    that holds it, unless the message's location already does."""
    arguments = list(arguments)
    if name in arguments:
        return None
    given = f"{field}={name!r}" if field else repr(name)
    return (f"{given} is not an argument of {tool}{_did_you_mean(name, arguments)}; "
            f"its arguments are: {_listing(arguments)}")


def argument_problems(tool: str, arguments: Iterable[str], fields: Fields, *, say_field: bool = True) -> list[Problem]:
    """Every name in ``fields`` that ``arguments`` (the tool's real arguments) lacks."""
    arguments = list(arguments)
    out = []
    for field, names in fields.items():
        for name in names:
            text = unknown_argument(name, arguments, tool=tool, field=field if say_field else None)
            if text is not None:
                out.append(Problem(tool, field, name, text))
    return out


def tool_problems(
    wanted: Mapping[str, Fields], offered: Mapping[str, Iterable[str]], *, offered_by: str, say_field: bool = True
) -> list[Problem]:
    """Every guarded tool ``offered`` (tool name -> its arguments) lacks, and every name written for a tool it
    has that the tool does not take; in ``wanted``'s order."""
    out = []
    for tool, fields in wanted.items():
        if tool not in offered:
            text = unknown_tool(tool, offered, offered_by=offered_by)
            assert text is not None
            out.append(Problem(tool, None, tool, text))
        else:
            out.extend(argument_problems(tool, offered[tool], fields, say_field=say_field))
    return out


def refuse(problems: Sequence[Problem], *, where: str | None, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming every problem, after ``where`` (who was given the names), if there is any."""
    if not problems:
        return
    head = f"{where}: " if where else ""
    if len(problems) == 1:
        raise error(head + problems[0].text)
    raise error(f"{head}{len(problems)} names do not exist:\n" + "\n".join(f"  - {p.text}" for p in problems))


def check_arguments(
    tool: str, arguments: Iterable[str], fields: Fields, *, where: str | None = None,
    error: type[Exception] = TypeError,
) -> None:
    """Refuse a name in ``fields`` that is not one of the tool's ``arguments`` (a TypeError: the names were
    given to a function)."""
    refuse(argument_problems(tool, arguments, fields), where=where, error=error)


def check_tools(
    wanted: Mapping[str, Fields], offered: Mapping[str, Iterable[str]], *, where: str, offered_by: str,
    error: type[Exception] = ValueError,
) -> None:
    """Refuse a guarded tool that is not offered, or a name its tool does not take (a ValueError: the names
    are a configuration's values)."""
    refuse(tool_problems(wanted, offered, offered_by=offered_by), where=where, error=error)
