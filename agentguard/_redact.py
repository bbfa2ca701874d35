"""Store URLs without their secrets, for every error, log line and CLI message.

``postgresql+asyncpg://u:secret@host/db`` is shown as ``postgresql+asyncpg://u:***@host/db``; a query
parameter that carries a secret (``?password=...``) is masked too. Text that is not a URL SQLAlchemy can
parse still has every ``//user:password@`` part masked.
"""

from __future__ import annotations

import re

# Up to the last "@" of the authority: a password may carry a raw "@" that SQLAlchemy reads as the host's.
_CREDENTIALS = re.compile(r"//(?P<user>[^:/?#@\s]*):[^\s]*@(?=[^@\s]*$|[^@\s]*[\s/?#])")
_USERINFO = re.compile(r":[^:@/\s]*@")
_SECRET_PARAM = re.compile(r"(?P<name>[?&][^=&#\s]*(?:password|passwd|secret|token|sslkey)[^=&#\s]*=)[^&#\s]*",
                           re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its password, and any query parameter named like a secret, replaced by ``***``."""
    from sqlalchemy.engine import make_url

    try:
        rendered: str = make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: whatever sits between a ":" and an "@" may be a password
        rendered = _USERINFO.sub(":***@", url)
    return redact_text(rendered)


def redact_text(text: str) -> str:
    """``text`` (an error message, a log line) with every URL's password and secret parameters masked."""
    return _SECRET_PARAM.sub(r"\g<name>***", _CREDENTIALS.sub(r"//\g<user>:***@", text))
