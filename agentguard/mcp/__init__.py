"""agentguard for MCP (the ``mcp`` extra): a guarding proxy and guarded native ``MCPServer`` tools.

    agentguard mcp-proxy --config agentguard.toml        # guard the tools of any upstream MCP server

    @guarded_tool(server, guard, key=["order_id"])        # or guard the tools of your own MCPServer
    async def create_charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> Charge: ...
"""

from .._extras import require

require("mcp", "mcp_types", extra="mcp", by=__name__)

from ._config import Config, ConfigError, load_config, parse_config
from ._meta import META_KEY, META_REPLAYED, META_TASK_ID
from .native import guarded_tool
from .proxy import GuardingProxy, StartupError

__all__ = [
    "META_KEY",
    "META_REPLAYED",
    "META_TASK_ID",
    "Config",
    "ConfigError",
    "GuardingProxy",
    "StartupError",
    "guarded_tool",
    "load_config",
    "parse_config",
]
