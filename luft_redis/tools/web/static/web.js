// luft-redis web: the run page, kept live by the server's event stream.
// Every string from the server is put in the page with textContent or setAttribute,
// never parsed as markup: agent outputs, findings and task text are untrusted.
"use strict";
(function () {
  const meta = (name) => {
    const m = document.querySelector('meta[name="' + name + '"]');
    return m ? m.getAttribute("content") : null;
  };
  const runId = meta("luft-run");
  if (!runId) return;
  const csrf = meta("luft-csrf");
  const allowed = (meta("luft-actions") || "").split(" ");
  const SVG = "http://www.w3.org/2000/svg";
  const MAX_LOG = 1000;
  const $ = (id) => document.getElementById(id);

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const k in attrs) node.setAttribute(k, String(attrs[k]));
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  function num(n) { return n === null || n === undefined ? "" : Number(n).toLocaleString("en"); }
  function secs(s) {
    if (s === null || s === undefined) return "";
    s = Math.round(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " m " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  }
  function short(n) { // a chart's tick: 950, 12k, 403k, 1.2M
    const a = Math.abs(n);
    if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1).replace(".0", "") + "M";
    if (a >= 1e4) return Math.round(n / 1e3) + "k";
    return num(n);
  }
  function when(unix) { return unix ? new Date(unix * 1000).toISOString().replace(".000", "") : ""; }
  function clock(unix) { return when(unix).slice(11, 19) + " UTC"; } // a lease lasts minutes: its time of day
  const AGENT_COLUMNS = ["agent", "phase", "status", "model", "role", "tokens", "elapsed", "retries",
    "holder", "attempt", "lease expires"];
  const TEXT_CELLS = new Set([0, 3, 4, 8]); // free text: wraps (numbers and times never do)
  const WIDE_CELLS = new Set([3, 8, 10]); // a line of their own on a phone
  const names = new Map(); // agent id -> name, from agent_started events and the agents table
  function statusClass(s) { return "st-" + String(s).replace(/[^a-z_]/g, ""); }

  let state = null;
  let agentsPage = 0;
  let source = null;
  let oldest = null;
  let skew = 0; // server clock - browser clock, seconds

  // ---------------------------------------------------------------- header
  function renderHead(s) {
    const v = s.view || {};
    const title = (s.task || "(no task)").replace(/\s+/g, " ").trim();
    $("title").textContent = title.length > 120 ? title.slice(0, 119) + "…" : title;
    $("task").textContent = s.task || "";
    const head = $("head");
    clear(head);
    const tok = v.tokens || {};
    const rows = [
      ["status", s.status, statusClass(s.status)],
      ["run", s.run_id],
      ["phase", s.current_phase],
      ["tokens", num(s.total_tokens) + " (input " + num(tok.input) + ", output " + num(tok.output) +
        ", cache read " + num(tok.cache_read) + ", cache write " + num(tok.cache_write) + ")"],
      ["elapsed", secs(v.elapsed_s)],
      ["agents", s.agents_started + " started, " + (s.agent_results.ok || 0) + " ok, " +
        (Object.keys(s.agent_results).reduce((a, k) => a + (k === "ok" ? 0 : s.agent_results[k]), 0)) + " failed"],
      ["findings", s.findings],
      ["version", v.version],
      ["events", s.events === null ? "?" : num(s.events)],
      ["log", s.log_trimmed ? "trimmed (oldest events dropped)" : "complete"],
      ["expires", v.ttl_s === null || v.ttl_s === undefined ? "no TTL" : "in " + secs(v.ttl_s)],
      ["created", s.created_at], ["updated", s.updated_at],
    ];
    if (s.parent) rows.push(["forked from", s.parent]);
    for (const [k, val, cls] of rows) {
      head.appendChild(el("dt", null, k));
      const dd = el("dd", cls || null, val);
      if (k === "status") dd.id = "status";
      head.appendChild(dd);
    }
    const actions = $("actions");
    clear(actions);
    if (csrf && allowed.includes("cancel") && s.status === "running") {
      const b = el("button", "danger", "Cancel run");
      b.id = "cancel";
      b.type = "button";
      b.addEventListener("click", cancelRun);
      actions.appendChild(b);
    }
    const trimmed = $("trimmed");
    trimmed.textContent = s.log_trimmed ? "The log was trimmed: its oldest events are gone." : "";
    trimmed.classList.toggle("hidden", !s.log_trimmed);
  }

  function renderBanner(s) {
    const v = s.view || {};
    const banner = $("banner");
    if (s.gone) {
      banner.textContent = "This run no longer exists (deleted or expired).";
    } else if (!v.redis_ok) {
      // the server's sentence: "Redis is unreachable: ..." or "Redis refused the web view's
      // client: ..."
      banner.textContent = (v.redis_error || "Redis is unreachable") +
        ". Showing the last data seen; reconnecting…";
    } else if (source === null || source.readyState !== 1) {
      banner.textContent = "Lost the connection to the web server: reconnecting…";
    } else {
      banner.textContent = "";
    }
    banner.classList.toggle("hidden", banner.textContent === "");
  }

  function renderAge() {
    if (!state) return;
    const v = state.view || {};
    const age = Math.max(0, Date.now() / 1000 + skew - (v.as_of || 0));
    const live = v.fresh && v.redis_ok && source && source.readyState === 1;
    const node = $("age");
    const finished = state.status && state.status !== "running";
    if (live && finished) node.textContent = "run " + state.status + ": nothing more will change";
    else node.textContent = live ? "live" : "not live: data as of " + secs(age) + " ago";
    node.classList.toggle("stale", !live);
    node.classList.toggle("final", live && finished);
  }

  // ---------------------------------------------------------------- phases, charts
  function bar(p) {
    const total = Math.max(p.planned, p.ok + p.failed + p.running, 1);
    const W = 400, H = 14;
    const box = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, class: "bar" });
    box.appendChild(svg("rect", { x: 0, y: 0, width: W, height: H, class: "bar-bg" }));
    let x = 0;
    for (const [k, cls] of [["ok", "bar-ok"], ["failed", "bar-failed"], ["running", "bar-running"]]) {
      const w = W * p[k] / total;
      if (w > 0) box.appendChild(svg("rect", { x: x, y: 0, width: w, height: H, class: cls }));
      x += w;
    }
    return box;
  }
  function renderPhases(v) {
    const box = $("phases");
    clear(box);
    if (!v.phases || !v.phases.length) { box.appendChild(el("p", "note", "no phase yet")); return; }
    for (const p of v.phases) {
      const row = el("div", "phase");
      row.appendChild(el("span", "phase-label", "phase " + p.phase_id + " " + (p.label || "")));
      row.appendChild(bar(p));
      row.appendChild(el("span", "phase-count", p.ok + " ok, " + p.failed + " failed, " + p.running +
        " running of " + p.planned + " planned"));
      box.appendChild(row);
    }
  }
  function chart(target, points, label) {
    const box = $(target);
    clear(box);
    if (!points || !points.length) { box.appendChild(el("p", "note", "nothing yet")); return; }
    const W = 420, H = 140, P = 40;
    const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1);
    const ymax = Math.max(points[points.length - 1][1], 1);
    const xs = (t) => P + (W - 2 * P) * (t - t0) / (t1 - t0);
    const ys = (y) => H - P + (-(H - 2 * P) * y / ymax);
    const s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, class: "chart",
      role: "img", "aria-label": label });
    s.appendChild(svg("line", { x1: P, y1: H - P, x2: W - P, y2: H - P, class: "axis" }));
    s.appendChild(svg("line", { x1: P, y1: P, x2: P, y2: H - P, class: "axis" }));
    let d = "";
    let prev = 0;
    for (const [t, y] of points) { d += (d ? " " : "") + xs(t).toFixed(1) + "," + ys(prev).toFixed(1) +
      " " + xs(t).toFixed(1) + "," + ys(y).toFixed(1); prev = y; }
    s.appendChild(svg("polyline", { points: d, class: "line" }));
    // ticks: 0, the middle and the end of each axis, each where its label's value is (the
    // middle rounded as its label shows it; left out when it reads as an end)
    const span = t1 - t0, half = ymax / 2;
    const ystep = half >= 1e7 ? 1e6 : half >= 1e6 ? 1e5 : half >= 1e4 ? 1e3 : 1;
    const ymid = Math.round(half / ystep) * ystep;
    const xmid = span / 2 >= 3600 ? Math.round(span / 120) * 60 : Math.round(span / 2);
    const yticks = [0, ymid, ymax], xticks = [0, xmid, span];
    yticks.forEach((value, i) => {
      if (i === 1 && (short(value) === short(0) || short(value) === short(ymax))) return;
      const y = ys(value);
      s.appendChild(svg("line", { x1: P - 4, y1: y, x2: P, y2: y, class: "axis" }));
      const label = svg("text", { x: P - 6, y: y + 3, class: "tick end" });
      label.textContent = short(value); s.appendChild(label);
    });
    xticks.forEach((value, i) => {
      if (i === 1 && (secs(value) === secs(0) || secs(value) === secs(span))) return;
      const x = xs(t0 + value);
      s.appendChild(svg("line", { x1: x, y1: H - P, x2: x, y2: H - P + 4, class: "axis" }));
      const label = svg("text", { x: x, y: H - P + 16, class: ["tick", "tick mid", "tick end"][i] });
      label.textContent = secs(value); s.appendChild(label);
    });
    box.appendChild(s);
  }

  // ---------------------------------------------------------------- agents, findings
  function renderAgents(v) {
    const body = $("agents").tBodies[0];
    clear(body);
    for (const a of v.agents || []) {
      const tr = el("tr");
      tr.dataset.agent = a.agent_id;
      if (a.name) names.set(a.agent_id, a.name);
      const tb = a.token_breakdown;
      const cells = [
        a.name || a.agent_id.slice(0, 8), a.phase_id, a.status, a.model || "", a.role || "",
        a.tokens === null ? (tb ? num(tb.input + tb.output) : "") : num(a.tokens),
        secs(a.elapsed_s), a.retries || 0, a.holder || "", a.attempt === null ? "" : a.attempt,
        a.lease_expires_at ? clock(a.lease_expires_at) + (a.lease_state === "lapsed" ? " (lapsed)" : "") : "",
      ];
      cells.forEach((c, i) => {
        const td = el("td", i === 2 ? statusClass(c) : null, c);
        if (TEXT_CELLS.has(i)) td.classList.add("text");
        if (WIDE_CELLS.has(i)) td.classList.add("wide");
        td.dataset.label = AGENT_COLUMNS[i];
        if (i === 0) td.title = a.agent_id;
        if (i === 10 && a.lease_expires_at) td.title = when(a.lease_expires_at);
        tr.appendChild(td);
      });
      body.appendChild(tr);
    }
    $("agents-count").textContent = "(" + num(v.agents_total) + ")";
    const t = v.tasks || {};
    const total = ["ready", "leased", "done", "dead"].reduce((n, k) => n + (t[k] || 0), 0);
    $("tasks").textContent = total ? "tasks: " + num(t.ready) + " ready (waiting for a worker), " +
      num(t.leased) + " leased" + (t.lapsed ? " (" + num(t.lapsed) + " lapsed)" : "") + ", " +
      num(t.done) + " done, " + num(t.dead) + " dead" : "";
    $("agents-page").textContent = "page " + (v.agents_page + 1) + " of " + v.agents_pages;
    $("agents-prev").disabled = v.agents_page <= 0;
    $("agents-next").disabled = v.agents_page + 1 >= v.agents_pages;
  }
  function renderFindings(v) {
    const box = $("findings");
    clear(box);
    if (!v.findings || !v.findings.length) { box.appendChild(el("p", "note", "none yet")); return; }
    for (const g of v.findings) {
      const sec = el("div", "sev sev-" + g.severity.replace(/[^a-z]/g, ""));
      sec.appendChild(el("h3", null, g.severity + " (" + g.count + ")"));
      const ul = el("ul", "findings");
      for (const f of g.items) {
        const li = el("li", "finding");
        li.appendChild(el("span", "kind", f.kind));
        li.appendChild(el("strong", "title", f.title));
        if (f.location) li.appendChild(el("code", "loc", f.location));
        if (f.detail) li.appendChild(el("div", "detail", f.detail));
        ul.appendChild(li);
      }
      sec.appendChild(ul);
      box.appendChild(sec);
    }
  }

  // ---------------------------------------------------------------- the log
  function evTime(e) {
    // the event's own time, else its append's (the stream entry id's milliseconds), UTC
    const iso = e.ts || new Date(Number(String(e.id).split("-")[0])).toISOString();
    return iso.slice(11, 23);
  }
  function agentName(id) { return names.get(id) || String(id).slice(0, 8); }
  function nameAgents() {
    // log lines drawn before their agent's name was known (its agent_started is older than
    // the log shown): named once the agents table or a later event tells it
    for (const span of document.querySelectorAll("#log .ev-agent.unnamed")) {
      const name = names.get(span.dataset.agent);
      if (name) { span.textContent = "agent=" + name; span.classList.remove("unnamed"); }
    }
  }
  function eventText(e) {
    const skip = new Set(["id", "type", "run_id", "ts", "v", "agent_id", "name"]);
    const parts = [];
    for (const k in e) {
      if (skip.has(k)) continue;
      let val = e[k];
      if (val === null || val === undefined || val === "") continue;
      if (typeof val === "object") val = JSON.stringify(val);
      val = String(val);
      if (val.length > 300) val = val.slice(0, 299) + "…";
      parts.push(k + "=" + val);
    }
    return parts.join(" ");
  }
  function logLine(e) {
    const li = el("li", "ev ev-" + String(e.type).replace(/[^a-z_]/g, ""));
    li.dataset.id = e.id;
    if (e.agent_id && e.name) names.set(e.agent_id, e.name);
    li.title = "entry " + e.id + (e.ts ? ", " + e.ts : "") + (e.agent_id ? ", agent " + e.agent_id : "");
    li.appendChild(el("span", "ev-id", evTime(e)));
    li.appendChild(el("span", "ev-type", e.type));
    if (e.agent_id) {
      const agent = el("span", "ev-agent" + (names.has(e.agent_id) ? "" : " unnamed"),
        "agent=" + agentName(e.agent_id));
      agent.dataset.agent = e.agent_id;
      li.appendChild(agent);
    }
    li.appendChild(el("span", "ev-text", eventText(e)));
    return li;
  }
  function addEvents(events) {
    const log = $("log");
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    for (const e of events) {
      log.appendChild(logLine(e));
      if (oldest === null) oldest = e.id;
    }
    while (log.childNodes.length > MAX_LOG) { log.removeChild(log.firstChild); oldest = log.firstChild.dataset.id; }
    if (atBottom) log.scrollTop = log.scrollHeight;
    nameAgents();
    updateOlder();
  }
  let noneOlder = false; // the log API said there is nothing before the oldest shown
  function updateOlder() {
    const shown = $("log").childNodes.length;
    const all = state && state.events !== null && state.events !== undefined ? state.events : null;
    $("log-older").disabled = noneOlder || (all !== null && shown >= all);
  }
  async function olderEvents() {
    const before = oldest === null ? "+" : oldest;
    const r = await fetch("/api/runs/" + runId + "/log?before=" + encodeURIComponent(before) + "&count=200",
      { credentials: "same-origin" });
    if (!r.ok) return;
    const body = await r.json();
    const log = $("log");
    const first = log.firstChild;
    for (const e of body.events) log.insertBefore(logLine(e), first);
    if (body.events.length) oldest = body.events[0].id;
    noneOlder = !body.more;
    nameAgents();
    updateOlder();
  }

  // ---------------------------------------------------------------- actions
  async function cancelRun() {
    const b = $("cancel");
    if (b) b.disabled = true;
    const r = await fetch("/api/runs/" + runId + "/cancel", {
      method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf },
    });
    if (!r.ok && b) { b.disabled = false; b.textContent = "Cancel failed (" + r.status + ")"; }
  }

  // ---------------------------------------------------------------- history
  let historyBefore = null;
  async function loadHistory() {
    const more = $("history-more");
    more.disabled = true;
    const q = "?count=20" + (historyBefore ? "&before=" + encodeURIComponent(historyBefore) : "");
    const r = await fetch("/api/runs/" + runId + "/history" + q, { credentials: "same-origin" });
    const body = r.ok ? await r.json() : null;
    more.disabled = false;
    if (!body) { more.textContent = "history unavailable (" + r.status + "): retry"; return; }
    const list = $("history");
    for (const v of body.versions) list.appendChild(versionLine(v));
    if (body.versions.length) historyBefore = body.versions[body.versions.length - 1].id;
    more.textContent = "older versions";
    more.classList.toggle("hidden", !body.more);
  }
  function versionLine(v) {
    const li = el("li", null, "v" + v.version + "  " + v.time + "  " + v.op + "  " +
      (v.changes.join(", ") || "-"));
    li.dataset.version = String(v.version);
    if (csrf && allowed.includes("fork")) {
      const b = el("button", null, "fork from here");
      b.type = "button";
      b.addEventListener("click", () => forkAt(v.version, b));
      li.appendChild(b);
    }
    return li;
  }
  async function forkAt(version, b) {
    b.disabled = true;
    const r = await fetch("/api/runs/" + runId + "/fork", {
      method: "POST", credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf, "Content-Type": "application/json" },
      body: JSON.stringify({ at: version }),
    });
    const body = await r.json().catch(() => ({}));
    if (r.ok && body.run_id) { window.location.href = "/runs/" + body.run_id; return; }
    b.disabled = false;
    b.textContent = "fork failed (" + r.status + "): " + (body.error || "");
  }

  // ---------------------------------------------------------------- the stream
  function onState(s) {
    state = s;
    if (s.view && s.view.server_time) skew = s.view.server_time - Date.now() / 1000;
    renderBanner(s);
    if (s.gone) { renderAge(); return; }
    const v = s.view;
    renderHead(s);
    renderPhases(v);
    chart("chart-tokens", v.chart.tokens, "tokens over time");
    chart("chart-agents", v.chart.agents, "agents finished over time");
    renderAgents(v);
    nameAgents();
    renderFindings(v);
    renderAge();
    updateOlder();
    document.body.dataset.version = String(v.version);
  }
  function connect() {
    if (source) source.close();
    source = new EventSource("/api/runs/" + runId + "/events?agents_page=" + agentsPage);
    source.addEventListener("state", (m) => onState(JSON.parse(m.data)));
    source.addEventListener("event", (m) => addEvents([JSON.parse(m.data)]));
    source.addEventListener("skipped", () => addEvents([]));
    source.addEventListener("open", () => {
      // each (re)connection starts with the newest events again: start the log afresh
      clear($("log"));
      oldest = null;
      noneOlder = false;
      updateOlder();
      if (state) renderBanner(state);
      renderAge();
    });
    source.addEventListener("error", () => {
      if (state) renderBanner(state); else { $("banner").textContent = "Cannot reach the web server: retrying…"; $("banner").classList.remove("hidden"); }
      renderAge();
    });
  }
  $("agents-prev").addEventListener("click", () => { agentsPage = Math.max(0, agentsPage - 1); connect(); });
  $("agents-next").addEventListener("click", () => { agentsPage += 1; connect(); });
  $("log-older").addEventListener("click", olderEvents);
  $("history-more").addEventListener("click", loadHistory);
  setInterval(renderAge, 1000);
  connect();
})();
