"""Runnable MCP servers that ship with agentguard (the ``mcp`` extra).

    python -m agentguard.servers.payments_demo      # a Stripe-like fake payment provider over stdio
"""
