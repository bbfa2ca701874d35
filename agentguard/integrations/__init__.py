"""Thin adapters between agent frameworks / workflow engines and :class:`agentguard.Guard`.

One module per framework, each importing its framework lazily (importing ``agentguard`` or this package
never imports a framework):

    agentguard.integrations.pydantic_ai     once(...) under @agent.tool / @agent.tool_plain; GuardTools capability
    agentguard.integrations.openai_agents   once(...) under @function_tool; guard_tool(FunctionTool)
    agentguard.integrations.langchain       once(...) under @tool; ToolGuard middleware (create_agent, ToolNode)
    agentguard.integrations.temporal        once(...) under @activity.defn (task id: the workflow id)
    agentguard.integrations.dbos            once(...) under @DBOS.step() (task id: DBOS.workflow_id)
    agentguard.integrations.crewai          once(...) under @tool (task id: with agentguard.task(...) only)
    agentguard.integrations.agno            once(...) under @tool or on a tool function (session_state task_id)
    agentguard.integrations.smolagents      guard_tool(Tool); once(...) inside tool(...) (task: the task context)
    agentguard.integrations.llamaindex      once(...) for FunctionTool.from_defaults (the context store's task_id)
    agentguard.integrations.strands         once(...) under @tool (invocation state, agent state, session id)
    agentguard.integrations.google_adk      once(...) on an ADK tool function (task id: state["task_id"], session id)
    agentguard.integrations.ag2             once(...) under @tool (task id: the context variable task_id); refusals()
    agentguard.integrations.anthropic       once(...) under @beta_tool / @beta_async_tool (task id: task(...))
    agentguard.integrations.claude_agent_sdk once(...) under @tool(...) on an in-process MCP tool's handler

Every adapter resolves the task id by the same rule: an explicit ``task_id=`` callable of the framework's
run context, then ``with agentguard.task(...)``, then the framework's stable id, else it refuses. Refusals
reach the model as a tool-error message in the framework's own convention (see :func:`refusal_message`).
"""

from ._common import ToolSpec, refusal_message

__all__ = ["ToolSpec", "refusal_message"]
