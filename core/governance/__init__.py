"""Governance: the usage ledger (:mod:`.ledger`, in SQLite or PostgreSQL through
:mod:`.database`), prices (:mod:`.prices`), budgets (:mod:`.budgets` over
:mod:`.counters`), API keys managed at run time (:mod:`.keys`), composed per gateway by
:class:`Governance` (``docs/governance.md``)."""

from __future__ import annotations

from shuniu.core.governance.budgets import BudgetHold, Budgets
from shuniu.core.governance.database import MIGRATIONS, Database, KeyRow, SchemaTooNewError
from shuniu.core.governance.engines import open_database
from shuniu.core.governance.governance import Governance
from shuniu.core.governance.keys import KEY_PREFIX, KeyManager, KeyTable, hash_key, new_key
from shuniu.core.governance.ledger import Ledger
from shuniu.core.governance.prices import Prices
from shuniu.core.governance.records import GROUPS, LedgerRecord, UsageQuery, UsageRow

__all__ = [
    "GROUPS",
    "KEY_PREFIX",
    "MIGRATIONS",
    "BudgetHold",
    "Budgets",
    "Database",
    "Governance",
    "KeyManager",
    "KeyRow",
    "KeyTable",
    "Ledger",
    "LedgerRecord",
    "Prices",
    "SchemaTooNewError",
    "UsageQuery",
    "UsageRow",
    "hash_key",
    "new_key",
    "open_database",
]
