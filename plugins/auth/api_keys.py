"""``api_keys``: static API keys, stored only as SHA-256 hashes.

A key is a high-entropy random string (``shuniu keys new`` makes one); the deployment holds
its hash with the tenant, tier, models and limits it grants. Keys can come from the file
itself, a separate YAML/JSON file (``keys_file``) or an environment variable
(``keys_env``), so the deployment file can be committed without any secret in it.

Lookup hashes the presented key and finds the entry by that digest. The digest of a
256-bit random key reveals nothing an attacker can steer, so the dictionary lookup leaks
nothing useful through timing; the stored and computed digests are still compared with
:func:`hmac.compare_digest`.

A key that passed is remembered by its text for the process's life (at most one entry per
configured key; a credential that fails is never remembered), so its next requests skip the
SHA-256, which costs more than the rest of authentication together. That look-up compares the
presented text with a remembered key only when their keyed 64-bit string hashes (Python's
per-process random hash seed) are equal, which an attacker cannot steer towards a key they do
not know; the price is that the keys in use stay in the process's memory as text, as they do
anyway while a request is read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import click
import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from shuniu.core import hookimpl
from shuniu.core.config import BudgetConfig, LimitsConfig, Options
from shuniu.core.contracts import Authenticator, AuthenticatorOptions, RegisterAuthenticator
from shuniu.core.governance import KEY_PREFIX, hash_key, new_key
from shuniu.core.types import Budget, Limits, Principal

__all__ = ["KEY_PREFIX", "ApiKey", "ApiKeys", "ApiKeysOptions", "hash_key", "new_key"]

_HEX = frozenset("0123456789abcdef")


class ApiKey(Options):
    """One API key, by its hash."""

    id: str = Field(min_length=1, max_length=128)
    """A name for the key, shown in logs and metrics instead of the key (e.g. ``team-a-ci``)."""
    hash: str
    """``sha256:<64 hex digits>`` of the key (``shuniu keys new`` prints it)."""
    tenant: str = Field(min_length=1, max_length=128)
    """The tenant the key belongs to: rate limits, fair shares and the cache are per tenant."""
    tier: str = "default"
    """The key's tier (``tiers:`` in the deployment)."""
    models: list[str] | None = None
    """Models (names or aliases) this key may use, within its tier's; ``None``: the tier's."""
    limits: LimitsConfig | None = None
    """This key's own limits, overriding its tier's ``key_limits`` field by field."""
    project: str | None = Field(None, min_length=1, max_length=128)
    """A grouping of keys (a team, an application) that ``governance.projects`` budgets
    and usage reports can name."""
    budgets: list[BudgetConfig] = Field(default_factory=list)
    """This key's own budgets (tokens or money per day, month or in total); needs
    ``governance:`` in the deployment."""

    @field_validator("hash")
    @classmethod
    def _hash(cls, value: str) -> str:
        digest = value.removeprefix("sha256:").lower()
        if len(digest) != 64 or not set(digest) <= _HEX:
            raise ValueError(
                "must be 'sha256:' followed by 64 hex digits (the hash of the key, not the key; "
                "`shuniu keys new` prints both)"
            )
        return "sha256:" + digest


class ApiKeysOptions(AuthenticatorOptions):
    """Options of the ``api_keys`` authenticator."""

    keys: list[ApiKey] = Field(default_factory=list)
    """Keys listed in the deployment file."""
    keys_file: str | None = None
    """A YAML or JSON file holding a list of keys (same fields), read at start-up."""
    keys_env: str | None = None
    """An environment variable holding a YAML or JSON list of keys, read at start-up (for
    secret stores that inject variables)."""

    @model_validator(mode="after")
    def _load(self) -> ApiKeysOptions:
        extra: list[ApiKey] = []
        if self.keys_file is not None:
            try:
                text = Path(self.keys_file).read_text("utf-8")
            except OSError as exc:
                raise ValueError(f"keys_file {self.keys_file!r}: cannot read it ({exc.strerror})") from None
            extra += _parse_keys(text, f"keys_file {self.keys_file!r}")
        if self.keys_env is not None:
            text = os.environ.get(self.keys_env)
            if text is None:
                raise ValueError(f"keys_env: the environment variable {self.keys_env} is not set")
            extra += _parse_keys(text, f"keys_env {self.keys_env}")
        if extra:
            object.__setattr__(self, "keys", [*self.keys, *extra])
        ids: set[str] = set()
        hashes: set[str] = set()
        for key in self.keys:
            if key.id in ids:
                raise ValueError(f"key id {key.id!r} is used twice")
            if key.hash in hashes:
                raise ValueError(f"key {key.id!r} has the same hash as another key")
            ids.add(key.id)
            hashes.add(key.hash)
        if not self.keys:
            raise ValueError("no keys: give `keys`, `keys_file` or `keys_env`")
        return self

    def referenced_tiers(self) -> dict[str, str]:
        """Tier name → where it is used, for the deployment's cross-checks."""
        return {key.tier: f"key {key.id!r}" for key in self.keys}

    def referenced_models(self) -> dict[str, str]:
        return {m: f"key {key.id!r}" for key in self.keys for m in key.models or ()}

    def key_ids(self) -> set[str]:
        return {key.id for key in self.keys}

    def sets_budgets(self) -> bool:
        return any(key.budgets for key in self.keys)

    def sets_limits(self) -> bool:
        """Whether some key carries limits of its own (then a rate-limit store is needed)."""
        return any(
            key.limits is not None and any(v is not None for v in key.limits.model_dump().values())
            for key in self.keys
        )


def _parse_keys(text: str, where: str) -> list[ApiKey]:
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError:
        raise ValueError(f"{where}: not valid YAML or JSON") from None
    if isinstance(data, dict) and "keys" in data:
        data = data["keys"]
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a list of keys")
    out = []
    for i, item in enumerate(data):
        try:
            out.append(ApiKey.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where}: entry {i}: {field}: {first['msg']}") from None
    return out


def _limits(cfg: LimitsConfig | None) -> Limits | None:
    if cfg is None:
        return None
    return Limits(cfg.rpm, cfg.rpd, cfg.tpm, cfg.tpd, cfg.concurrency)


class ApiKeys(Authenticator):
    """Finds a key's principal by the SHA-256 of the presented key."""

    __slots__ = ("_by_digest", "_verified")
    stable = True  # the keys come from the deployment: none expires or is revoked while it runs

    def __init__(self, options: ApiKeysOptions) -> None:
        # One frozen principal per key, built once: authenticating allocates nothing but the
        # digest.
        self._by_digest: dict[bytes, tuple[bytes, Principal]] = {}
        for key in options.keys:
            digest = bytes.fromhex(key.hash.removeprefix("sha256:"))
            principal = Principal(
                tenant=key.tenant,
                key_id=key.id,
                tier=key.tier,
                models=frozenset(key.models) if key.models is not None else None,
                limits=_limits(key.limits),
                project=key.project,
                budgets=tuple(
                    Budget(period=b.period, tokens=b.tokens, cost=b.cost, soft=b.soft) for b in key.budgets
                ),
            )
            self._by_digest[digest] = (digest, principal)
        self._verified: dict[str, Principal] = {}
        """Keys that passed, by their text (see the module): at most one entry per key."""

    def authenticate(self, credential: str, headers: Any) -> Principal | None:
        principal = self._verified.get(credential)
        if principal is not None:
            return principal
        digest = hashlib.sha256(credential.encode("utf-8", "surrogateescape")).digest()
        entry = self._by_digest.get(digest)
        if entry is None or not hmac.compare_digest(entry[0], digest):
            return None  # not one of ours (never remembered): a later authenticator may know it
        # Bounded by the keys: only a configured key's text gets here (SHA-256 has no known
        # collisions, and utf-8 with surrogateescape encodes distinct texts differently).
        self._verified[credential] = entry[1]
        return entry[1]


@hookimpl
def register_authenticators(register: RegisterAuthenticator) -> None:
    register(
        "api_keys",
        ApiKeys,
        options=ApiKeysOptions,
        description="Static API keys, stored as SHA-256 hashes, each granting a tenant and tier.",
    )


@hookimpl
def register_commands(cli: click.Group) -> None:
    @cli.group("keys")
    def keys() -> None:
        """Make and hash API keys for the ``api_keys`` authenticator."""

    @keys.command("new")
    @click.option("--id", "key_id", default=None, help="Name of the key (default: a random one).")
    @click.option("--tenant", required=True, help="Tenant the key belongs to.")
    @click.option("--tier", default="default", show_default=True, help="Tier the key grants.")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
    def new(key_id: str | None, tenant: str, tier: str, as_json: bool) -> None:
        """Print a fresh key ONCE, with the entry to paste into the deployment."""
        key = new_key()
        entry = {
            "id": key_id or f"key-{secrets.token_hex(4)}",
            "hash": hash_key(key),
            "tenant": tenant,
            "tier": tier,
        }
        if as_json:
            click.echo(json.dumps({"key": key, "entry": entry}))
            return
        click.secho("New API key (shown only now; shuniu stores only its hash):", bold=True, err=True)
        click.echo(key)
        click.secho(
            "\nAdd this entry under auth.authenticators[kind=api_keys].options.keys:", bold=True, err=True
        )
        click.echo(yaml.safe_dump([entry], sort_keys=False).rstrip())

    @keys.command("hash")
    def hash_cmd() -> None:
        """Read a key on standard input and print its ``sha256:`` line."""
        key = sys.stdin.readline().strip()
        if not key:
            raise click.UsageError("no key on standard input")
        click.echo(hash_key(key))
