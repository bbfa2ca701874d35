"""The demo payments server, from a checkout: the server itself ships in the package as
``agentguard.servers.payments_demo`` (``python -m agentguard.servers.payments_demo`` after
``pip install 'agentguard-idempotency[mcp]'``); this file keeps ``python servers/payments_demo.py`` and
``from payments_demo import ...`` (next to ``guarded_payments.py``) working.

    PAYMENTS_DEMO_DB=payments.db python servers/payments_demo.py
"""

from __future__ import annotations

import sys

from agentguard.servers.payments_demo import (
    SCHEMA,
    Charge,
    IdempotencyError,
    Ledger,
    Refund,
    build_server,
    main,
)

__all__ = ["SCHEMA", "Charge", "IdempotencyError", "Ledger", "Refund", "build_server", "main"]

if __name__ == "__main__":
    sys.exit(main())
