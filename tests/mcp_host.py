"""A host as a process of its own: it starts ``agentguard mcp-proxy --config CONFIG`` over stdio with the real
``mcp`` Client, as Claude Code or Codex does, makes one call and prints its result as JSON on stdout. The
proxy's stderr is this process's. A test kills a host mid-call (its proxy meets the end of its input) and
starts another.

    python tests/mcp_host.py CONFIG MODE TOOL ARGUMENTS_JSON
"""

from __future__ import annotations

import json
import os
import sys

import anyio
from mcp import Client, StdioServerParameters


async def main(config: str, mode: str, tool: str, arguments: str) -> None:
    env = {k: os.environ[k] for k in ("PYTHONPATH", "AGENTGUARD_LOG") if k in os.environ}
    params = StdioServerParameters(command=sys.executable, args=["-m", "agentguard.cli", "mcp-proxy", "--config",
                                                                 config], env=env)
    async with Client(params, mode=mode) as client:
        result = await client.call_tool(tool, json.loads(arguments))
    print(result.model_dump_json(by_alias=True, exclude_none=True), flush=True)


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
