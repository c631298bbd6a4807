"""The ``governance:`` section: the usage ledger, prices, budgets and keys managed at run
time (``docs/governance.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from shuniu.core.config.base import Strict as _Strict
from shuniu.core.redis_client import check_redis_url

__all__ = [
    "BudgetConfig",
    "BudgetsConfig",
    "GovernanceConfig",
    "LedgerConfig",
    "ManagedKeysConfig",
    "PriceConfig",
    "check_database_url",
]

Period = Literal["day", "month", "total"]
"""How long a budget lasts: a UTC calendar day, a UTC calendar month, or for ever."""


def check_database_url(url: str) -> str:
    """``url`` unchanged when it names a database shuniu can use, else ``ValueError``."""
    if url.startswith("sqlite:///"):
        if len(url) == len("sqlite:///"):
            raise ValueError("sqlite:/// needs a file path, e.g. sqlite:///shuniu-ledger.db")
        return url
    if url.startswith(("postgresql://", "postgres://")):
        return url
    raise ValueError(
        "must be sqlite:///PATH (a file; sqlite:////abs/path for an absolute one) or "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
    )


class LedgerConfig(_Strict):
    """Where every request's usage is recorded: one row per finished or refused request,
    written in batches off the request path."""

    url: str = "sqlite:///shuniu-ledger.db"
    """The database: ``sqlite:///PATH`` (a file, relative to the deployment file's folder;
    WAL mode, so reports read while the gateway writes) or
    ``postgresql://USER:PASSWORD@HOST:PORT/DB`` for a fleet (``pip install 'shuniu[postgres]'``).
    The schema is created and migrated at start-up."""
    batch_size: int = Field(500, ge=1, le=100_000)
    """Records written per transaction at most."""
    flush_interval_s: float = Field(1.0, gt=0, le=60)
    """Longest a record waits in memory before it is written (and before ``/v1/usage``
    sees it from another gateway)."""
    buffer_size: int = Field(100_000, ge=100)
    """Records held in memory while the database is slow or down; beyond this the newest
    are dropped, counted in ``shuniu_ledger_dropped_total`` and logged once."""
    timeout_s: float = Field(10.0, gt=0)
    """Longest one write or query may take; a slower one counts as the database being down
    (the records stay buffered and are retried)."""
    retry_interval_s: float = Field(2.0, gt=0)
    """How often writing is retried while the database is down."""
    retention_days: int | None = Field(400, ge=1)
    """Records older than this are deleted (checked hourly); ``None``: kept for ever."""
    record_refused: bool = True
    """Record refused requests too (bad input, authentication, rate limits, budgets), each
    with its status and error code."""

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_database_url(url)


class PriceConfig(_Strict):
    """What one model's tokens cost, per million, in ``governance.currency``."""

    prompt: float = Field(0.0, ge=0)
    """Per million prompt tokens the engine had to compute."""
    cached: float | None = Field(None, ge=0)
    """Per million prompt tokens served from the engine's prefix cache (``None``: as
    ``prompt``)."""
    completion: float = Field(0.0, ge=0)
    """Per million generated tokens."""


class BudgetConfig(_Strict):
    """One budget: how much a key, tenant or project may use in a period, in tokens
    (prompt plus completion) or in money (``governance.currency``, from ``prices``)."""

    period: Period = "day"
    """``day`` and ``month`` reset at 00:00 UTC (of the next day, of the 1st); ``total``
    never resets."""
    tokens: int | None = Field(None, ge=1)
    """Tokens allowed in the period."""
    cost: float | None = Field(None, gt=0)
    """Money allowed in the period."""
    soft: float = Field(0.8, gt=0, le=1)
    """Share of the budget at which the caller is warned (the ``x-shuniu-budget-warning``
    header, ``shuniu_budget_warnings_total``, one log line per scope and period); the hard
    limit refuses with 429 ``budget_exceeded``."""

    @model_validator(mode="after")
    def _one_unit(self) -> BudgetConfig:
        if (self.tokens is None) == (self.cost is None):
            raise ValueError("set exactly one of `tokens` and `cost`")
        return self


class BudgetsConfig(_Strict):
    """The budgets of one tenant or project."""

    budgets: list[BudgetConfig] = Field(default_factory=list)
    """Every budget must hold for a request to be admitted."""


class ManagedKeysConfig(_Strict):
    """API keys created, rotated and revoked at run time through the admin API, stored
    hashed in the ledger's database."""

    enabled: bool | None = None
    """``None``: on when the deployment has authenticators (keys of the file keep working
    next to them); ``true`` turns authentication on even without any; ``false``: off."""
    refresh_s: float = Field(2.0, gt=0, le=300)
    """How often each gateway reads the key table: a key created, revoked or rotated on one
    gateway takes effect on the others within this."""
    max_keys: int = Field(1_000_000, ge=1)
    """Keys held in memory at most (each costs a few hundred bytes)."""


class GovernanceConfig(_Strict):
    """Usage recording, prices and budgets, and keys managed at run time."""

    ledger: LedgerConfig | None = Field(default_factory=LedgerConfig)
    """The usage ledger (``null``: no ledger; budgets then count only in Redis or memory,
    and keys cannot be managed at run time)."""
    currency: str = Field("USD", min_length=1, max_length=8)
    """The currency of ``prices`` and of money budgets."""
    prices: dict[str, PriceConfig] = Field(default_factory=dict)
    """Model name → price per million tokens; a model not listed costs nothing."""
    tenants: dict[str, BudgetsConfig] = Field(default_factory=dict)
    """Tenant name → its budgets (all its keys together)."""
    projects: dict[str, BudgetsConfig] = Field(default_factory=dict)
    """Project name → its budgets (every key whose ``project`` names it)."""
    redis_url: str | None = None
    """Budget counters shared by every gateway through this Redis (one server, Sentinel or
    Cluster URL, as ``rate_limits``); ``None``: counted in this process, and brought up to
    what the ledger holds every ``reconcile_s`` (so gateways sharing a ledger converge)."""
    reconcile_s: float = Field(30.0, gt=0)
    """How often budget counters are brought up to the ledger's sums (never down: a request
    in flight holds a reservation the ledger has not seen yet)."""
    settle_interval_s: float = Field(0.2, gt=0, le=10)
    """With ``redis_url``: how often settlements (real usage minus reservation) are sent to
    Redis, all at once, so finishing requests cost no round trip each."""
    keys: ManagedKeysConfig = Field(default_factory=ManagedKeysConfig)
    """Keys managed at run time (``/admin/keys``, ``shuniu keys create``)."""

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, url: str | None) -> str | None:
        return check_redis_url(url) if url is not None else None

    @model_validator(mode="after")
    def _keys_need_a_database(self) -> GovernanceConfig:
        if self.keys.enabled and self.ledger is None:
            raise ValueError("keys.enabled needs a ledger (the keys are stored in its database)")
        return self

    def has_budgets(self) -> bool:
        """Whether a tenant or project of this section has a budget (keys' own budgets are
        the authenticators')."""
        return any(t.budgets for t in self.tenants.values()) or any(p.budgets for p in self.projects.values())
