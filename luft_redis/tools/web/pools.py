"""The web view's pools (docs/pools.md) and its Prometheus endpoint: ``/pools`` and
``/pools/{name}`` (server-rendered tables), ``/api/pools`` (JSON) and ``/metrics`` (the text
exposition format, read from Redis at each scrape, so any number of web views and workers may
run: the numbers are the stored state's, not one process's)."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ...asyncio import index as index_io
from ...asyncio.pools import list_pools, list_rate_limits, read_pool
from ...errors import CorruptDataError, LuftRedisError, ValidationError
from ...index import Counts
from ...keys import check_pool_name, run_keys
from ...limits import RateLimit
from ...pools import PoolView
from ..render import LIMIT_COLUMNS, dumps, limit_cells
from .hub import redis_problem

__all__ = ["METRICS_RUNS", "metrics_text", "pool_routes"]

METRICS_RUNS = 1000
"""Runs per pool that ``/metrics`` reports one by one (tokens, claims), at most."""

_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def metrics_text(counts: Counts, views: Sequence[PoolView],
                 claims: dict[str, tuple[int, int, int]],
                 limits: Sequence[RateLimit] = ()) -> str:  # fmt: skip
    """The Prometheus text of the runs by status, each pool's runs and tasks, each pooled
    run's tokens, claims, lapses and takeovers (``claims``: run id -> its ``lease_token``,
    ``lapses`` and ``takeovers``) and each rate limiter's counters and budget left."""
    out: list[str] = []

    def family(name: str, kind: str, help_text: str,
               samples: Sequence[tuple[dict[str, str], int]]) -> None:  # fmt: skip
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{text}}} {value}" if text else f"{name} {value}")

    family("luft_redis_runs", "gauge", "Runs in the run index, by status.",
           [({"status": s}, n) for s, n in sorted(counts.counts.items())])
    family("luft_redis_pool_runs", "gauge",
           "Runs of a pool's index, by their state there (ready, sleeping, idle, gone).",
           [({"pool": v.name, "state": state}, sum(r.state == state for r in v.runs))
            for v in views for state in ("ready", "sleeping", "idle", "gone")])  # fmt: skip
    family("luft_redis_pool_tasks", "gauge", "Agent tasks of a pool's runs, ready or leased.",
           [({"pool": v.name, "state": "ready"}, sum(r.ready for r in v.runs)) for v in views]
           + [({"pool": v.name, "state": "leased"}, sum(r.leased for r in v.runs))
              for v in views])  # fmt: skip
    family("luft_redis_pool_leases", "gauge",
           "Leases of a pool counted against its max_leases (claims' holds included).",
           [({"pool": v.name}, v.leases) for v in views if v.max_leases is not None])
    family("luft_redis_pool_max_leases", "gauge", "A pool's max_leases (pools with one).",
           [({"pool": v.name}, v.max_leases) for v in views if v.max_leases is not None])
    family("luft_redis_pool_runs_over_budget", "gauge",
           "Runs of a pool held back: total_tokens reached max_tokens.",
           [({"pool": v.name}, sum(r.over_budget for r in v.runs)) for v in views])
    family("luft_redis_run_tokens", "gauge", "A pooled run's total_tokens.",
           [({"pool": v.name, "run": str(r.run_id)}, r.total_tokens)
            for v in views for r in v.runs])  # fmt: skip
    for i, (name, help_text) in enumerate((
        ("luft_redis_run_claims_total",
         "Leases handed out in a pooled run (its last fencing token: claims and takeovers)."),
        ("luft_redis_run_lapses_total",
         "Leases of a pooled run that lapsed (found by a claim: taken over, or the task dead)."),
        ("luft_redis_run_takeovers_total",
         "Lapsed tasks of a pooled run that a claim took over."),
    )):  # fmt: skip
        family(name, "counter", help_text,
               [({"pool": v.name, "run": str(r.run_id)}, claims.get(str(r.run_id), (0, 0, 0))[i])
                for v in views for r in v.runs])  # fmt: skip
    family("luft_redis_limiter_admitted_total", "counter",
           "Claims a rate limiter admitted (net of takes given back).",
           [({"limiter": lim.name}, lim.admitted) for lim in limits])
    family("luft_redis_limiter_waits_total", "counter",
           "Claims a rate limiter made to wait (out of budget).",
           [({"limiter": lim.name}, lim.waits) for lim in limits])
    family("luft_redis_limiter_tokens_total", "counter",
           "Tokens charged to a rate limiter (reserved by claims, settled by the agents).",
           [({"limiter": lim.name}, lim.tokens) for lim in limits])
    family("luft_redis_limiter_available", "gauge",
           "What a rate limiter would admit at once now, by budget (requests, tokens).",
           [({"limiter": lim.name, "budget": budget}, int(value))
            for lim in limits for budget, value in (("requests", lim.requests_available),
                                                    ("tokens", lim.tokens_available))
            if value is not None])  # fmt: skip
    return "\n".join(out) + "\n"


_POOLS = ("pool", "runs", "ready runs", "sleeping runs", "ready tasks", "leased tasks",
          "workers", "leases / max")  # fmt: skip
_RUNS = ("run", "status", "in pool", "weight", "priority", "ready", "leased", "tokens / budget",
         "max leases")  # fmt: skip


def _row(labels: Sequence[str], cells: Sequence[object]) -> str:
    """A table row whose cells carry their column's name (the phone layout's card labels);
    ``cells`` are HTML already."""
    return "<tr>" + "".join(f"<td data-label=\"{label}\">{cell}</td>"
                            for label, cell in zip(labels, cells, strict=True)) + "</tr>"


def _table(table_id: str, labels: Sequence[str], rows: str) -> str:
    head = "".join(f"<th>{label}</th>" for label in labels)
    return (f"<table class=\"stack\" id=\"{table_id}\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def pool_routes(client: Any, prefix: str,
                page: Callable[[str, str], str]) -> list[Route]:  # fmt: skip
    """The routes of the pools pages, the JSON and ``/metrics`` on ``client`` (asyncio);
    ``page(title, body)`` wraps a page's body as the view's other pages are."""
    e = html.escape

    async def views() -> list[PoolView]:
        return [await read_pool(client, prefix, name) for name in await list_pools(client, prefix)]

    async def guarded(make: Callable[[], Awaitable[Response]], json: bool) -> Response:
        try:
            return await make()
        except LuftRedisError as exc:
            text = str(exc)
        except Exception as exc:
            text = redis_problem(exc)
        if json:
            return JSONResponse({"error": text}, 503)
        return HTMLResponse(page("Redis unreachable", f"<div class=\"banner\">{e(text)}</div>"),
                            503)  # fmt: skip

    async def pools_page(request: Request) -> Response:
        async def make() -> Response:
            found = await views()
            rows = "".join(_row(_POOLS, [
                f"<a href=\"/pools/{e(v.name)}\">{e(v.name)}</a>", len(v.runs), v.ready_runs,
                v.sleeping_runs, sum(r.ready for r in v.runs), sum(r.leased for r in v.runs),
                v.workers, "-" if v.max_leases is None else f"{v.leases} / {v.max_leases}",
            ]) for v in found)  # fmt: skip
            body = (f"<h1>Pools</h1>{_table('pools', _POOLS, rows)}"
                    + ("" if found else "<p class=\"note\">No pools here.</p>"))  # fmt: skip
            limits = await list_rate_limits(client, prefix)
            if limits:
                rows = "".join(_row(LIMIT_COLUMNS, [e(cell) for cell in limit_cells(lim)])
                               for lim in limits)  # fmt: skip
                body += f"<h2>Rate limiters</h2>{_table('limits', LIMIT_COLUMNS, rows)}"
            return HTMLResponse(page("Pools", body))

        return await guarded(make, json=False)

    async def pool_page(request: Request) -> Response:
        try:
            name = check_pool_name(request.path_params["name"])
        except ValidationError:
            return HTMLResponse(page("Not found", "<p>Not a pool name.</p>"), 404)

        async def make() -> Response:
            view = await read_pool(client, prefix, name)
            rows = "".join(_row(_RUNS, [
                f"<a href=\"/runs/{r.run_id}\">{r.run_id}</a>",
                f"<span class=\"st-{e(r.status)}\">{e(r.status)}</span>", e(r.state), r.weight,
                r.priority, r.ready, r.leased,
                f"{r.total_tokens} / {'-' if r.max_tokens is None else r.max_tokens}"
                + (" (over budget)" if r.over_budget else ""),
                "-" if r.max_leases is None else r.max_leases,
            ]) for r in view.runs)  # fmt: skip
            body = (f"<h1>Pool {e(name)}</h1><p class=\"note\">{len(view.runs)} run(s), "
                    f"{view.ready_runs} ready, {view.sleeping_runs} sleeping until a lease "
                    f"lapses</p>{_table('pool', _RUNS, rows)}")  # fmt: skip
            return HTMLResponse(page(f"Pool {name}", body))

        return await guarded(make, json=False)

    async def api_pools(request: Request) -> Response:
        async def make() -> Response:
            found = await views()
            body = [{**v.to_json(), "members": [r.to_json() for r in v.runs]} for v in found]
            limits = [lim.to_json() for lim in await list_rate_limits(client, prefix)]
            return Response(dumps({"pools": body, "limiters": limits}),
                            media_type="application/json")  # fmt: skip

        return await guarded(make, json=True)

    async def metrics(request: Request) -> Response:
        async def make() -> Response:
            counts = await index_io.read_counts(client, prefix, count=False)
            found = [await read_pool(client, prefix, name, limit=METRICS_RUNS)
                     for name in await list_pools(client, prefix)]  # fmt: skip
            claims: dict[str, tuple[int, int, int]] = {}
            ids = [r.run_id for v in found for r in v.runs]
            if ids:
                pipe = client.pipeline(transaction=False)
                for run_id in ids:
                    pipe.hmget(run_keys(prefix, run_id).run, "lease_token", "lapses", "takeovers")
                for run_id, raw in zip(ids, await pipe.execute(), strict=True):
                    nums = []
                    for field, value in zip(("lease_token", "lapses", "takeovers"), raw,
                                            strict=True):  # fmt: skip
                        if value is not None and not bytes(value).isdigit():
                            raise CorruptDataError(run_keys(prefix, run_id).run, field,
                                                   "is not a whole number")  # fmt: skip
                        nums.append(0 if value is None else int(value))
                    claims[str(run_id)] = (nums[0], nums[1], nums[2])
            limits = await list_rate_limits(client, prefix)
            return Response(metrics_text(counts, found, claims, limits),
                            media_type=_CONTENT_TYPE)  # fmt: skip

        return await guarded(make, json=True)

    return [
        Route("/pools", pools_page, methods=["GET"]),
        Route("/pools/{name}", pool_page, methods=["GET"]),
        Route("/api/pools", api_pools, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
