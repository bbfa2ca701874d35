"""DBOS: a durable workflow whose guarded step is called twice; the task id is the DBOS workflow id.

Needs the dbos extra:  pip install 'agentguard-idempotency[dbos]'
Offline (SQLite system database in a temporary directory):  python examples/dbos_workflow.py
Kill it mid-step and start it again and DBOS recovers the workflow; the guard makes the re-run step replay
(or take over with the same downstream key), so the provider charges once — see
tests/integrations/test_integration_dbos.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from agentguard import Guard
from agentguard.integrations.dbos import once

tmp = Path(tempfile.mkdtemp(prefix="agentguard-dbos-"))
guard = Guard(f"sqlite+aiosqlite:///{tmp / 'agentguard.db'}")
ledger: list[str] = []
DBOS(config={"name": "agentguard-example", "system_database_url": f"sqlite:///{tmp / 'dbos.sqlite'}",
             "log_level": "WARNING"})  # DBOS logs every start-up step at INFO: this example prints its story


@DBOS.step()                     # DBOS on top, agentguard underneath
@once(guard, key="order_id")
def charge(order_id: str, amount_cents: int, idempotency_key: str = "") -> dict[str, Any]:
    ledger.append(idempotency_key)  # a real step sends idempotency_key to the provider
    return {"charge_id": f"ch_{len(ledger)}", "amount_cents": amount_cents}


@DBOS.workflow()
def checkout(order_id: str, amount_cents: int) -> list[dict[str, Any]]:
    return [charge(order_id, amount_cents), charge(order_id, amount_cents)]  # the second is replayed


def main() -> None:
    DBOS.launch()
    with SetWorkflowID("order-o-1"):
        print(checkout("o-1", 4900))
    DBOS.destroy()
    guard.close()
    print(f"charges made: {len(ledger)}")
    assert len(ledger) == 1


if __name__ == "__main__":
    main()
