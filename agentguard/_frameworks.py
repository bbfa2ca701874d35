"""What the agent frameworks' tool decorators return in place of a function, told apart by name so that no
framework is imported to tell: a guard placed on top of one says which way round the decorators go."""

from __future__ import annotations

from typing import Any

# What a framework's tool decorator returns in place of the function: (package, class in the MRO) → the
# decorator and its framework. Matched by name, so no framework is imported to tell.
_TOOL_OBJECTS: dict[tuple[str, str], tuple[str, str]] = {
    ("agents", "FunctionTool"): ("@function_tool", "the OpenAI Agents SDK"),
    ("langchain_core", "BaseTool"): ("@tool", "LangChain"),
    ("anthropic", "BetaAsyncFunctionTool"): ("@beta_async_tool", "the Anthropic SDK"),
    ("anthropic", "BaseFunctionTool"): ("@beta_tool", "the Anthropic SDK"),
    ("pydantic_ai", "Tool"): ("Tool(...)", "pydantic-ai"),
    ("smolagents", "Tool"): ("@tool", "smolagents"),
    ("agno", "Function"): ("@tool", "agno"),
    ("strands", "AgentTool"): ("@tool", "the Strands Agents SDK"),
    ("crewai", "BaseTool"): ("@tool", "CrewAI"),
    ("llama_index", "BaseTool"): ("FunctionTool.from_defaults(...)", "LlamaIndex"),
    ("google", "BaseTool"): ("FunctionTool(...)", "Google ADK"),  # google.adk.tools: ADK has no decorator
    ("ag2", "Tool"): ("@tool", "AG2"),
    ("claude_agent_sdk", "SdkMcpTool"): ("@tool", "the Claude Agent SDK"),
}


def made_by(obj: Any) -> tuple[str, str] | None:
    """``(decorator, framework)`` that made ``obj`` a tool object (``("@function_tool", ...)``), else None."""
    for cls in type(obj).__mro__:
        found = _TOOL_OBJECTS.get((cls.__module__.partition(".")[0], cls.__name__))
        if found is not None:
            return found
    return None
