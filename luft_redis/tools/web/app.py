"""The web view's ASGI app (Starlette): pages, the JSON API, the event stream, the guards.

Routes::

    GET  /                          the runs page (server-rendered, from the run index)
    GET  /runs/{id}                 one run's page (filled and kept live by static/web.js)
    GET  /api/runs                  runs as ``runs --json`` rows, with counts by status
    GET  /api/runs/{id}             the run's state (``show --json`` plus ``view``)
    GET  /api/runs/{id}/events      text/event-stream: ``event`` and ``state`` messages
    GET  /api/runs/{id}/log         older events, paged (``?before=ID&count=N``)
    POST /api/runs/{id}/cancel      only with --allow-cancel and the page's CSRF token
    GET  /api/runs/{id}/history     the run's versions, newest first (``?before=ID&count=N``)
    POST /api/runs/{id}/fork        ``{"at": POINT}``: a new run from a past point; only with
                                    --allow-fork and the page's CSRF token
    GET  /static/...                web.js, web.css (shipped in the wheel)

Guards (:class:`Guard`, on every request, the event stream included): the ``Host`` header
must name the bound address (or an ``--allowed-host``), which defeats DNS rebinding; with a
token, a request needs ``Authorization: Bearer <token>`` or the session cookie that
``?token=<token>`` on a page sets (HttpOnly, SameSite=Strict); every response carries a
strict Content-Security-Policy (scripts only from /static, no inline script).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import html
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ... import index
from ...asyncio import index as index_io
from ...errors import (
    CorruptDataError,
    HistoryUnavailableError,
    LuftRedisError,
    ValidationError,
)
from ...history import parse_at
from ...keys import run_keys
from ..render import decode_page, dumps, one_line, run_row_json, utc_time, version_json
from .hub import PAGE_BYTES, TASK_BYTES, Hubs, RunHub, cut, event_text, redis_problem
from .pools import pool_routes

__all__ = ["STATIC", "WebConfig", "create_app"]

logger = logging.getLogger(__name__)

STATIC: Final = Path(__file__).parent / "static"
COOKIE: Final = "luft_web_session"
PAGE_SIZE: Final = 50
"""Runs per page of the runs page."""
MAX_ROWS: Final = 10_000
"""The deepest row the runs page pages to (read_page reads up to page * size rows)."""
SEARCH_DEPTH: Final = 1000
_RUN_COLUMNS: Final = ("task", "run", "status", "phase", "agents", "ok", "failed", "running",
                       "tokens", "started (UTC)", "last change (UTC)")
"""A text search looks at the newest this many runs (of the status filter)."""
COUNTS_MAX_AGE: Final = 15.0
"""Only while some indexed runs lack a kept status (indexed by an older version): seconds the
counts by status counted over the index are reused before they are counted again (in the
background: a page load never waits for a count)."""
LOG_PAGE: Final = 200
SHUTDOWN_TIMEOUT: Final = 5.0
"""Seconds the web view gives its run views (their backends, the counts being read) to close
when it stops; then it stops without them."""
_READ_ONLY: Final = "read-only: start luft-redis web with --allow-cancel to cancel runs"

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGI = Callable[[_Scope, _Receive, _Send], Awaitable[None]]

CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
              "connect-src 'self'; base-uri 'none'; form-action 'self'; "
              "frame-ancestors 'none'")  # fmt: skip


@dataclass
class WebConfig:
    """What ``luft-redis web`` was started with."""

    prefix: str
    host: str = "127.0.0.1"
    port: int = 8470
    token: str | None = None
    allow_cancel: bool = False
    allow_fork: bool = False
    allowed_hosts: Sequence[str] = ()
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def session_value(self) -> str:
        """The cookie value that stands for the token (not the token itself)."""
        assert self.token is not None
        return hmac.new(self.token.encode(), b"luft-web-session", hashlib.sha256).hexdigest()

    def csrf_token(self) -> str:
        return hmac.new(self.secret, b"luft-web-csrf", hashlib.sha256).hexdigest()

    def host_names(self) -> set[str]:
        names = {self.host.lower().strip("[]"), *(h.lower() for h in self.allowed_hosts)}
        if names & {"127.0.0.1", "localhost", "::1"}:
            names |= {"127.0.0.1", "localhost", "::1"}
        if names & {"0.0.0.0", "::"}:  # every address of this machine: its names
            import socket

            names |= {socket.gethostname().lower(), socket.getfqdn().lower(), "127.0.0.1",
                      "localhost", "::1"}  # fmt: skip
            with contextlib.suppress(OSError):
                for info in socket.getaddrinfo(socket.gethostname(), None):
                    names.add(str(info[4][0]).lower())
        return names


def _host_of(header: str) -> str:
    """The host name of a Host header (without the port, IPv6 brackets removed)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """Host check, token check and security headers around the app (pure ASGI, so the
    event stream is guarded like any request)."""

    def __init__(self, app: _ASGI, config: WebConfig) -> None:
        self.app = app
        self.config = config
        self.names = config.host_names()

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] == "websocket":  # the view serves none: refused before any check
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}  # fmt: skip

        async def secured(message: _Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(b"content-security-policy", CSP.encode()),
                         (b"x-content-type-options", b"nosniff"),
                         (b"referrer-policy", b"no-referrer"),
                         (b"x-frame-options", b"DENY"),
                         (b"cache-control", b"no-store")]  # fmt: skip
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        if _host_of(headers.get("host", "")) not in self.names:
            await PlainTextResponse("unknown Host: this server answers only to its own "
                                    "address (see --allowed-host)", 421)(scope, receive, secured)
            return
        token = self.config.token
        if token is not None and not self._authorized(headers):
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            given = query.get("token")
            if (given is not None and scope["method"] == "GET"
                    and hmac.compare_digest(given.encode(), token.encode())):  # fmt: skip
                rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
                # a path of this server, never "//host/...": a redirect off-site
                target = "/" + scope["path"].lstrip("/\\") + (f"?{rest}" if rest else "")
                response: Response = RedirectResponse(target, 303)
                response.set_cookie(COOKIE, self.config.session_value(), httponly=True,
                                    samesite="strict", path="/")  # fmt: skip
                await response(scope, receive, secured)
                return
            if scope["path"].startswith("/api/"):
                response = JSONResponse({"error": "unauthorized: send Authorization: Bearer "
                                         "<token>"}, 401, headers={"WWW-Authenticate": "Bearer"})
            else:
                response = HTMLResponse(_page("Token needed", "<p>This view needs its token: "
                                              "open the URL that <code>luft-redis web</code> "
                                              "printed (it ends in <code>?token=...</code>)."
                                              "</p>"), 401)  # fmt: skip
            await response(scope, receive, secured)
            return
        if scope["method"] not in ("GET", "HEAD") and not (self.config.allow_cancel
                                                           or self.config.allow_fork):
            await JSONResponse({"error": _READ_ONLY}, 403)(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    def _authorized(self, headers: dict[str, str]) -> bool:
        token = self.config.token
        assert token is not None
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and hmac.compare_digest(auth[7:].strip().encode(),
                                                                 token.encode()):  # fmt: skip
            return True
        cookie: SimpleCookie = SimpleCookie()
        with contextlib.suppress(Exception):
            cookie.load(headers.get("cookie", ""))
        morsel = cookie.get(COOKIE)
        return morsel is not None and hmac.compare_digest(
            morsel.value.encode(), self.config.session_value().encode())


# ------------------------------------------------------------------------------- HTML


def _is_entry_id(text: str) -> bool:
    """``<ms>-<seq>``, each a decimal of at most 2^64-1 (what XRANGE takes as an id)."""
    ms, dash, seq = text.partition("-")
    return bool(dash) and all(
        part.isascii() and part.isdigit() and int(part) < 2**64 for part in (ms, seq))


def fork_note(row: index.IndexRow) -> str:
    """A fork's note in the runs page's task cell (its parent's page linked)."""
    if not row.parent:
        return ""
    parent = row.parent.partition(" ")[0]
    return (f" <a class=\"note\" href=\"/runs/{_e(parent)}\" title=\"{_e(row.parent)}\">"
            f"({_e(row.forked_from)})</a>")  # fmt: skip


def _e(value: object) -> str:
    """Escaped text for HTML (every value that came from Redis goes through here)."""
    return html.escape("" if value is None else str(value), quote=True)


def _page(title: str, body: str, *, meta: str = "", script: bool = False) -> str:
    js = '<script src="/static/web.js" defer></script>' if script else ""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)} · luft-redis</title>"
            f"<link rel=\"stylesheet\" href=\"/static/web.css\">{meta}{js}</head><body>"
            "<header class=\"top\"><a href=\"/\" class=\"brand\">luft-redis</a></header>"
            f"<main>{body}</main></body></html>")  # fmt: skip


@dataclass
class _Counts:
    """Runs by status: read in one round trip from the counts kept next to the index
    (:func:`luft_redis.index.read_counts`); while some indexed runs have none (indexed by an
    older version), counted over the index in the background instead, every
    :data:`COUNTS_MAX_AGE` seconds, and the page says so."""

    counts: dict[str, int] = field(default_factory=dict)
    at: float = 0.0
    task: asyncio.Task[None] | None = None
    exact: bool = False
    unkept: int = 0
    problem: str | None = None


class _Runs:
    """The runs page's reads of the run index, on the view's asyncio client."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.counts = _Counts()

    async def page(self, status: str, text: str, page: int) -> tuple[
            list[index.IndexRow], int, bool]:  # fmt: skip
        """(rows of page ``page``, runs indexed, whether a next page exists) of the runs of
        ``status`` (any status when it names none). A text search (in the task, or
        the start of the run id) filters the newest :data:`SEARCH_DEPTH` runs."""
        end = (page + 1) * PAGE_SIZE
        limit = SEARCH_DEPTH if text else min(MAX_ROWS, end + 1)
        statuses = [status] if status in index.STATUSES else []
        found = await index_io.read_page(self.client, self.prefix, limit=limit,
                                         statuses=statuses)  # fmt: skip
        needle = text.casefold().strip()
        rows = [r for r in found.rows if needle in r.task.casefold()
                or str(r.run_id).startswith(needle)] if text else found.rows  # fmt: skip
        return rows[end - PAGE_SIZE:end], found.indexed, len(rows) > end

    async def status_counts(self) -> _Counts:
        """The counts by status: exact and current when the index keeps them for every run
        (one read); else the last background count over the index (``at``: when), and a new
        one started when that is older than :data:`COUNTS_MAX_AGE`. A corrupt count is
        reported (``problem``), never shown as a number."""
        state = self.counts
        try:
            kept = await index_io.read_counts(self.client, self.prefix, count=False)
        except CorruptDataError as exc:
            return _Counts(problem=str(exc))
        if kept.exact:
            return _Counts(counts=kept.counts, at=time.monotonic(), exact=True)
        state.unkept = kept.unkept
        now = time.monotonic()
        if now - state.at > COUNTS_MAX_AGE and (state.task is None or state.task.done()):
            async def count() -> None:
                try:
                    state.counts = await index_io.count_over_index(self.client, self.prefix)
                    state.at = time.monotonic()
                except Exception as exc:
                    logger.warning("counting runs by status failed: %s", exc)

            state.task = asyncio.get_running_loop().create_task(count())
        return state

    async def wait_counts(self) -> None:
        task = self.counts.task
        if task is not None:
            with contextlib.suppress(Exception):
                await task


def _int_arg(request: Request, name: str, default: int = 0) -> int:
    try:
        return max(0, int(request.query_params.get(name, default)))
    except ValueError:
        return default


def _filter(request: Request) -> tuple[str, str, int]:
    """The runs' filter of a request: ``?status=``, ``?q=`` (the text, at most 200
    characters), ``?page=`` (at most the page of :data:`MAX_ROWS`)."""
    params = request.query_params
    page = min(_int_arg(request, "page"), MAX_ROWS // PAGE_SIZE - 1)
    return params.get("status", ""), params.get("q", "").strip()[:200], page


def _parse_run(request: Request) -> uuid.UUID | None:
    try:
        return uuid.UUID(request.path_params["run_id"])
    except ValueError:
        return None


def create_app(config: WebConfig, async_client: Any) -> _ASGI:
    """The guarded ASGI app for ``config`` on the two clients (one asyncio client shared by
    every run's hub, one sync client for the run index)."""
    hubs = Hubs(async_client, config.prefix)
    runs = _Runs(async_client, config.prefix)
    host_names = config.host_names()
    warming: set[asyncio.Task[None]] = set()

    async def warm_up(run_id: uuid.UUID) -> None:
        """Start the run's hub (it lingers for the page's event stream)."""
        hub = await acquire(run_id)
        if isinstance(hub, RunHub):
            hub.released()

    async def acquire(run_id: uuid.UUID) -> RunHub | Response | None:
        """The run's hub; None when the run does not exist; a 503 when Redis is away."""
        try:
            return await hubs.acquire(run_id)
        except Exception as exc:
            logger.warning("opening run %s failed: %s", run_id, exc)
            return JSONResponse({"error": redis_problem(exc)}, 503)

    async def hub_of(request: Request) -> RunHub | Response:
        """The hub of the run the request names, or the error response (404 for a bad or
        unknown run id, 503 when Redis is away)."""
        run_id = _parse_run(request)
        if run_id is None:
            return JSONResponse({"error": "not a run id"}, 404)
        hub = await acquire(run_id)
        if hub is None:
            return JSONResponse({"error": f"run {run_id} not found"}, 404)
        return hub

    async def runs_page(request: Request) -> Response:
        status, text, page = _filter(request)
        rows: list[index.IndexRow] = []
        indexed, more, counts = 0, False, _Counts()
        banner, code = "", 200
        try:
            if request.query_params.get("wait_counts") == "1":  # tests: counts before the page
                await runs.status_counts()
                await runs.wait_counts()
            (rows, indexed, more), counts = await asyncio.gather(
                runs.page(status, text, page), runs.status_counts())
        except CorruptDataError as exc:
            banner = f"<div class=\"banner\" id=\"banner\">Corrupt data: {_e(exc)}</div>"
            code = 500
        except Exception as exc:
            banner = (f"<div class=\"banner\" id=\"banner\">{_e(redis_problem(exc))}. "
                      "Reload to try again.</div>")
            code = 503
        parts = [banner, "<h1>Runs</h1><ul class=\"counts\" id=\"counts\">"]
        parts.append(f"<li><a href=\"/\" data-status=\"all\">all <b>{indexed}</b></a></li>")
        for name in index.STATUSES:
            current = " class=\"current\"" if name == status else ""
            shown = counts.counts.get(name, 0) if counts.counts else "…"
            parts.append(f"<li{current}><a href=\"/?status={name}\" data-status=\"{name}\" "
                         f"class=\"st-{name}\">{name} <b>{shown}</b></a></li>")
        parts.append("</ul>")
        if counts.problem:
            parts.append(f"<p class=\"note corrupt\" id=\"counts-note\">counts not shown: "
                         f"{_e(counts.problem)}</p>")
        elif not counts.exact and code == 200:
            age = (f"as of {time.monotonic() - counts.at:.0f} s ago" if counts.at
                   else "being counted")
            parts.append(f"<p class=\"note\" id=\"counts-note\">{counts.unkept} run(s) were "
                         "indexed by an older version: the counts are counted over the index "
                         f"({age}); <code>luft-redis runs --rebuild-index</code> keeps them "
                         "exact from then on</p>")
        parts.append("<form class=\"filter\" method=\"get\" action=\"/\">"
                     "<label>status <select name=\"status\"><option value=\"\">any</option>")
        for name in index.STATUSES:
            selected = " selected" if name == status else ""
            parts.append(f"<option{selected}>{name}</option>")
        parts.append(f"</select></label> <label>task or run id <input name=\"q\" "
                     f"value=\"{_e(text)}\"></label> <button>Filter</button></form>")
        parts.append("<table class=\"runs stack\" id=\"runs\"><thead><tr>"
                     + "".join(f"<th>{name}</th>" for name in _RUN_COLUMNS)
                     + "</tr></thead><tbody>")  # fmt: skip
        counted = False
        for row in rows:
            if row.problem:
                agents = (f"<td colspan=\"3\" data-label=\"ok\" class=\"corrupt\" "
                          f"title=\"{_e(row.problem)}\">corrupt counters</td>")  # fmt: skip
            else:
                mark = "<sup>*</sup>" if row.counted else ""
                counted = counted or row.counted
                agents = (f"<td data-label=\"ok\" class=\"a-ok\">{row.agents_ok}{mark}</td>"
                          f"<td data-label=\"failed\" class=\"a-failed\">"
                          f"{row.agents_failed}{mark}</td>"
                          f"<td data-label=\"running\" class=\"a-running\">"
                          f"{row.agents_running}{mark}</td>")  # fmt: skip
            parts.append(
                f"<tr data-run=\"{row.run_id}\"><td data-label=\"task\" class=\"text\">"
                f"<a href=\"/runs/{row.run_id}\">{_e(one_line(row.task, 80)) or '(no task)'}"
                f"</a>{fork_note(row)}</td>"
                f"<td data-label=\"run\" class=\"run-id\" title=\"{row.run_id}\">"
                f"<a href=\"/runs/{row.run_id}\">{str(row.run_id)[:8]}</a></td>"
                f"<td data-label=\"status\" class=\"st-{_e(row.status)}\">{_e(row.status)}</td>"
                f"<td data-label=\"phase\">{row.current_phase}</td>"
                f"<td data-label=\"agents\" class=\"a-all\">{row.agents}</td>{agents}"
                f"<td data-label=\"tokens\">{row.total_tokens:,}</td>"
                f"<td data-label=\"started\" class=\"wide\">{utc_time(row.created_at)}</td>"
                f"<td data-label=\"last change\" class=\"wide\">{utc_time(row.updated_at)}"
                "</td></tr>")  # fmt: skip
        parts.append("</tbody></table>")
        if counted:
            parts.append("<p class=\"note\" id=\"rows-note\"><sup>*</sup> a run written by an "
                         "older version: ok/failed counted from its results (its next result "
                         "keeps them)</p>")
        if any(row.problem for row in rows):
            parts.append("<p class=\"note corrupt\">A run's agent counters are corrupt (hover "
                         "the cell for the field): deleting both fields (<code>HDEL</code> "
                         "agents_ok agents_failed) makes the run's next result count them "
                         "again from its results.</p>")
        if not rows:
            parts.append("<p class=\"note\">No runs here.</p>")
        nav = []
        query = {"status": status, "q": text}
        if page > 0:
            nav.append(f"<a href=\"/?{urlencode({**query, 'page': page - 1})}\">← newer</a>")
        if more:
            nav.append(f"<a href=\"/?{urlencode({**query, 'page': page + 1})}\" "
                       f"id=\"older\">older →</a>")
        if text:
            nav.append(f"<span class=\"note\">the search looks at the newest {SEARCH_DEPTH} "
                       "runs</span>")
        parts.append(f"<nav class=\"pager\">{' '.join(nav)}</nav>")
        return HTMLResponse(_page("Runs", "".join(parts)), code)

    async def run_page(request: Request) -> Response:
        run_id = _parse_run(request)
        if run_id is None:
            return HTMLResponse(_page("Not found", "<p>Not a run id.</p>"), 404)
        # one HMGET, not the hub: a run of 10,000 agents answers as fast as a small one; its
        # hub starts meanwhile, for the page's event stream
        try:
            raw_task, raw_status = await async_client.hmget(
                run_keys(config.prefix, run_id).run, ["task", "status"])  # fmt: skip
        except Exception as exc:
            return HTMLResponse(_page("Redis unreachable", "<div class=\"banner\" "
                                      f"id=\"banner\">{_e(redis_problem(exc))}. "
                                      "Reload to try again.</div>"), 503)  # fmt: skip
        if raw_status is None:
            return HTMLResponse(_page("Not found", f"<p>No run {run_id} under prefix "
                                      f"{_e(config.prefix)}.</p>"), 404)  # fmt: skip
        warm = asyncio.get_running_loop().create_task(warm_up(run_id))
        warming.add(warm)
        warm.add_done_callback(warming.discard)
        task, status = _text(raw_task), _text(raw_status)
        task_shown = cut(task, TASK_BYTES, "luft-redis show --json")  # (as the state has it)
        meta = f"<meta name=\"luft-run\" content=\"{run_id}\">"
        if config.allow_cancel or config.allow_fork:
            meta += f"<meta name=\"luft-csrf\" content=\"{config.csrf_token()}\">"
            allowed = " ".join(name for name, on in (("cancel", config.allow_cancel),
                                                     ("fork", config.allow_fork)) if on)
            meta += f"<meta name=\"luft-actions\" content=\"{allowed}\">"
        body = f"""
<div class="banner hidden" id="banner"></div>
<h1 id="title">{_e(one_line(task, 120)) or '(no task)'}</h1>
<p class="age" id="age">connecting…</p>
<section class="head"><dl id="head">
<dt>status</dt><dd id="status" class="st-{_e(status)}">{_e(status)}</dd>
</dl><div id="actions"></div></section>
<section><h2>Phases</h2><div id="phases"></div></section>
<section class="charts"><div><h2>Tokens over time</h2><div id="chart-tokens"></div></div>
<div><h2>Agents finished over time <span class="note" title="a retried agent is counted once,
when it first finished">(each agent once)</span></h2><div id="chart-agents"></div></div></section>
<section><h2>Agents <span id="agents-count" class="note"></span></h2>
<p class="note" id="tasks"></p>
<table class="agents stack" id="agents"><thead><tr><th>agent</th><th>phase</th>
<th>status</th><th>model</th><th>role</th><th>tokens</th><th>elapsed</th><th>retries</th>
<th>holder</th><th>attempt</th><th>lease expires</th></tr></thead><tbody></tbody></table>
<nav class="pager"><button id="agents-prev" type="button">← previous</button>
<span id="agents-page"></span><button id="agents-next" type="button">next →</button></nav>
</section>
<section><h2>Findings</h2><div id="findings"><p class="note">none yet</p></div></section>
<section><h2>History</h2><p class="note">Every version of the run: what changed, and when.
</p><ol class="log" id="history"></ol><button id="history-more" type="button">show
versions</button></section>
<section><h2>Event log</h2><p class="note hidden" id="trimmed"></p>
<button id="log-older" type="button">older events</button>
<ol class="log" id="log"></ol></section>
<details><summary>task</summary><pre id="task">{_e(task_shown)}</pre></details>
"""
        return HTMLResponse(_page(f"Run {run_id}", body, meta=meta, script=True))

    async def api_runs(request: Request) -> Response:
        status, text, page = _filter(request)
        try:
            (rows, indexed, more), counts = await asyncio.gather(
                runs.page(status, text, page), runs.status_counts())
        except CorruptDataError as exc:
            return JSONResponse({"error": str(exc)}, 500)
        except Exception as exc:
            return JSONResponse({"error": redis_problem(exc)}, 503)
        age = 0.0 if counts.exact else (time.monotonic() - counts.at if counts.at else None)
        body = {"runs": [run_row_json(r) for r in rows], "indexed": indexed, "more": more,
                "page": page, "counts": counts.counts, "counts_exact": counts.exact,
                "counts_age_s": age,
                **({"counts_problem": counts.problem} if counts.problem else {})}  # fmt: skip
        return Response(dumps(body), media_type="application/json")

    async def api_run(request: Request) -> Response:
        hub = await hub_of(request)
        if isinstance(hub, Response):
            return hub
        try:
            text = hub.state_text(_int_arg(request, "agents_page"))
        finally:
            hub.released()
        return Response(text, media_type="application/json")

    async def api_events(request: Request) -> Response:
        hub = await hub_of(request)
        if isinstance(hub, Response):
            return hub
        viewer = hub.new_viewer(_int_arg(request, "agents_page"))

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 2000\n\n"
                async for chunk in hub.messages(viewer):
                    yield chunk
            finally:
                hub.released()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})  # fmt: skip

    async def api_log(request: Request) -> Response:
        run_id = _parse_run(request)
        if run_id is None:
            return JSONResponse({"error": "not a run id"}, 404)
        before = request.query_params.get("before", "+")
        if before != "+" and not _is_entry_id(before):
            return JSONResponse({"error": "before: not a stream entry id (<ms>-<seq>)"}, 400)
        count = min(max(1, _int_arg(request, "count", LOG_PAGE)), 1000)
        if before == "0-0":  # nothing is older than the first possible id
            return Response('{"events":[],"more":false}', media_type="application/json")
        key = run_keys(config.prefix, run_id).events
        upper = before if before == "+" else f"({before}"
        try:
            page = await async_client.xrevrange(key, max=upper, min="-", count=count)
        except Exception as exc:
            return JSONResponse({"error": redis_problem(exc)}, 503)
        texts: list[str] = []
        size = 0
        try:  # every stored format (a log upgraded in flight holds two); newest first here
            for eid, event in reversed(decode_page(run_id, key, page)):
                text = event_text(eid, event)
                size += len(text.encode()) + 1
                if texts and size > PAGE_BYTES:  # the older rest: the next page
                    break
                texts.append(text)
        except LuftRedisError as exc:
            return JSONResponse({"error": str(exc)}, 500)
        more = len(texts) < len(page) or len(page) == count
        return Response(f'{{"events":[{",".join(reversed(texts))}],"more":{dumps(more)}}}',
                        media_type="application/json")  # (oldest first)

    def refused(request: Request, allowed: bool, why: str) -> Response | None:
        """The answer to a write the page may not make (its flag, CSRF token, origin)."""
        if not allowed:
            return JSONResponse({"error": why}, 403)
        given = request.headers.get("x-csrf-token", "")
        if not hmac.compare_digest(given.encode(), config.csrf_token().encode()):
            return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
        origin = request.headers.get("origin")
        if origin is not None and _host_of(origin.split("://", 1)[-1]) not in host_names:
            return JSONResponse({"error": "cross-origin request refused"}, 403)
        return None

    async def api_history(request: Request) -> Response:
        hub = await hub_of(request)
        if isinstance(hub, Response):
            return hub
        before = request.query_params.get("before", "")
        try:
            count = max(1, min(int(request.query_params.get("count", "50")), 500))
            if before and not _is_entry_id(before):
                raise ValueError(before)
        except ValueError:
            hub.released()
            return JSONResponse({"error": "before is a history id, count a number"}, 400)
        try:
            versions = await hub.backend.history(hub.run_id, start="-", count=count + 1,
                                                 end="(" + before if before else "+",
                                                 reverse=True)  # fmt: skip
        except LuftRedisError as exc:
            return JSONResponse({"error": str(exc)}, 500)
        except Exception as exc:
            return JSONResponse({"error": redis_problem(exc)}, 503)
        finally:
            hub.released()
        return Response(dumps({"versions": [version_json(v) for v in versions[:count]],
                               "more": len(versions) > count}), media_type="application/json")

    async def api_fork(request: Request) -> Response:
        no = refused(request, config.allow_fork,
                     "read-only: start luft-redis web with --allow-fork to fork runs")
        if no is not None:
            return no
        try:
            body = await request.json()
            raw: Any = body["at"] if isinstance(body, dict) else None
            at = parse_at(raw)
        except (ValueError, KeyError, LuftRedisError) as exc:
            return JSONResponse({"error": f"give {{\"at\": version, event id or time}}: {exc}"},
                                400)  # fmt: skip
        hub = await hub_of(request)
        if isinstance(hub, Response):
            return hub
        try:
            child = await hub.backend.fork_run(hub.run_id, at=at)
        except HistoryUnavailableError as exc:
            return JSONResponse({"error": str(exc)}, 409)
        except ValidationError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except Exception as exc:
            return JSONResponse({"error": f"fork failed: {exc}"}, 503)
        finally:
            hub.released()
        return JSONResponse({"run_id": str(child), "parent": str(hub.run_id), "at": str(at)}, 201)

    async def api_cancel(request: Request) -> Response:
        no = refused(request, config.allow_cancel, _READ_ONLY)
        if no is not None:
            return no
        hub = await hub_of(request)
        if isinstance(hub, Response):
            return hub
        try:
            await hub.backend.cancel()
            cp = hub.backend.get_checkpoint()
        except Exception as exc:
            return JSONResponse({"error": f"cancel failed: {exc}"}, 503)
        finally:
            hub.released()
        status = cp.status.value if cp is not None else "gone"
        return JSONResponse({"run_id": str(hub.run_id), "status": status},
                            200 if status == "cancelled" else 409)

    async def close() -> None:
        await hubs.close()
        await runs.wait_counts()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:  # a Redis that does not answer (or refuses us) never holds up the exit
            try:
                await asyncio.wait_for(close(), SHUTDOWN_TIMEOUT)
            except TimeoutError:
                logger.warning("closing the run views took over %.0f s (is Redis answering?); "
                               "stopped without waiting", SHUTDOWN_TIMEOUT)  # fmt: skip

    app = Starlette(
        routes=[
            Route("/", runs_page, methods=["GET"]),
            Route("/runs/{run_id}", run_page, methods=["GET"]),
            Route("/api/runs", api_runs, methods=["GET"]),
            Route("/api/runs/{run_id}", api_run, methods=["GET"]),
            Route("/api/runs/{run_id}/events", api_events, methods=["GET"]),
            Route("/api/runs/{run_id}/log", api_log, methods=["GET"]),
            Route("/api/runs/{run_id}/cancel", api_cancel, methods=["POST"]),
            Route("/api/runs/{run_id}/history", api_history, methods=["GET"]),
            Route("/api/runs/{run_id}/fork", api_fork, methods=["POST"]),
            *pool_routes(async_client, config.prefix, _page),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )
    app.state.hubs = hubs
    return Guard(app, config)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")
