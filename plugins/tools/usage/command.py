"""``shuniu usage`` (a report from ``/v1/usage``: a rich table, optionally a PNG plot) and
``shuniu keys create|list|show|revoke|rotate`` (the admin API's ``/admin/keys``).

Both talk to a running gateway: ``--url`` (or ``SHUNIU_URL``, default
``http://127.0.0.1:8000``) with ``--key`` (``SHUNIU_API_KEY``; for keys, ``--admin-key`` or
``SHUNIU_ADMIN_KEY``). A tenant's key gets its own tenant's usage; an admin key everyone's.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from shuniu.plugins.tools.usage.client import GatewayClient, GatewayClientError

__all__ = ["add_key_commands", "usage_command"]

_URL_HELP = "The gateway (default: $SHUNIU_URL or http://127.0.0.1:8000)."


def _url(url: str | None) -> str:
    return url or os.environ.get("SHUNIU_URL") or "http://127.0.0.1:8000"


def _fail(exc: GatewayClientError) -> None:
    raise click.ClickException(str(exc))


@click.command("usage")
@click.option("--url", default=None, help=_URL_HELP)
@click.option(
    "--key", envvar="SHUNIU_API_KEY", default=None, help="An API key or admin key ($SHUNIU_API_KEY)."
)
@click.option("--since", default="7d", show_default=True, help="From: 7d, 12h, 30m, a date or an ISO time.")
@click.option("--until", default=None, help="Until (default: now), as --since.")
@click.option(
    "--by",
    "group_by",
    default="tenant,model",
    show_default=True,
    help="Group by: tenant, key, project, tier, model, served, endpoint, status, api, gateway, day, hour.",
)
@click.option("--tenant", default=None, help="Only this tenant (an admin key's choice).")
@click.option("--model", default=None, help="Only this model.")
@click.option("--key-id", default=None, help="Only this key (by id).")
@click.option("--project", default=None, help="Only this project.")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="Also write a PNG plot."
)
@click.option("--json", "as_json", is_flag=True, help="Print the gateway's JSON answer.")
def usage_command(
    url: str | None,
    key: str | None,
    since: str,
    until: str | None,
    group_by: str,
    tenant: str | None,
    model: str | None,
    key_id: str | None,
    project: str | None,
    plot_path: str | None,
    as_json: bool,
) -> None:
    """What was used, and what it cost, from a running gateway's usage ledger."""
    client = GatewayClient(_url(url), key)
    query = {
        "since": since,
        "until": until,
        "group_by": group_by,
        "tenant": tenant,
        "model": model,
        "key": key_id,
        "project": project,
        "limit": 10000,
    }
    try:
        answer = client.call("GET", "/v1/usage", query=query)
    except GatewayClientError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    print_usage(answer, Console())
    if plot_path is not None:
        plot_usage(answer, plot_path)
        click.echo(f"plot: {plot_path}", err=True)


def print_usage(answer: dict[str, Any], console: Console) -> None:
    groups: list[str] = answer.get("group_by") or []
    rows: list[dict[str, Any]] = answer.get("data") or []
    currency = answer.get("currency", "")
    scope = f" · tenant {answer['tenant']}" if answer.get("tenant") else ""
    table = Table(title=f"usage{scope}", title_justify="left")
    for g in groups:
        table.add_column(g)
    for name in ("requests", "refused", "prompt", "cached", "completion", f"cost ({currency})"):
        table.add_column(name, justify="right")
    totals = [0, 0, 0, 0, 0, 0.0]
    for row in rows:
        values = [
            row["requests"],
            row["refused"],
            row["prompt_tokens"],
            row["cached_tokens"],
            row["completion_tokens"],
            row["cost"],
        ]
        totals = [a + b for a, b in zip(totals, values, strict=True)]
        cells = [str(row["groups"].get(g)) if row["groups"].get(g) is not None else "—" for g in groups]
        table.add_row(*cells, *(f"{v:,}" for v in values[:5]), f"{values[5]:,.4f}")
    if len(rows) > 1 or not groups:
        table.add_section()
        table.add_row(
            *(["total"] + [""] * (len(groups) - 1) if groups else []),
            *(f"{v:,}" for v in totals[:5]),
            f"{totals[5]:,.4f}",
            style="bold",
        )
    console.print(table)
    if not rows:
        console.print("[dim]no requests in that range[/dim]")


def plot_usage(answer: dict[str, Any], path: str) -> None:
    """A PNG: tokens (or cost, when prices are set) per group; per day or hour as stacked
    bars when the report is grouped by time."""
    from shuniu.core.extras import require

    require("matplotlib", "plot", "The usage plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: list[str] = answer.get("group_by") or []
    rows: list[dict[str, Any]] = answer.get("data") or []
    by_cost = any(r["cost"] > 0 for r in rows)
    measure = "cost" if by_cost else "total_tokens"
    label = f"cost ({answer.get('currency', '')})" if by_cost else "tokens"
    time_key = next((g for g in groups if g in ("day", "hour")), None)
    others = [g for g in groups if g != time_key]

    def name(row: dict[str, Any]) -> str:
        return " / ".join(str(row["groups"].get(g)) for g in others) or "all"

    fig, ax = plt.subplots(figsize=(9, 4.5))
    if time_key is not None:
        times = sorted({str(r["groups"][time_key]) for r in rows})
        series: dict[str, dict[str, float]] = {}
        for r in rows:
            series.setdefault(name(r), {})[str(r["groups"][time_key])] = r[measure]
        bottom = [0.0] * len(times)
        for serie, values in sorted(series.items()):
            heights = [values.get(t, 0.0) for t in times]
            ax.bar(times, heights, bottom=bottom, label=serie)
            bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
        ax.set_xlabel(time_key)
        ax.legend(fontsize="small")
        ax.tick_params(axis="x", rotation=45)
    else:
        top = rows[:30]
        ax.barh([name(r) for r in reversed(top)], [r[measure] for r in reversed(top)])
    ax.set_ylabel(label) if time_key is not None else ax.set_xlabel(label)
    ax.set_title("usage " + (f"by {', '.join(groups)}" if groups else "(total)"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- shuniu keys: the admin API ----------------------------------------------------------


def _budget(text: str) -> dict[str, Any]:
    """``day:tokens=100000``, ``month:cost=20``, ``total:tokens=5e6``, ``...,soft=0.9``."""
    try:
        period, _, rest = text.partition(":")
        out: dict[str, Any] = {"period": period}
        for part in rest.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name == "tokens":
                out["tokens"] = int(float(value))
            elif name in ("cost", "soft"):
                out[name] = float(value)
            else:
                raise ValueError(name)
        if not math.isfinite(out.get("cost", 0.0)):
            raise ValueError
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: write PERIOD:tokens=N or PERIOD:cost=X (PERIOD day, month or total; add ,soft=0.8)"
        ) from None
    return out


def _limits(text: str) -> dict[str, int]:
    try:
        return {k.strip(): int(v) for k, v in (p.split("=", 1) for p in text.split(","))}
    except ValueError:
        raise click.BadParameter(f"{text!r}: write rpm=60,tpm=100000,concurrency=4") from None


def _print_key(row: dict[str, Any]) -> None:
    secret = row.pop("key", None)
    if secret is not None:
        click.secho("New API key (shown only now; the gateway stores only its hash):", bold=True, err=True)
        click.echo(secret)
    click.echo(json.dumps(row, indent=2), err=secret is not None)


def add_key_commands(keys: click.Group) -> None:
    """Add the admin-API commands to ``shuniu keys``."""
    admin = [
        click.option("--url", default=None, help=_URL_HELP),
        click.option(
            "--admin-key", envvar="SHUNIU_ADMIN_KEY", default=None, help="An admin key ($SHUNIU_ADMIN_KEY)."
        ),
    ]

    def with_admin(fn: Any) -> Any:
        for option in reversed(admin):
            fn = option(fn)
        return fn

    def client(url: str | None, admin_key: str | None) -> GatewayClient:
        if not admin_key:
            raise click.UsageError("give --admin-key or set SHUNIU_ADMIN_KEY")
        return GatewayClient(_url(url), admin_key)

    @keys.command("create")
    @with_admin
    @click.option("--tenant", required=True, help="Tenant the key belongs to.")
    @click.option("--tier", default="default", show_default=True)
    @click.option("--id", "key_id", default=None, help="Name of the key (default: a random one).")
    @click.option("--project", default=None)
    @click.option(
        "--model", "models", multiple=True, help="A model the key may use (repeat; default: its tier's)."
    )
    @click.option("--limits", default=None, help="rpm=60,tpm=100000,concurrency=4")
    @click.option(
        "--budget", "budgets", multiple=True, help="PERIOD:tokens=N or PERIOD:cost=X[,soft=S] (repeat)."
    )
    @click.option("--expires-in", "expires_in_s", type=float, default=None, help="Seconds until it expires.")
    @click.option("--description", default=None)
    def create(
        url: str | None,
        admin_key: str | None,
        tenant: str,
        tier: str,
        key_id: str | None,
        project: str | None,
        models: tuple[str, ...],
        limits: str | None,
        budgets: tuple[str, ...],
        expires_in_s: float | None,
        description: str | None,
    ) -> None:
        """Create a key on a running gateway; the key is printed ONCE."""
        body: dict[str, Any] = {"tenant": tenant, "tier": tier}
        for name, value in (
            ("id", key_id),
            ("project", project),
            ("models", list(models) or None),
            ("limits", _limits(limits) if limits else None),
            ("budgets", [_budget(b) for b in budgets] or None),
            ("expires_in_s", expires_in_s),
            ("description", description),
        ):
            if value is not None:
                body[name] = value
        try:
            _print_key(client(url, admin_key).call("POST", "/admin/keys", body))
        except GatewayClientError as exc:
            _fail(exc)

    @keys.command("list")
    @with_admin
    def listing(url: str | None, admin_key: str | None) -> None:
        """The keys managed at run time, with their state."""
        try:
            rows = client(url, admin_key).call("GET", "/admin/keys")["data"]
        except GatewayClientError as exc:
            _fail(exc)
        table = Table(title="managed keys", title_justify="left")
        for name in ("id", "tenant", "tier", "project", "state", "budgets", "expires"):
            table.add_column(name)
        for r in rows:
            budgets = ", ".join(
                f"{b['period']}:{b.get('tokens', b.get('cost'))}{'' if 'tokens' in b else ' cost'}"
                for b in r.get("budgets", [])
            )
            table.add_row(
                r["id"],
                r["tenant"],
                r["tier"],
                r.get("project") or "—",
                r["state"],
                budgets or "—",
                _when(r.get("expires_at")),
            )
        Console().print(table)

    @keys.command("show")
    @with_admin
    @click.argument("key_id")
    def show(url: str | None, admin_key: str | None, key_id: str) -> None:
        """One managed key's settings."""
        try:
            click.echo(json.dumps(client(url, admin_key).call("GET", f"/admin/keys/{key_id}"), indent=2))
        except GatewayClientError as exc:
            _fail(exc)

    @keys.command("revoke")
    @with_admin
    @click.argument("key_id")
    def revoke(url: str | None, admin_key: str | None, key_id: str) -> None:
        """Revoke a managed key (every gateway refuses it within keys.refresh_s)."""
        try:
            row = client(url, admin_key).call("DELETE", f"/admin/keys/{key_id}")
        except GatewayClientError as exc:
            _fail(exc)
        click.echo(f"revoked {row['id']}")

    @keys.command("rotate")
    @with_admin
    @click.argument("key_id")
    @click.option(
        "--grace",
        "grace_s",
        type=float,
        default=0.0,
        show_default=True,
        help="Seconds the old secret keeps working.",
    )
    def rotate(url: str | None, admin_key: str | None, key_id: str, grace_s: float) -> None:
        """A new secret for a managed key (same id, settings, budgets); printed ONCE."""
        try:
            _print_key(
                client(url, admin_key).call("POST", f"/admin/keys/{key_id}/rotate", {"grace_s": grace_s})
            )
        except GatewayClientError as exc:
            _fail(exc)


def _when(ts: float | None) -> str:
    if ts is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))
