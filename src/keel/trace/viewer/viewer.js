/* keel trace viewer: the timeline, the ledger, the inspector, the cache-break detector and cost
   attribution over one trace (format v1, docs/traces.md). No dependencies, no external requests.
   Record content only ever reaches the page through textContent or attribute values, never as
   markup. Requests are rebuilt here from the delta records: the full message list of request R
   of agent A = (reset ? [] : the full list of A's previous request) + R's new messages. */
"use strict";
(function () {
  const IDLE_S = 1.5;      // a quiet stretch longer than this is drawn as a fixed-width gap
  const GAP_PX = 28;
  const LANE_H = 30;
  const BODY_SHOW = 200000; // characters of a body shown before "show all"

  const S = {
    records: [], bySeq: new Map(), agents: new Map(), agentOrder: [],
    reqs: new Map(), reqOrder: [], lastReq: new Map(), systems: new Map(), toolsets: new Map(),
    tools: new Map(), perms: new Map(), httpByReq: new Map(), compactions: [],
    selected: null, t0: null, tEnd: null, live: false, bodies: {}, lastSeq: 0,
    scale: null, follow: true, collapse: true, dirty: true, lastDrawn: 0,
    kinds: new Set(), visible: [], kindOptions: new Set(), batch: null,
  };

  // ---------------------------------------------------------------- small helpers
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    if (attrs) for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "onclick") el.addEventListener("click", v);
      else if (k === "style") el.style.cssText = v; // CSSOM, which the page's CSP allows
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === undefined || kid === null || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  const $ = (sel) => document.querySelector(sel);
  const num = (v) => (typeof v === "number" && isFinite(v) ? v : 0);
  const fmtInt = (v) => num(v).toLocaleString("en-US");
  function fmtMs(ms) {
    if (ms === undefined || ms === null) return "–";
    ms = num(ms);
    return ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : Math.round(ms) + " ms";
  }
  function fmtCost(c) { return c === undefined || c === null ? "–" : "$" + num(c).toFixed(c >= 1 ? 2 : 4); }
  function fmtRel(t) {
    if (S.t0 === null) return "";
    const s = Math.max(0, t - S.t0);
    const m = Math.floor(s / 60);
    return (m ? m + ":" + String(Math.floor(s % 60)).padStart(2, "0") : Math.floor(s % 60)) +
      "." + String(Math.floor((s % 1) * 1000)).padStart(3, "0");
  }
  function short(s, n) {
    s = String(s === undefined || s === null ? "" : s).replace(/\s+/g, " ").trim();
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }
  function pretty(v) { return typeof v === "string" ? v : JSON.stringify(v, null, 2); }
  function agentName(key) {
    // An agent is (label, parent): two subagents of one type started by two `task` calls are
    // two lanes. They are told apart by the description their `task` call gave.
    if (key === "") return "main";
    const a = S.agents.get(key);
    if (!a) return key;
    const call = a.parentTool ? S.tools.get(a.parentTool) : null;
    const desc = call && call.start && call.start.data.input ? call.start.data.input.description : "";
    return a.label + (desc ? ": " + desc : a.parentTool ? " (" + a.parentTool + ")" : "");
  }
  function strings(v, out) {
    if (typeof v === "string") out.push(v);
    else if (Array.isArray(v)) v.forEach((x) => strings(x, out));
    else if (v && typeof v === "object") for (const [k, x] of Object.entries(v)) {
      if (k === "data" && typeof x === "string" && x.length > 2000) continue; // image bytes
      strings(x, out);
    }
    return out;
  }
  function blockText(b) {
    if (!b || typeof b !== "object") return "";
    if (b.type === "text" || b.type === "thinking") return b.text || "";
    if (b.type === "tool_use") return JSON.stringify(b.input);
    if (b.type === "tool_result") return (b.content || []).map(blockText).join("\n");
    return "";
  }
  function msgChars(m) { return (m.content || []).reduce((n, b) => n + blockText(b).length, 0); }

  // ---------------------------------------------------------------- ingest
  function agent(name, rec) {
    let a = S.agents.get(name);
    if (!a) {
      a = { name, label: rec.agent, parentTool: rec.parent || "", children: [], collapsed: false, first: S.records.length };
      S.agents.set(name, a);
      S.agentOrder.push(name);
    }
    return a;
  }

  function ingest(rec) {
    if (!rec || typeof rec.seq !== "number" || S.bySeq.has(rec.seq)) return;
    rec.agent = rec.agent || "";
    rec.lane = rec.agent || rec.parent ? rec.agent + "\u2009@" + (rec.parent || "") : "";
    rec.data = rec.data && typeof rec.data === "object" ? rec.data : {};
    S.records.push(rec);
    S.bySeq.set(rec.seq, rec);
    S.lastSeq = Math.max(S.lastSeq, rec.seq);
    if (typeof rec.t === "number") {
      if (S.t0 === null || rec.t < S.t0) S.t0 = rec.t;
      S.tEnd = Math.max(S.tEnd || rec.t, rec.t);
    }
    agent(rec.lane, rec);
    S.kinds.add(rec.kind);
    const d = rec.data;
    switch (rec.kind) {
      case "request": ingestRequest(rec); break;
      case "response": {
        const info = S.reqs.get(rec.req);
        if (info) info.response = rec;
        break;
      }
      case "http": {
        if (!S.httpByReq.has(rec.req)) S.httpByReq.set(rec.req, []);
        S.httpByReq.get(rec.req).push(rec);
        break;
      }
      case "tool_start": S.tools.set(d.id, { start: rec, end: null }); break;
      case "tool_end": {
        const t = S.tools.get(d.id);
        if (t) t.end = rec; else S.tools.set(d.id, { start: null, end: rec });
        break;
      }
      case "permission": if (d.tool_use_id) S.perms.set(d.tool_use_id, rec); break;
      case "compaction": S.compactions.push(rec); break;
    }
    rec.search = strings(d, [rec.kind, rec.agent || "main"]).join("\n").toLowerCase();
    addRow(rec);
  }

  function ingestRequest(rec) {
    const d = rec.data;
    if (typeof d.system === "string") S.systems.set(d.system_hash, d.system);
    if (Array.isArray(d.tools)) S.toolsets.set(d.tools_hash, d.tools);
    const prev = S.lastReq.get(rec.lane) || null;
    if (typeof d.system_hash !== "string") {
      // The request itself was not recorded (only its model and purpose): it changes nothing
      // the next request is compared with.
      const info = { req: rec.req, rec, agent: rec.lane, full: prev ? prev.full : [], newStart: prev ? prev.full.length : 0, prev, response: null, brk: null, opaque: true };
      S.reqs.set(rec.req, info);
      S.reqOrder.push(info);
      return;
    }
    const base = d.reset || !prev ? [] : prev.full;
    const full = base.concat(Array.isArray(d.messages) ? d.messages : []);
    const info = { req: rec.req, rec, agent: rec.lane, full, newStart: base.length, prev,
      response: null, brk: null };
    if (typeof d.messages_total === "number" && d.messages_total !== full.length)
      info.mismatch = `the trace says ${d.messages_total} messages, the rebuild has ${full.length}`;
    info.brk = cacheBreak(info);
    S.reqs.set(rec.req, info);
    S.reqOrder.push(info);
    S.lastReq.set(rec.lane, info);
  }

  // ---------------------------------------------------------------- cache-break detector
  function firstDiff(a, b) {
    a = a || ""; b = b || "";
    const n = Math.min(a.length, b.length);
    let i = 0;
    while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
    if (i === n && a.length === b.length) return null;
    const line = a.slice(0, i).split("\n").length;
    return { index: i, line };
  }
  function cacheBreak(info) {
    // The baseline is the agent's previous request of the same purpose: a compaction request is
    // a side call with a cache of its own, and the turn after it still finds the turn prefix
    // (system prompt, tools) warm. A break is a prefix that no longer matches what was sent:
    // another system prompt, another tool list, or earlier messages changed or dropped. A
    // `reset` whose earlier messages are all still there (a reopened trace) breaks nothing.
    const d = info.rec.data, purpose = d.purpose || "turn";
    let prev = info.prev;
    while (prev && (prev.opaque || (prev.rec.data.purpose || "turn") !== purpose)) prev = prev.prev;
    if (!prev) return null;
    const p = prev.rec.data;
    const reasons = [];
    if (d.system_hash !== p.system_hash) {
      const f = firstDiff(S.systems.get(p.system_hash), S.systems.get(d.system_hash));
      reasons.push({ what: "system prompt", where: f ? `character ${f.index} (line ${f.line})` : "its text is not in the trace" });
    }
    if (d.tools_hash !== p.tools_hash) {
      const a = S.toolsets.get(p.tools_hash) || [], b = S.toolsets.get(d.tools_hash) || [];
      let i = 0;
      while (i < Math.min(a.length, b.length) && JSON.stringify(a[i]) === JSON.stringify(b[i])) i++;
      const name = (b[i] || a[i] || {}).name || "";
      reasons.push({ what: "tool list", where: `tool ${i + 1}${name ? " (" + name + ")" : ""}` });
    }
    let i = 0;
    while (i < Math.min(prev.full.length, info.full.length) &&
           JSON.stringify(prev.full[i]) === JSON.stringify(info.full[i])) i++;
    if (i < prev.full.length) reasons.push({ what: "messages", where: `message ${i + 1} of the ${prev.full.length} sent before${d.reset ? " (reset)" : ""}` });
    if (!reasons.length) return null;
    const compacted = S.compactions.some((c) => c.lane === info.agent && c.t >= prev.rec.t && c.t <= info.rec.t);
    const onlyMessages = reasons.every((r) => r.what === "messages");
    return { reasons, prev, expected: compacted && onlyMessages ? "after a compaction" : "" };
  }

  // ---------------------------------------------------------------- the ledger
  function summary(rec) {
    const d = rec.data;
    switch (rec.kind) {
      case "session": return `${d.model || ""} · ${d.cwd || ""}${d.reopened ? " · reopened" : ""}`;
      case "turn_start": return short(d.prompt, 160);
      case "turn_end": return `${d.stop_reason || ""} · ${fmtCost(d.cost)}${d.error ? " · " + d.error : ""}`;
      case "request": {
        const info = S.reqs.get(rec.req);
        const msgs = Array.isArray(d.messages) ? d.messages.length : 0;
        return `#${rec.req} ${d.model || ""} · ${d.purpose || "turn"} · +${msgs}/${d.messages_total ?? (info ? info.full.length : "?")} messages${d.reset ? " · reset" : ""}`;
      }
      case "response": {
        const u = d.usage || {};
        const text = ((d.message || {}).content || []).map(blockText).join(" ");
        return `#${rec.req} ${d.stop_reason || ""} · in ${fmtInt(u.input)} out ${fmtInt(u.output)} read ${fmtInt(u.cache_read)} write ${fmtInt(u.cache_write)} · ttft ${fmtMs(d.ttft_ms)} · ${fmtCost(d.cost)} · ${short(text, 80)}`;
      }
      case "http": return `${d.method || ""} ${d.status ?? (d.error ? "error" : "")} ${d.url || ""} · ${fmtMs(d.duration_ms)}${d.error ? " · " + d.error : ""}`;
      case "tool_start": return `${d.name} ${short(JSON.stringify(d.input), 140)}`;
      case "tool_end": return `${d.name}${d.is_error ? " ✗" : ""} · ${fmtMs(num(d.seconds) * 1000)} · ${short(d.output, 120)}`;
      case "permission": return `${d.tool} ${d.allow ? "allowed" : "denied"} by ${d.by}${d.scope ? " (" + d.scope + ")" : ""} · waited ${fmtMs(d.waited_ms)} · ${short(d.reason, 80)}`;
      case "hook": return `${d.event} ${d.target || ""} · exit ${d.exit_code} · ${fmtMs(d.duration_ms)}${d.blocked ? " · blocked" : ""}${d.halted ? " · halted" : ""}`;
      case "compaction": return `${d.trigger || ""} · ${fmtInt(d.tokens_before)} → ${fmtInt(d.tokens_after)} tokens`;
      case "spend": return `${d.agent || ""} ${d.status || ""} · ${fmtCost(d.cost)} · tree ${fmtCost(d.tree_cost)}`;
      case "notice": return `${d.level || ""} ${d.message || ""}`;
      case "error": return d.message || "";
      default: return short(JSON.stringify(d), 160);
    }
  }

  function addRow(rec) {
    const info = rec.kind === "request" ? S.reqs.get(rec.req) : null;
    const brk = info && info.brk;
    const tr = h("tr", { "data-seq": rec.seq, "data-kind": rec.kind, "data-agent": rec.lane,
      class: brk ? "cache-break" + (brk.expected ? " expected" : "") : "" },
      h("td", null, rec.seq),
      h("td", null, fmtRel(rec.t)),
      h("td", null, agentName(rec.lane)),
      h("td", null, h("span", { class: "kind " + rec.kind }, rec.kind)),
      h("td", { class: "sum" },
        brk ? h("span", { class: "badge brk" + (brk.expected ? " expected" : "") }, brk.expected ? "cache break (expected)" : "cache break") : null,
        rec.kind === "permission" && !rec.data.allow ? h("span", { class: "badge deny" }, "denied") : null,
        " ", summary(rec)));
    tr.addEventListener("click", () => select(rec.seq, { scroll: false }));
    rec.row = tr;
    // Rows of one batch go in together, filtered once each (a long trace loads in one pass).
    tr.hidden = !matches(rec, S.batch.f);
    if (!tr.hidden) S.visible.push(rec);
    S.batch.rows.append(tr);
    if (!S.kindOptions.has(rec.kind)) {
      S.kindOptions.add(rec.kind);
      $("#filter-kind").append(h("option", { value: rec.kind }, rec.kind));
    }
    if (!S.agentOptions) S.agentOptions = new Map();
    if (!S.agentOptions.has(rec.lane)) {
      const opt = h("option", { value: "=" + rec.lane, "data-agent": rec.lane }, agentName(rec.lane));
      S.agentOptions.set(rec.lane, opt);
      $("#filter-agent").append(opt);
    }
  }

  function filterState() {
    return {
      terms: $("#search").value.toLowerCase().split(/\s+/).filter(Boolean),
      kind: $("#filter-kind").value,
      agent: $("#filter-agent").value,
      breaks: $("#filter-breaks").checked,
    };
  }
  function matches(rec, f) {
    if (f.kind && rec.kind !== f.kind) return false;
    if (f.agent && "=" + rec.lane !== f.agent) return false;
    if (f.breaks && !(rec.kind === "request" && S.reqs.get(rec.req) && S.reqs.get(rec.req).brk)) return false;
    return f.terms.every((t) => rec.search.includes(t));
  }
  function applyFilter() {
    const f = filterState();
    for (const rec of S.records) rec.row.hidden = !matches(rec, f);
    S.visible = S.records.filter((r) => !r.row.hidden);
    showCount();
  }
  function showCount() { $("#ledger-count").textContent = `${S.visible.length} of ${S.records.length}`; }

  // ---------------------------------------------------------------- selection and keys
  function select(seq, opts) {
    const rec = S.bySeq.get(seq);
    if (!rec) return;
    if (S.selected !== null && S.bySeq.get(S.selected)) S.bySeq.get(S.selected).row.classList.remove("sel");
    S.selected = seq;
    rec.row.classList.add("sel");
    if (!opts || opts.scroll !== false) rec.row.scrollIntoView({ block: "nearest" });
    showTab("inspector");
    renderInspector(rec);
    markTimelineSelection();
  }
  function move(delta) {
    const vis = S.visible;
    if (!vis.length) return;
    let i = vis.findIndex((r) => r.seq === S.selected);
    i = i < 0 ? (delta > 0 ? 0 : vis.length - 1) : Math.max(0, Math.min(vis.length - 1, i + delta));
    select(vis[i].seq);
  }
  function showTab(name) {
    document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("on", b.dataset.tab === name));
    document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("on", t.id === name));
    if (name === "breaks") renderBreaks();
    if (name === "costs") renderCosts();
  }
  function onKey(e) {
    const typing = e.target instanceof HTMLInputElement || e.target instanceof HTMLSelectElement;
    if (typing) {
      if (e.key === "Escape") { $("#search").value = ""; applyFilter(); $("#ledger-scroll").focus(); }
      else if (e.key === "Enter" && e.target.id === "search") { $("#ledger-scroll").focus(); if (S.visible.length) select(S.visible[0].seq); }
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    switch (e.key) {
      case "j": case "ArrowDown": move(1); break;
      case "k": case "ArrowUp": move(-1); break;
      case "Enter": if (S.selected !== null) { showTab("inspector"); $("#inspector").focus(); } else move(1); break;
      case "/": $("#search").focus(); break;
      case "Escape": $("#ledger-scroll").focus(); break;
      case "+": case "=": zoom(1.5); break;
      case "-": zoom(1 / 1.5); break;
      case "0": S.scale = null; draw(); break;
      case "i": $("#collapse-idle").checked = !$("#collapse-idle").checked; S.collapse = $("#collapse-idle").checked; draw(); break;
      case "f": $("#follow-live").checked = !$("#follow-live").checked; S.follow = $("#follow-live").checked; break;
      case "b": {
        const breaks = S.reqOrder.filter((i) => i.brk);
        const cur = S.bySeq.get(S.selected);
        const next = breaks.find((i) => !cur || i.rec.seq > cur.seq) || breaks[0];
        if (next) select(next.rec.seq);
        break;
      }
      default: return;
    }
    e.preventDefault();
  }

  // ---------------------------------------------------------------- the timeline
  function laneTree() {
    // A subagent's lane goes under the lane of the agent whose `task` call started it.
    for (const a of S.agents.values()) a.children = [];
    const roots = [];
    for (const name of S.agentOrder) {
      const a = S.agents.get(name);
      const call = a.parentTool ? S.tools.get(a.parentTool) : null;
      const parentName = call && call.start ? call.start.lane : (a.parentTool ? "" : null);
      a.parentAgent = name === "" ? null : parentName;
      const parent = a.parentAgent !== null && a.parentAgent !== name ? S.agents.get(a.parentAgent) : null;
      if (parent) parent.children.push(a); else roots.push(a);
    }
    const rows = [];
    const walk = (a, depth, hiddenBy) => {
      a.depth = depth;
      if (!hiddenBy) rows.push(a);
      a.children.forEach((c) => walk(c, depth + 1, hiddenBy || a.collapsed));
    };
    roots.sort((x, y) => (x.name === "" ? -1 : y.name === "" ? 1 : x.first - y.first)).forEach((a) => walk(a, 0, false));
    return rows;
  }

  function items() {
    const out = [];
    const now = S.tEnd || 0;
    for (const info of S.reqOrder) {
      const r = info.response, t = info.rec.t;
      const dur = r ? num(r.data.duration_ms) / 1000 : Math.max(0, now - t);
      const ttft = r && r.data.ttft_ms !== undefined ? num(r.data.ttft_ms) / 1000 : dur;
      out.push({ type: "req", agent: info.agent, a: t, b: t + dur, ttft: Math.min(ttft, dur), seq: info.rec.seq, info });
    }
    for (const [, tl] of S.tools) {
      const s = tl.start, e = tl.end;
      const rec = s || e;
      // A call refused before it ran has no start record and `started_at` 0.
      const a = e && num(e.data.started_at) > 0 ? e.data.started_at : s ? s.t : rec.t - num(e && e.data.seconds);
      const b = e ? a + num(e.data.seconds) : now;
      out.push({ type: "tool", agent: rec.lane, a, b, seq: rec.seq, err: e && e.data.is_error, name: rec.data.name });
    }
    for (const rec of S.records) {
      const d = rec.data;
      if (rec.kind === "permission") out.push({ type: "perm", agent: rec.lane, a: rec.t - num(d.waited_ms) / 1000, b: rec.t, seq: rec.seq });
      else if (rec.kind === "hook") {
        const a = num(d.started_at) > 0 ? d.started_at : rec.t - num(d.duration_ms) / 1000;
        out.push({ type: "hook", agent: rec.lane, a, b: a + num(d.duration_ms) / 1000, seq: rec.seq });
      }
      else if (["turn_start", "compaction", "notice", "error"].includes(rec.kind))
        out.push({ type: "mark", kind: rec.kind === "turn_start" ? "turn" : rec.kind, agent: rec.lane, a: rec.t, b: rec.t, seq: rec.seq });
    }
    return out;
  }

  function timeMap(list) {
    // Piecewise-linear time axis: busy stretches at `scale` px/s, long idle ones squeezed.
    const spans = list.map((i) => [i.a, Math.max(i.b, i.a + 0.05)]).sort((x, y) => x[0] - y[0]);
    const merged = [];
    for (const [a, b] of spans) {
      const last = merged[merged.length - 1];
      if (last && a <= last[1] + (S.collapse ? IDLE_S : Infinity)) last[1] = Math.max(last[1], b);
      else merged.push([a, b]);
    }
    const busy = merged.reduce((n, [a, b]) => n + (b - a), 0) || 1;
    const width = Math.max(200, $("#lanes-scroll").clientWidth - 20);
    const gaps = Math.max(0, merged.length - 1);
    if (S.scale === null) S.fitScale = Math.max(1e-3, (width - gaps * GAP_PX) / busy);
    const scale = S.scale === null ? S.fitScale : S.scale;
    const segs = [];
    let x = 4;
    merged.forEach(([a, b], i) => {
      if (i > 0) { const pa = merged[i - 1][1]; segs.push({ a: pa, b: a, x, w: GAP_PX, gap: true }); x += GAP_PX; }
      segs.push({ a, b, x, w: (b - a) * scale, gap: false });
      x += (b - a) * scale;
    });
    const xOf = (t) => {
      if (!segs.length) return 0;
      let lo = 0, hi = segs.length - 1;
      while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (segs[mid].a <= t) lo = mid; else hi = mid - 1; }
      const s = segs[lo];
      if (t <= s.a) return s.x;
      if (s.gap) return s.x + Math.min(1, (t - s.a) / (s.b - s.a || 1)) * s.w;
      return s.x + Math.min(t - s.a, s.b - s.a) * scale + Math.max(0, t - s.b) * scale;
    };
    return { segs, xOf, total: x + 40, scale };
  }

  function draw() {
    S.dirty = false;
    const rows = laneTree();
    const list = items();
    const tm = timeMap(list);
    const names = $("#lane-names"), lanes = $("#lanes");
    names.replaceChildren();
    lanes.replaceChildren();
    lanes.style.width = tm.total + "px";
    lanes.style.height = rows.length * LANE_H + "px";
    for (const s of tm.segs) if (s.gap)
      lanes.append(h("div", { class: "gap", style: `left:${s.x}px;width:${s.w}px`, title: `${(s.b - s.a).toFixed(1)} s idle` }, h("span", null, `${(s.b - s.a).toFixed(0)}s`)));
    const laneIndex = new Map();
    rows.forEach((a, i) => {
      laneIndex.set(a.name, i);
      const toggle = a.children.length
        ? h("button", { type: "button", class: "tw", title: a.collapsed ? "expand" : "collapse",
            onclick: () => { a.collapsed = !a.collapsed; draw(); } }, a.collapsed ? "▸" : "▾")
        : h("span", { class: "tw" });
      names.append(h("div", { class: "lane-name", "data-agent": a.name, "data-label": a.label, "data-parent-tool": a.parentTool, "data-depth": a.depth,
        "data-parent-agent": a.parentAgent === null || a.parentAgent === undefined ? null : a.parentAgent,
        style: `padding-left:${6 + a.depth * 14}px`, title: agentName(a.name) }, toggle, agentName(a.name)));
      lanes.append(h("div", { class: "lane", "data-agent": a.name, style: `top:${i * LANE_H}px;width:${tm.total}px` }));
    });
    const hiddenLane = (name) => {
      // Items of a collapsed subtree are drawn on the nearest visible ancestor lane.
      let a = S.agents.get(name);
      while (a && !laneIndex.has(a.name)) a = S.agents.get(a.parentAgent);
      return a ? laneIndex.get(a.name) : 0;
    };
    for (const it of list) {
      const lane = laneIndex.has(it.agent) ? laneIndex.get(it.agent) : hiddenLane(it.agent);
      const x = tm.xOf(it.a), top = lane * LANE_H;
      let el;
      if (it.type === "mark") {
        el = h("div", { class: "mark " + it.kind, style: `left:${x}px;top:${top}px`, title: `${it.kind} #${it.seq}` });
      } else {
        const w = Math.max(2, tm.xOf(it.b) - x);
        if (it.type === "req") {
          const r = it.info.response, d = it.info.rec.data;
          const cls = "item req" + (r ? "" : " open") + (it.info.brk ? " cache-break" + (it.info.brk.expected ? " expected" : "") : "");
          const waitW = it.b > it.a ? (it.ttft / (it.b - it.a)) * w : 0;
          el = h("div", { class: cls, style: `left:${x}px;top:${top + 4}px;width:${w}px`, "data-req": it.info.req,
            title: `request #${it.info.req} · ${d.purpose || "turn"} · waiting ${fmtMs(it.ttft * 1000)}, total ${fmtMs((it.b - it.a) * 1000)}${it.info.brk ? " · cache break" : ""}` },
            h("div", { class: "w", style: `width:${waitW}px` }), h("div", { class: "g" }));
        } else {
          const cls = "item " + it.type + (it.err ? " err" : "");
          const label = it.type === "tool" ? it.name : it.type === "perm" ? "permission" : "hook";
          el = h("div", { class: cls, style: `left:${x}px;top:${top + (it.type === "hook" ? 24 : 18)}px;width:${w}px`, title: `${label} #${it.seq}` });
        }
      }
      el.dataset.seq = it.seq;
      el.addEventListener("click", (e) => { e.stopPropagation(); select(it.seq); });
      lanes.append(el);
    }
    markTimelineSelection();
    const sc = $("#lanes-scroll");
    if (S.follow && S.live) sc.scrollLeft = sc.scrollWidth;
    updateSummary();
  }
  function markTimelineSelection() {
    document.querySelectorAll("#lanes .sel").forEach((e) => e.classList.remove("sel"));
    if (S.selected === null) return;
    const rec = S.bySeq.get(S.selected);
    let seq = S.selected;
    if (rec && (rec.kind === "response" || rec.kind === "http")) { const i = S.reqs.get(rec.req); if (i) seq = i.rec.seq; }
    if (rec && rec.kind === "tool_end") { const t = S.tools.get(rec.data.id); if (t && t.start) seq = t.start.seq; }
    const el = document.querySelector(`#lanes [data-seq="${seq}"]`);
    if (el) el.classList.add("sel");
  }
  function zoom(f) {
    const sc = $("#lanes-scroll");
    const center = (sc.scrollLeft + sc.clientWidth / 2) / Math.max(1, sc.scrollWidth);
    S.scale = (S.scale === null ? S.fitScale || 1 : S.scale) * f;
    draw();
    sc.scrollLeft = center * sc.scrollWidth - sc.clientWidth / 2;
  }
  function updateSummary() {
    let cost = 0, inTok = 0, outTok = 0;
    for (const i of S.reqOrder) if (i.response) { const d = i.response.data; cost += num(d.cost); inTok += num((d.usage || {}).input) + num((d.usage || {}).cache_read) + num((d.usage || {}).cache_write); outTok += num((d.usage || {}).output); }
    const breaks = S.reqOrder.filter((i) => i.brk && !i.brk.expected).length;
    $("#summary").textContent = `${S.records.length} records · ${S.reqOrder.length} requests · ${S.agents.size} agents · ${fmtInt(inTok)} in / ${fmtInt(outTok)} out tokens · ${fmtCost(cost)} · ${breaks} unexpected cache break${breaks === 1 ? "" : "s"}`;
  }

  // ---------------------------------------------------------------- diff
  function lineDiff(a, b) {
    const A = a.split("\n"), B = b.split("\n");
    let p = 0;
    while (p < A.length && p < B.length && A[p] === B[p]) p++;
    let s = 0;
    while (s < A.length - p && s < B.length - p && A[A.length - 1 - s] === B[B.length - 1 - s]) s++;
    const a2 = A.slice(p, A.length - s), b2 = B.slice(p, B.length - s);
    const ops = A.slice(0, p).map((l) => ["=", l]);
    if (a2.length * b2.length > 4000000) {
      a2.forEach((l) => ops.push(["-", l])); b2.forEach((l) => ops.push(["+", l]));
    } else {
      const n = a2.length, m = b2.length;
      const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
      for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
        L[i][j] = a2[i] === b2[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
      let i = 0, j = 0;
      while (i < n || j < m) {
        if (i < n && j < m && a2[i] === b2[j]) { ops.push(["=", a2[i]]); i++; j++; }
        else if (i < n && (j === m || L[i + 1][j] >= L[i][j + 1])) { ops.push(["-", a2[i]]); i++; }
        else { ops.push(["+", b2[j]]); j++; }
      }
    }
    A.slice(A.length - s).forEach((l) => ops.push(["=", l]));
    return ops;
  }
  function renderDiff(a, b) {
    const ops = lineDiff(a, b);
    const box = h("div", { class: "diff" });
    const CTX = 2;
    for (let i = 0; i < ops.length;) {
      if (ops[i][0] !== "=") { box.append(h("div", { class: ops[i][0] === "+" ? "add" : "del" }, (ops[i][0]) + " " + ops[i][1])); i++; continue; }
      let j = i;
      while (j < ops.length && ops[j][0] === "=") j++;
      const run = ops.slice(i, j);
      const head = i === 0 ? 0 : CTX, tail = j === ops.length ? 0 : CTX;
      if (run.length > head + tail + 1) {
        run.slice(0, head).forEach((o) => box.append(h("div", null, "  " + o[1])));
        box.append(h("div", { class: "skip" }, `… ${run.length - head - tail} unchanged lines …`));
        run.slice(run.length - tail).forEach((o) => box.append(h("div", null, "  " + o[1])));
      } else run.forEach((o) => box.append(h("div", null, "  " + o[1])));
      i = j;
    }
    return box;
  }

  // ---------------------------------------------------------------- the inspector
  function kv(rows) {
    return h("table", { class: "kv" }, rows.filter((r) => r && r[1] !== undefined && r[1] !== null && r[1] !== "")
      .map(([k, v]) => h("tr", null, h("th", null, k), h("td", null, v))));
  }
  function link(text, seq) {
    return seq === undefined || seq === null ? text : h("a", { class: "link", "data-goto": seq, onclick: () => select(seq) }, text);
  }
  function raw(rec) { return h("details", null, h("summary", null, "raw record"), h("pre", null, JSON.stringify({ ...rec, row: undefined, search: undefined }, null, 2))); }

  function renderBlock(b) {
    switch (b.type) {
      case "text": return h("div", { class: "block text" }, h("pre", null, b.text));
      case "thinking": return h("details", { class: "block thinking" }, h("summary", null, `thinking (${(b.text || "").length} chars)${b.redacted ? " · redacted" : ""}`), h("pre", null, b.text));
      case "tool_use": {
        const t = S.tools.get(b.id);
        return h("div", { class: "block tool_use" }, h("div", { class: "bt" }, "tool call ", h("b", null, b.name), " ", link(t ? "→ tool record #" + (t.start || t.end).seq : "(not run)", t ? (t.start || t.end).seq : null)), h("pre", null, pretty(b.input)));
      }
      case "tool_result": {
        const t = S.tools.get(b.tool_use_id);
        const text = (b.content || []).map(blockText).join("\n");
        return h("div", { class: "block tool_result" }, h("div", { class: "bt" }, `tool result${b.is_error ? " (error)" : ""} `, link(t ? "→ " + ((t.start || t.end).data.name) + " #" + (t.start || t.end).seq : b.tool_use_id, t ? (t.start || t.end).seq : null)), h("pre", null, text.length > 4000 ? text.slice(0, 4000) + `\n… ${text.length - 4000} more characters` : text));
      }
      case "image": {
        const ok = /^image\/(png|jpeg|gif|webp)$/.test(b.media_type || "") && /^[A-Za-z0-9+/=]*$/.test(b.data || "");
        return h("div", { class: "block image" }, ok ? h("img", { src: `data:${b.media_type};base64,${b.data}`, alt: "image", style: "max-width:100%" }) : `[image ${b.media_type}]`);
      }
      case "web_search": return h("div", { class: "block" }, h("div", { class: "bt" }, "web search"), h("pre", null, pretty(b)));
      default: return h("div", { class: "block" }, h("pre", null, pretty(b)));
    }
  }
  function renderMessage(m, isNew, index) {
    return h("div", { class: "msg" + (isNew ? " new" : ""), "data-index": index },
      h("div", { class: "role" }, `${index + 1} · ${m.role}${isNew ? " · new" : ""}${m.model ? " · " + m.model : ""}`),
      (m.content || []).map(renderBlock));
  }

  function bodyView(side, n, file) {
    const name = `${side}/${n}`;
    const box = h("div", { class: "body", "data-side": side });
    const btn = h("button", { type: "button", title: file }, `show ${side} body`);
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      let text, note = "";
      if (!S.live) {
        const b = S.bodies[name];
        if (!b) { text = "(not in this page)"; }
        else { text = embeddedBody(name); if (b.truncated) note = `cut: the whole body was ${fmtInt(b.size)} bytes`; }
      } else {
        try {
          const r = await fetch(name, { cache: "no-store" });
          text = r.ok ? await r.text() : `(HTTP ${r.status})`;
        } catch (err) { text = "(could not load: " + err + ")"; }
      }
      if (side === "request") { try { text = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { /* a cut body is not JSON: show it as it is */ } }
      if (text.length > BODY_SHOW) { note = (note ? note + "; " : "") + `showing ${fmtInt(BODY_SHOW)} of ${fmtInt(text.length)} characters`; text = text.slice(0, BODY_SHOW); }
      box.replaceChildren(note ? h("div", { class: "trunc" }, note) : "", h("pre", null, text));
    });
    box.append(btn);
    return box;
  }
  function embeddedBody(name) {
    // A request stored as what it adds to an earlier one: that body's first `keep` characters,
    // then the tail (put together once, then kept).
    const b = S.bodies[name];
    if (!b) return "";
    if (b.text === undefined) b.text = embeddedBody("request/" + b.base).slice(0, b.keep) + b.tail;
    return b.text;
  }
  function headers(obj) {
    return h("table", { class: "kv" }, Object.entries(obj || {}).map(([k, v]) => h("tr", null, h("th", null, k), h("td", { class: "mono" }, Array.isArray(v) ? v.join(", ") : String(v)))));
  }

  function renderRequest(info) {
    const d = info.rec.data, r = info.response, rd = r ? r.data : {}, u = rd.usage || {};
    const out = [h("h2", null, `Request #${info.req} · ${agentName(info.agent)}`)];
    const newCount = info.full.length - info.newStart;
    out.push(kv([
      ["agent", agentName(info.agent)], ["model", d.model], ["purpose", d.purpose || "turn"],
      ["turn", d.turn], ["effort", d.effort], ["max tokens", d.max_tokens !== undefined ? fmtInt(d.max_tokens) : undefined],
      ["temperature", d.temperature],
      ["messages", `${newCount} new of ${info.full.length} total${d.reset ? " (reset: the earlier prefix was dropped)" : ""}`],
      info.mismatch ? ["rebuild", info.mismatch] : null,
      ["sent", "+" + fmtRel(info.rec.t) + " s"],
      ["time to first token", r ? fmtMs(rd.ttft_ms) : "waiting…"],
      ["thinking", r ? fmtMs(rd.thinking_ms) : undefined], ["generating", r ? fmtMs(rd.generating_ms) : undefined],
      ["duration", r ? fmtMs(rd.duration_ms) : undefined],
      ["output speed", r && rd.output_tokens_per_s !== undefined ? num(rd.output_tokens_per_s).toFixed(1) + " tokens/s" : undefined],
      ["attempts", r ? rd.attempts : undefined],
      ["usage", r ? `input ${fmtInt(u.input)} · output ${fmtInt(u.output)} · cache read ${fmtInt(u.cache_read)} · cache write ${fmtInt(u.cache_write)}` : undefined],
      ["cost", r ? fmtCost(rd.cost) : undefined], ["stop reason", rd.stop_reason],
      rd.notices && rd.notices.length ? ["notices", h("div", null, rd.notices.map((n) => h("div", null, n)))] : null,
    ]));
    if (info.brk) out.push(renderBreakBox(info));
    if (info.opaque) out.push(h("p", { class: "muted" }, "What this request sent is not in the trace (only its model and purpose)."));
    else out.push(...promptView(info));
    out.push(h("h3", null, "response"));
    if (r) out.push(h("div", { class: "response" }, ((rd.message || {}).content || []).map(renderBlock)), link("response record #" + r.seq, r.seq));
    else out.push(h("div", { class: "muted" }, "no response yet"));
    const https = S.httpByReq.get(info.req) || [];
    out.push(h("h3", null, `HTTP (${https.length} exchange${https.length === 1 ? "" : "s"})`));
    https.forEach((x, i) => out.push(renderHttp(x, i, https.length)));
    out.push(raw(info.rec));
    return out;
  }
  function promptView(info) {
    const d = info.rec.data, out = [];
    const newCount = info.full.length - info.newStart;
    out.push(h("h3", null, "system prompt"));
    const sys = S.systems.get(d.system_hash);
    const prev = info.prev;
    if (!prev) out.push(h("div", { class: "muted" }, `first request of this agent · hash ${String(d.system_hash).slice(0, 12)}`), h("details", null, h("summary", null, "full text"), h("pre", null, sys ?? "(not in the trace)")));
    else if (prev.rec.data.system_hash === d.system_hash) out.push(h("div", { class: "muted sys-same" }, `unchanged since request #${prev.req}`), h("details", null, h("summary", null, "full text"), h("pre", null, sys ?? "")));
    else out.push(h("div", { class: "sys-changed" }, `changed since request #${prev.req}:`), h("div", { class: "system-diff" }, renderDiff(S.systems.get(prev.rec.data.system_hash) || "", sys || "")));
    out.push(h("h3", null, "tools"));
    const tools = S.toolsets.get(d.tools_hash) || [];
    const names = tools.map((t) => t.name).join(", ");
    if (prev && prev.rec.data.tools_hash !== d.tools_hash) {
      const pt = S.toolsets.get(prev.rec.data.tools_hash) || [];
      const pn = new Set(pt.map((t) => t.name)), cn = new Set(tools.map((t) => t.name));
      const added = [...cn].filter((n) => !pn.has(n)), removed = [...pn].filter((n) => !cn.has(n));
      const changed = tools.filter((t) => pn.has(t.name) && JSON.stringify(t) !== JSON.stringify(pt.find((p) => p.name === t.name))).map((t) => t.name);
      out.push(h("div", { class: "tools-changed" }, `changed since request #${prev.req}: `, added.length ? `added ${added.join(", ")}; ` : "", removed.length ? `removed ${removed.join(", ")}; ` : "", changed.length ? `changed ${changed.join(", ")}` : ""),
        h("div", { class: "tools-diff" }, renderDiff(JSON.stringify(pt, null, 1), JSON.stringify(tools, null, 1))));
    } else out.push(h("details", null, h("summary", null, `${tools.length} tools${prev ? ", unchanged" : ""}: ${short(names, 120)}`), h("pre", null, JSON.stringify(tools, null, 2))));
    out.push(h("h3", null, `messages (${newCount} new)`));
    if (info.newStart > 0) out.push(h("details", { class: "earlier" }, h("summary", null, `${info.newStart} earlier message${info.newStart === 1 ? "" : "s"} (sent before, folded)`), info.full.slice(0, info.newStart).map((m, i) => renderMessage(m, false, i))));
    info.full.slice(info.newStart).forEach((m, i) => out.push(renderMessage(m, true, info.newStart + i)));
    return out;
  }
  function renderHttp(x, i, n) {
    const d = x.data;
    return h("div", { class: "http" },
      h("div", null, h("b", null, `${n > 1 ? "attempt " + (i + 1) + ": " : ""}${d.method || ""} ${d.status ?? ""}`), " ", h("span", { class: "mono" }, d.url || ""), " ", link("#" + x.seq, x.seq)),
      kv([["started", d.started_at ? "+" + fmtRel(d.started_at) + " s" : undefined], ["first byte", fmtMs(d.ttfb_ms)], ["duration", fmtMs(d.duration_ms)], ["sent", fmtInt(d.bytes_sent) + " bytes"], ["received", fmtInt(d.bytes_received) + " bytes"], ["error", d.error]]),
      h("details", null, h("summary", null, "request headers"), headers(d.request_headers)),
      h("details", null, h("summary", null, "response headers"), headers(d.response_headers)),
      d.request_file || d.request_delta ? bodyView("request", d.n, d.request_file || `${d.request_delta.file}: body ${d.request_delta.base}'s first ${d.request_delta.keep} bytes, then this`) : null,
      d.response_file ? bodyView("response", d.n, d.response_file) : null);
  }
  function renderBreakBox(info) {
    const b = info.brk, r = info.response;
    const w = r ? num((r.data.usage || {}).cache_write) : null;
    return h("div", { class: "cbreak" + (b.expected ? " expected" : "") },
      h("b", null, "cache break"), b.expected ? ` (expected: ${b.expected})` : "",
      `: the prefix sent differs from request #${b.prev.req} of this agent`,
      h("ul", null, b.reasons.map((x) => h("li", { class: "brk-reason" }, `${x.what} ${x.what === "messages" ? "differ" : "differs"} at ${x.where}`))),
      h("div", null, w === null ? "cost: waiting for the response" : `${fmtInt(w)} cache-write tokens that should have been reads` + (r ? ` · request cost ${fmtCost(r.data.cost)}` : "")));
  }

  function toolView(id) {
    const t = S.tools.get(id);
    const s = t.start, e = t.end, rec = s || e;
    const perm = S.perms.get(id);
    const call = S.reqOrder.find((i) => i.response && ((i.response.data.message || {}).content || []).some((b) => b.type === "tool_use" && b.id === id));
    const callBlock = call ? call.response.data.message.content.find((b) => b.type === "tool_use" && b.id === id) : null;
    const child = [...S.agents.values()].filter((a) => a.parentTool === id);
    const hooks = S.records.filter((r) => r.kind === "hook" && r.lane === rec.lane && r.data.target === rec.data.name && s && r.seq > s.seq && (!e || r.seq < e.seq + 3));
    return [
      h("h2", null, `Tool ${rec.data.name} · ${agentName(rec.lane)}`),
      kv([["id", id], ["agent", agentName(rec.lane)], ["kind", s && s.data.kind],
        ["called by", call ? link("request #" + call.req, call.response.seq) : undefined],
        ["started", s ? "+" + fmtRel(e && num(e.data.started_at) > 0 ? e.data.started_at : s.t) + " s" : undefined],
        ["duration", e ? fmtMs(num(e.data.seconds) * 1000) + (s ? "" : " (it never started)") : "running…"],
        ["result", e ? (e.data.is_error ? "error" : "ok") + (e.data.truncated ? " (output cut at 64 kB)" : "") : undefined],
        ["permission", perm ? h("span", null, `${perm.data.allow ? "allowed" : "denied"} by ${perm.data.by}${perm.data.scope ? " (" + perm.data.scope + ")" : ""}, waited ${fmtMs(perm.data.waited_ms)} `, link("#" + perm.seq, perm.seq)) : "no question asked"],
        perm && perm.data.reason ? ["reason", perm.data.reason] : null,
        child.length ? ["subagent", h("span", null, child.map((a) => agentName(a.name)).join(", "))] : null,
        hooks.length ? ["hooks", h("span", null, hooks.map((k) => link(`${k.data.event} (exit ${k.data.exit_code}) `, k.seq)))] : null,
        ["records", h("span", null, s ? link("start #" + s.seq, s.seq) : "", " ", e ? link("end #" + e.seq, e.seq) : "")]]),
      h("h3", null, "input"), h("pre", { class: "tool-input" }, s ? pretty(s.data.input) : callBlock ? pretty(callBlock.input) : "(not in the trace)"),
      h("h3", null, "output"), h("pre", { class: "tool-output" }, e ? e.data.output : "(still running)"),
      raw(rec),
    ];
  }

  function renderInspector(rec) {
    const box = $("#inspector");
    const d = rec.data;
    let content;
    if (["request", "response", "http"].includes(rec.kind) && S.reqs.get(rec.req)) content = renderRequest(S.reqs.get(rec.req));
    else if ((rec.kind === "tool_start" || rec.kind === "tool_end") && S.tools.get(d.id)) content = toolView(d.id);
    else if (rec.kind === "permission") {
      const t = S.tools.get(d.tool_use_id);
      content = [h("h2", null, `Permission · ${d.tool}`), kv([["decision", d.allow ? "allowed" : "denied"], ["by", d.by], ["scope", d.scope], ["waited", fmtMs(d.waited_ms)], ["reason", d.reason], ["suggestion", d.suggestion ? pretty(d.suggestion) : undefined], ["request id", d.request_id], ["tool call", t ? link(`${d.tool} #${(t.start || t.end).seq}`, (t.start || t.end).seq) : d.tool_use_id]]), raw(rec)];
    } else if (rec.kind === "hook") {
      content = [h("h2", null, `Hook · ${d.event}`), kv([["event", d.event], ["target", d.target], ["command", h("code", null, d.command || "")], ["duration", fmtMs(d.duration_ms)], ["exit code", d.exit_code], ["result", d.blocked ? "blocked" : d.halted ? "halted the run" : "passed"], ["error", d.error]]), raw(rec)];
    } else {
      content = [h("h2", null, `${rec.kind} #${rec.seq} · ${agentName(rec.lane)}`), kv(Object.entries(d).map(([k, v]) => [k, typeof v === "object" ? h("pre", null, pretty(v)) : String(v)])), raw(rec)];
    }
    box.replaceChildren(...[content].flat());
  }

  // ---------------------------------------------------------------- breaks and costs tabs
  function renderBreaks() {
    const list = S.reqOrder.filter((i) => i.brk);
    const box = $("#breaks");
    box.replaceChildren(h("h2", null, `Cache breaks (${list.length})`),
      h("p", { class: "muted" }, "A request whose sent prefix (system prompt, tool list, earlier messages) differs from the previous request of the same agent pays cache writes for what should have been reads."),
      h("table", { class: "grid" }, h("tr", null, ["request", "agent", "what differs", "cache write", "cost", ""].map((x) => h("th", null, x))),
        list.map((i) => h("tr", { class: "break-row" },
          h("td", null, link("#" + i.req, i.rec.seq)), h("td", null, agentName(i.agent)),
          h("td", null, i.brk.reasons.map((r) => `${r.what} at ${r.where}`).join("; ")),
          h("td", { class: "n" }, i.response ? fmtInt((i.response.data.usage || {}).cache_write) : "–"),
          h("td", { class: "n" }, i.response ? fmtCost(i.response.data.cost) : "–"),
          h("td", null, i.brk.expected ? "expected: " + i.brk.expected : "")))));
  }

  function attribution() {
    // What each tool's results cost: every later request of the agent re-sends them, so each
    // request's input tokens (and cost) are shared out by the size of what its prompt holds.
    const byTool = new Map(), byAgent = new Map();
    const toolName = (id) => { const t = S.tools.get(id); return t ? (t.start || t.end).data.name : "(unknown tool)"; };
    for (const [, t] of S.tools) {
      const rec = t.start || t.end;
      const name = rec.data.name;
      const e = byTool.get(name) || { name, calls: 0, seconds: 0, errors: 0, tokens: 0, cost: 0, chars: 0 };
      e.calls++; if (t.end) { e.seconds += num(t.end.data.seconds); if (t.end.data.is_error) e.errors++; e.chars += (t.end.data.output || "").length; }
      byTool.set(name, e);
    }
    for (const info of S.reqOrder) {
      const a = byAgent.get(info.agent) || { name: info.agent, requests: 0, input: 0, output: 0, read: 0, write: 0, cost: 0 };
      a.requests++;
      if (info.response) {
        const u = info.response.data.usage || {};
        a.input += num(u.input); a.output += num(u.output); a.read += num(u.cache_read); a.write += num(u.cache_write); a.cost += num(info.response.data.cost);
        const inTok = num(u.input) + num(u.cache_read) + num(u.cache_write);
        const inShare = inTok + num(u.output) ? inTok / (inTok + num(u.output)) : 0;
        const d = info.rec.data;
        let total = (S.systems.get(d.system_hash) || "").length + JSON.stringify(S.toolsets.get(d.tools_hash) || []).length;
        const parts = new Map();
        for (const m of info.full) {
          total += msgChars(m);
          for (const b of m.content || []) if (b.type === "tool_result") {
            const n = toolName(b.tool_use_id);
            parts.set(n, (parts.get(n) || 0) + blockText(b).length);
          }
        }
        if (total) for (const [n, chars] of parts) {
          const e = byTool.get(n) || { name: n, calls: 0, seconds: 0, errors: 0, tokens: 0, cost: 0, chars: 0 };
          e.tokens += (chars / total) * inTok; e.cost += (chars / total) * num(info.response.data.cost) * inShare;
          byTool.set(n, e);
        }
      }
      byAgent.set(info.agent, a);
    }
    const byHook = new Map();
    for (const rec of S.records) if (rec.kind === "hook") {
      const d = rec.data, key = `${d.event} · ${d.command || ""}`;
      const e = byHook.get(key) || { key, event: d.event, command: d.command || "", runs: 0, ms: 0, blocked: 0, halted: 0, failed: 0 };
      e.runs++; e.ms += num(d.duration_ms); if (d.blocked) e.blocked++; if (d.halted) e.halted++; if (d.exit_code && !d.blocked) e.failed++;
      byHook.set(key, e);
    }
    return { byTool, byAgent, byHook };
  }
  function renderCosts() {
    const { byTool, byAgent, byHook } = attribution();
    const tools = [...byTool.values()].sort((a, b) => b.tokens - a.tokens);
    const agents = [...byAgent.values()];
    $("#costs").replaceChildren(
      h("h2", null, "Cost attribution"),
      h("h3", null, "by agent (main and subagents)"),
      h("table", { class: "grid", id: "cost-agents" }, h("tr", null, ["agent", "requests", "input", "output", "cache read", "cache write", "cost"].map((x) => h("th", null, x))),
        agents.map((a) => h("tr", { "data-agent": a.name }, h("td", null, agentName(a.name)), [a.requests, a.input, a.output, a.read, a.write].map((v) => h("td", { class: "n" }, fmtInt(v))), h("td", { class: "n" }, fmtCost(a.cost))))),
      h("h3", null, "by tool"),
      h("p", { class: "muted" }, "Input tokens and cost of every later request that re-sent the tool's results, shared out by the results' share of the prompt (≈, by size)."),
      h("table", { class: "grid", id: "cost-tools" }, h("tr", null, ["tool", "calls", "errors", "time", "result chars", "≈ input tokens", "≈ cost"].map((x) => h("th", null, x))),
        tools.map((t) => h("tr", { "data-tool": t.name }, h("td", null, t.name), h("td", { class: "n" }, t.calls), h("td", { class: "n" }, t.errors), h("td", { class: "n" }, fmtMs(t.seconds * 1000)), h("td", { class: "n" }, fmtInt(t.chars)), h("td", { class: "n" }, fmtInt(Math.round(t.tokens))), h("td", { class: "n" }, fmtCost(t.cost))))),
      h("h3", null, "by hook"),
      h("table", { class: "grid", id: "cost-hooks" }, h("tr", null, ["event", "command", "runs", "time", "blocked", "halted", "failed"].map((x) => h("th", null, x))),
        [...byHook.values()].map((e) => h("tr", null, h("td", null, e.event), h("td", { class: "mono" }, short(e.command, 60)), h("td", { class: "n" }, e.runs), h("td", { class: "n" }, fmtMs(e.ms)), h("td", { class: "n" }, e.blocked), h("td", { class: "n" }, e.halted), h("td", { class: "n" }, e.failed)))));
  }

  // ---------------------------------------------------------------- wiring
  function schedule() {
    if (S.pending) return;
    S.pending = true;
    requestAnimationFrame(() => { S.pending = false; draw(); });
  }
  function add(records) {
    S.batch = { f: filterState(), rows: document.createDocumentFragment() };
    records.sort((a, b) => a.seq - b.seq).forEach(ingest);
    $("#ledger tbody").append(S.batch.rows);
    S.batch = null;
    showCount();
    // A request or tool being watched while it runs: show its response or result when it comes.
    const sel = S.selected === null ? null : S.bySeq.get(S.selected);
    if (sel && records.some((r) => (sel.req !== undefined && r.req === sel.req) || (sel.data.id && r.data.id === sel.data.id))) {
      const box = $("#inspector"), top = box.scrollTop;
      renderInspector(sel);
      box.scrollTop = top;
    }
    schedule();
    if (S.follow && S.live) { const sc = $("#ledger-scroll"); sc.scrollTop = sc.scrollHeight; }
    const tab = document.querySelector(".tab.on");
    if (tab && tab.id === "breaks") renderBreaks();
    if (tab && tab.id === "costs") renderCosts();
  }
  async function poll() {
    try {
      const r = await fetch("events?after=" + S.lastSeq, { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const body = await r.json();
      if (body.records.length) add(body.records);
      $("#live-state").textContent = `live · ${S.records.length} records`;
      $("#live-state").className = "live";
    } catch (err) {
      $("#live-state").textContent = "disconnected (" + err.message + "), retrying";
      $("#live-state").className = "";
    }
    setTimeout(poll, 1000);
  }
  function init() {
    document.addEventListener("keydown", onKey);
    $("#search").addEventListener("input", () => applyFilter());
    ["#filter-kind", "#filter-agent", "#filter-breaks"].forEach((s) => $(s).addEventListener("change", () => applyFilter()));
    document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
    $("#zoom-in").addEventListener("click", () => zoom(1.5));
    $("#zoom-out").addEventListener("click", () => zoom(1 / 1.5));
    $("#zoom-fit").addEventListener("click", () => { S.scale = null; draw(); });
    $("#collapse-idle").addEventListener("change", (e) => { S.collapse = e.target.checked; draw(); });
    $("#follow-live").addEventListener("change", (e) => { S.follow = e.target.checked; });
    const sc = $("#lanes-scroll");
    sc.addEventListener("wheel", (e) => { if (e.ctrlKey) { e.preventDefault(); zoom(e.deltaY < 0 ? 1.25 : 0.8); } }, { passive: false });
    let drag = null;
    sc.addEventListener("mousedown", (e) => { drag = { x: e.clientX, left: sc.scrollLeft }; sc.classList.add("drag"); });
    window.addEventListener("mousemove", (e) => { if (drag) sc.scrollLeft = drag.left - (e.clientX - drag.x); });
    window.addEventListener("mouseup", () => { drag = null; sc.classList.remove("drag"); });
    window.addEventListener("resize", schedule);
    const embedded = document.getElementById("trace-data");
    if (embedded) {
      const data = JSON.parse(embedded.textContent);
      S.bodies = data.bodies || {};
      $("#live-state").textContent = "static page" + (data.source ? " · " + data.source : "");
      $("#follow-live").disabled = true;
      add(data.records || []);
      draw();
    } else {
      S.live = true;
      poll();
    }
    window.keelTrace = S; // for the console (and the tests)
  }
  init();
})();
