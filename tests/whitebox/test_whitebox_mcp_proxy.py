"""The guarding proxy's records, from inside: the names its cached upstream errors are stored under (the proxy
with the real ``mcp`` Client: ``tests/mcp_server/test_mcp_proxy.py``)."""

from __future__ import annotations

import json

import pytest

from agentguard import _codec
from agentguard.mcp import proxy

pytestmark = pytest.mark.storeless  # the records' names, not the store's SQL: runs once


def test_cached_upstream_errors_keep_the_names_records_store() -> None:
    """A record of a cached upstream error names its class. Records written before the proxy was split into
    modules, or by an older proxy sharing the store, name ``agentguard.mcp.proxy``: they still replay, and
    new records name the same, so that an older proxy replays them too."""
    cached = (proxy._FinalError, proxy._HeldUnknown)
    for cls in cached:
        stored = json.dumps({"type": f"agentguard.mcp.proxy:{cls.__name__}", "message": "m", "args": ["m"]})
        replayed = _codec.decode_error(stored, cached)
        assert type(replayed) is cls and replayed.args == ("m",)
        assert json.loads(_codec.encode_error(cls("m")))["type"] == f"agentguard.mcp.proxy:{cls.__name__}"
