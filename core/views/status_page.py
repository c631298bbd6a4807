"""The gateway's live status page (``GET /status``).

``/status`` is one self-contained HTML page (inline CSS and a little vanilla JavaScript, no
external assets) that fetches ``status.json`` (:mod:`shuniu.core.views.status`) every
:data:`~shuniu.core.views.status.REFRESH_S` seconds and redraws: per model the healthy
endpoints, the queue, requests per second, error rate and TTFT / end-to-end percentiles over
the last minute; per endpoint its health, in-flight requests, the engine's reported load,
counters and the managed engine's state; with a usage ledger (``governance:``), the last
day's usage by tenant and model; while batches are unfinished, the batch queue's counts.
The page builds its DOM with ``textContent`` only, so nothing from the deployment or an
engine is ever parsed as HTML, and its Content-Security-Policy allows only its own inline
script and style (by hash) and requests to its own origin.
"""

from __future__ import annotations

import base64
import hashlib
import html

from shuniu.core.version import __version__
from shuniu.core.views.status import REFRESH_S, RING_SIZE, WINDOW_S

__all__ = ["PAGE_CONTENT_TYPE", "PAGE_HEADERS", "render_page"]

PAGE_CONTENT_TYPE = "text/html"
"""The page's media type (Litestar adds ``; charset=utf-8``)."""


_STYLE = """
:root{--bg:#f6f7f9;--fg:#1d232b;--mut:#66707c;--card:#fff;--line:#dfe3e8;--ok:#1a7f37;
--okbg:#dafbe1;--bad:#cf222e;--badbg:#ffebe9;--warn:#9a6700;--warnbg:#fff8c5}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--mut:#8d96a0;--card:#161b22;
--line:#30363d;--ok:#3fb950;--okbg:#12261e;--bad:#f85149;--badbg:#2d1214;--warn:#d29922;--warnbg:#2b2111}}
*{box-sizing:border-box}
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;background:var(--bg);
color:var(--fg)}
header{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:center;padding:.6rem 1rem;
background:var(--card);border-bottom:1px solid var(--line);position:sticky;top:0}
header h1{font-size:1.05rem;margin:0}
#updated{color:var(--mut);font-variant-numeric:tabular-nums}
#updated.stale{color:var(--bad);font-weight:600}
#keyform{margin-left:auto;display:flex;gap:.3rem;align-items:center;color:var(--mut)}
#keyform input{width:14rem;font:inherit;padding:.15rem .3rem;background:var(--bg);color:var(--fg);
border:1px solid var(--line);border-radius:4px}
#keyform button{font:inherit}
#banner{margin:.8rem 1rem 0;padding:.5rem .8rem;border-radius:6px;background:var(--badbg);color:var(--bad)}
main{padding:.4rem 1rem 1rem}
section.model{background:var(--card);border:1px solid var(--line);border-radius:8px;margin:.8rem 0;
padding:.6rem .9rem;overflow-x:auto}
section.model h2{font-size:1.05rem;margin:.1rem 0 .5rem;display:flex;gap:.6rem;align-items:center}
.stats{display:flex;flex-wrap:wrap;gap:.4rem 1.6rem;margin:0 0 .6rem}
.stats div{display:flex;flex-direction:column}
.stats dt{color:var(--mut);font-size:.8rem}
.stats dd{margin:0;font-size:1.05rem;font-variant-numeric:tabular-nums}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.3rem .5rem;border-top:1px solid var(--line);white-space:nowrap;
font-variant-numeric:tabular-nums}
th{color:var(--mut);font-weight:500;font-size:.8rem;border-top:0}
td.detail{max-width:22rem;overflow:hidden;text-overflow:ellipsis;color:var(--mut)}
.badge{display:inline-block;padding:.05rem .5rem;border-radius:999px;font-size:.8rem;font-weight:600}
.ok{background:var(--okbg);color:var(--ok)}
.bad{background:var(--badbg);color:var(--bad)}
.warn{background:var(--warnbg);color:var(--warn)}
.mut{color:var(--mut)}
meter{width:4rem;vertical-align:middle}
footer{color:var(--mut);padding:0 1rem 1rem;font-size:.8rem}
"""

_SCRIPT = r"""
"use strict";
(function () {
  const KEY = "shuniu.status.key";
  const REFRESH_MS = Math.round(Number(document.body.dataset.refresh || "2") * 1000);
  const $ = (id) => document.getElementById(id);
  let lastOk = 0;
  let timer = null;

  // Every string goes in through textContent: nothing from the gateway is parsed as HTML.
  function h(tag, cls, ...kids) {
    const el = document.createElement(tag);
    if (cls) el.className = cls;
    for (const k of kids) {
      if (k === null || k === undefined) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }
  const dash = "\u2014";
  const num = (v) => (v === null || v === undefined ? dash : String(v));
  function ms(s) {
    if (s === null || s === undefined) return dash;
    return s < 1 ? (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms" : s.toFixed(2) + " s";
  }
  const pct = (r) => (r === null || r === undefined ? dash : (r * 100).toFixed(r && r < 0.01 ? 2 : 1) + " %");
  function rate(v) {
    if (v === null || v === undefined) return dash;
    return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  }
  function stat(label, value, cls) {
    const dd = h("dd", cls || "", value);
    return h("div", "", h("dt", "", label), dd);
  }

  function showBanner(text) {
    const b = $("banner");
    b.textContent = text;
    b.hidden = !text;
  }

  function engineCell(launch) {
    if (!launch) return h("td", "mut", dash);
    const state = String(launch.state || "?");
    const cls = state === "ready" ? "badge ok" : state === "starting" ? "badge warn" : "badge bad";
    const td = h("td", "", h("span", cls, state), " ", h("span", "mut", num(launch.restarts) + " restarts"));
    if (launch.detail) td.title = String(launch.detail);
    return td;
  }

  function endpointRow(e) {
    const load = e.load || null;
    const word = e.healthy ? "healthy" : "unhealthy";
    const health = h("span", e.healthy ? "badge ok" : "badge bad", "\u25cf " + word);
    health.dataset.health = word;
    const detail = h("td", "detail", e.detail || "");
    detail.title = String(e.detail || "");
    let engine;
    if (load) {
      engine = h("td", "", num(load.running) + " / " + num(load.waiting));
      if (load.kv_usage !== null && load.kv_usage !== undefined) {
        const m = document.createElement("meter");
        m.min = 0; m.max = 1; m.low = 0.7; m.high = 0.9; m.optimum = 0; m.value = load.kv_usage;
        engine.append(" ", m, " " + pct(load.kv_usage));
      }
    } else {
      engine = h("td", "mut", dash);
    }
    const row = h("tr", "",
      h("td", "", h("strong", "", e.name), " ",
        h("span", "mut", [e.kind, e.version].filter(Boolean).join(" "))),
      h("td", "", health),
      detail,
      h("td", "", num(e.in_flight) + " / " + (e.limit ? e.limit : "\u221e")),
      engine,
      h("td", "", num(e.completed) + " / ", h("span", e.errors ? "badge bad" : "", num(e.errors))),
      engineCell(e.launch));
    row.dataset.endpoint = String(e.name);
    return row;
  }

  function modelSection(name, m) {
    // Without an admin key the gateway sends a count instead of the endpoints themselves.
    const detailed = Array.isArray(m.endpoints);
    const eps = detailed ? m.endpoints : [];
    const total = detailed ? eps.length : (m.endpoints || 0);
    const r = m.recent || {};
    const healthy = m.healthy_endpoints || 0;
    const badge = h("span", healthy === total ? "badge ok" : healthy ? "badge warn" : "badge bad",
      healthy + " / " + total + " healthy");
    const stats = h("dl", "stats",
      stat("queued", num(m.queued)),
      stat("req/s", rate(r.rps)),
      stat("errors", pct(r.error_rate), r.errors ? "bad" : ""),
      stat("TTFT p50 / p99", ms(r.ttft_p50) + " / " + ms(r.ttft_p99)),
      stat("e2e p50 / p99", ms(r.e2e_p50) + " / " + ms(r.e2e_p99)),
      stat("requests (" + Math.round(r.span_s || 0) + " s)", num(r.requests)));
    const head = h("tr", "", ...["endpoint", "health", "detail", "in flight / limit",
      "engine run / wait / KV", "completed / errors", "managed engine"].map((t) => h("th", "", t)));
    const table = detailed ? h("table", "", h("thead", "", head), h("tbody", "", ...eps.map(endpointRow)))
      : h("p", "mut", "Endpoint details are shown to admin keys.");
    const sec = h("section", "model", h("h2", "", name, badge), stats, table);
    sec.dataset.model = String(name);
    return sec;
  }

  function usageSection(u) {
    // The ledger's last day by tenant and model (governance:); absent without a ledger.
    if (!u) return null;
    if (!u.available) return h("section", "model", h("h2", "", "Usage (last 24 h)"),
      h("p", "bad", "The usage ledger cannot be read right now."));
    const rows = u.rows || [];
    const head = h("tr", "", ...["tenant", "model", "requests", "refused", "prompt tokens",
      "cached", "completion tokens", "cost (" + (u.currency || "") + ")"].map((t) => h("th", "", t)));
    const cell = (v, cls) => h("td", cls || "", v);
    const body = rows.map((r) => h("tr", "", cell(num(r.groups.tenant)), cell(num(r.groups.model)),
      cell(num(r.requests)), cell(num(r.refused), r.refused ? "bad" : ""), cell(num(r.prompt_tokens)),
      cell(num(r.cached_tokens)), cell(num(r.completion_tokens)), cell(r.cost.toFixed(4))));
    const table = rows.length ? h("table", "", h("thead", "", head), h("tbody", "", ...body))
      : h("p", "mut", "No requests recorded in the last 24 hours.");
    const sec = h("section", "model", h("h2", "", "Usage (last 24 h)"), table);
    sec.id = "usage";
    return sec;
  }

  function batchesSection(b) {
    // The Batch API's queue (counts only), when a batch is unfinished.
    if (!b) return null;
    const open = Object.values(b.batches || {}).reduce((x, y) => x + y, 0);
    if (!open) return null;
    const r = b.requests || {};
    const stats = h("dl", "stats",
      stat("unfinished batches", num(open)),
      stat("requests pending", num(r.pending || 0)),
      stat("running", num(r.running || 0)),
      stat("done", num(r.done || 0)),
      stat("failed", num(r.failed || 0), r.failed ? "bad" : ""),
      stat("running on this gateway", num(b.running_here)));
    const sec = h("section", "model", h("h2", "", "Batches"), stats);
    sec.id = "batches";
    return sec;
  }

  function render(data) {
    const status = String(data.status || "unknown");
    const overall = $("overall");
    overall.textContent = status;
    overall.className = "badge " + (status === "ready" ? "ok" : status === "draining" ? "warn" : "bad");
    const models = data.models || {};
    const names = Object.keys(models);
    const sections = names.length ? names.map((n) => modelSection(n, models[n]))
      : [h("p", "mut", "No models.")];
    const usage = usageSection(data.usage);
    if (usage) sections.push(usage);
    const batches = batchesSection(data.batches);
    if (batches) sections.push(batches);
    $("models").replaceChildren(...sections);
    const u = data.unrouted;
    $("unrouted").textContent = u && u.requests ? u.requests + " requests refused before routing"
      + " (bad request, credential or unknown model) in the last minute" : "";
    $("version").textContent = "shuniu " + (data.version || "");
    document.body.dataset.loaded = "1";
  }

  async function refresh() {
    const headers = { "accept": "application/json" };
    const key = sessionStorage.getItem(KEY);
    if (key) headers["authorization"] = "Bearer " + key;
    const ctl = new AbortController();
    const stop = setTimeout(() => ctl.abort(), 5000);
    try {
      const resp = await fetch("status.json", { headers, cache: "no-store", signal: ctl.signal });
      if (resp.status === 401 || resp.status === 403) {
        showBanner(key ? "The gateway refused this key (HTTP " + resp.status + ")."
          : "This gateway needs an API key: enter one above.");
        $("key").focus();
      } else if (!resp.ok) {
        showBanner("status.json answered HTTP " + resp.status + ".");
      } else {
        render(await resp.json());
        lastOk = Date.now();
        showBanner("");
      }
    } catch (err) {
      const why = err && err.name === "AbortError" ? "timed out" : String((err && err.message) || err);
      showBanner("Cannot reach the gateway (" + why + ").");
    } finally {
      clearTimeout(stop);
      const upd = $("updated");
      if (lastOk) {
        const age = (Date.now() - lastOk) / 1000;
        upd.textContent = "updated " + new Date(lastOk).toLocaleTimeString();
        upd.className = age > 3 * REFRESH_MS / 1000 ? "stale" : "";
      }
      timer = setTimeout(refresh, REFRESH_MS);
    }
  }

  window.addEventListener("error", (ev) => showBanner("JS error: " + ev.message));
  window.addEventListener("unhandledrejection", (ev) => showBanner("JS error: " + String(ev.reason)));
  const input = $("key");
  input.value = sessionStorage.getItem(KEY) || "";
  $("keyform").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = input.value.trim();
    if (v) sessionStorage.setItem(KEY, v); else sessionStorage.removeItem(KEY);
    clearTimeout(timer);
    refresh();
  });
  refresh();
})();
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE_HEADERS: dict[str, str] = {
    "content-security-policy": (
        f"default-src 'none'; script-src {_sha256(_SCRIPT)}; style-src {_sha256(_STYLE)}; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}
"""Headers for ``/status``: the page may run only its own script and style, and talk only
to its own origin."""


def render_page(
    *, title: str = "shuniu status", version: str = __version__, refresh_s: float = REFRESH_S
) -> str:
    """The status page's HTML shell; every value placed into it is escaped."""
    esc = html.escape
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer">'
        '<link rel="icon" href="data:,">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style></head>\n"
        f'<body data-refresh="{esc(str(float(refresh_s)))}">'
        f'<header><h1>{esc(title)}</h1><span id="overall" class="badge warn">loading</span>'
        '<span id="updated"></span>'
        '<form id="keyform" autocomplete="off"><label for="key">API key</label>'
        '<input id="key" type="password" placeholder="only when auth is on" spellcheck="false">'
        '<button type="submit">use</button></form></header>\n'
        '<div id="banner" role="alert" hidden></div>'
        '<main id="models"><p class="mut">Loading status.json\u2026</p></main>'
        f'<footer><span id="version">shuniu {esc(version)}</span> \u00b7 refreshes every '
        f"{esc(f'{refresh_s:g}')} s \u00b7 rates and percentiles over the last {WINDOW_S:g} s "
        f'(last {RING_SIZE} requests per model) \u00b7 <span id="unrouted"></span></footer>\n'
        f"<noscript>This page needs JavaScript; the same data is at status.json.</noscript>"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )
