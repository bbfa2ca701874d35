"""``agentguard console``: a local web page to see tasks, their timelines and held outcomes, and to settle them.

Served by Starlette and uvicorn (the ``console`` extra; the ``mcp`` extra brings them too), rendered on the
server as plain HTML and SVG: no script, no build step. Bound to 127.0.0.1 unless told otherwise; actions
need the token printed with the URL at start (``_auth``). Settling is exactly ``Guard.resolve``, what
``agentguard resolve`` does.

- ``_command``   the command: the store, the token, the listening socket, uvicorn
- ``_app``       the pages and the action (Starlette)
- ``_auth``      the token, its cookie, the checks an action passes
- ``_pages``     the HTML
- ``_timeline``  a task's timeline as SVG
"""

from __future__ import annotations

from .._extras import require

require("starlette", "uvicorn", extra="console", by="agentguard.console")

from ._command import serve  # noqa: E402

__all__ = ["serve"]
