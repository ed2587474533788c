// keel web front end: the fleet page (docs/web.md, "Fleet page").
//
// Reads the fleet through keel serve's routes only: GET /v1/runs once, then every change from
// the SSE stream /v1/runs/events; GET /v1/workers every few seconds; a run's journal from the
// SSE stream /v1/runs/{id}/journal while its detail is open. Run data is only ever put into
// the page as text (textContent, never innerHTML): a prompt or a tool's input is the model's.
"use strict";

(() => {
  const TOKEN_KEY = "keel-token";
  const WORKERS_EVERY = 3000;
  const LIMIT = 500;
  // States shown first, in this order; every other end state after them.
  const ORDER = ["parked", "running", "queued", "failed", "error", "completed", "cancelled"];
  const RETRYABLE = new Set(["failed", "error"]);
  const ACTIVE = new Set(["queued", "running", "parked"]);

  const $ = (id) => document.getElementById(id);
  const runs = new Map(); // id -> {summary, el, parts}
  const groups = new Map(); // status -> {section, list, count}
  let filter = "all";
  let token = null;
  let openRun = null; // the run whose detail is open: {id, abort, seq (journal), waits}
  let runsAbort = null;
  let older = 0; // runs beyond the newest LIMIT, not loaded

  // -- the token ---------------------------------------------------------------------------------

  function takeToken() {
    const hash = new URLSearchParams(location.hash.slice(1));
    const given = hash.get("token");
    if (given) {
      sessionStorage.setItem(TOKEN_KEY, given);
      hash.delete("token");
      const rest = hash.toString();
      history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    }
    token = sessionStorage.getItem(TOKEN_KEY);
  }

  class Unauthorized extends Error {}

  function askToken(message) {
    const form = $("token-form");
    form.hidden = false;
    $("token-error").textContent = message || "";
    $("token").focus();
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    token = value;
    $("token").value = "";
    $("token-form").hidden = true;
    start();
  });

  async function api(method, path, body) {
    const headers = { accept: "application/json" };
    if (token) headers.authorization = "Bearer " + token;
    if (body !== undefined) headers["content-type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      const answer = await response.json().catch(() => ({}));
      throw new Unauthorized(answer.error || "unauthorized");
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = new Error(data.error || response.statusText);
      error.status = response.status;
      error.hint = data.hint || "";
      throw error;
    }
    return data;
  }

  function showError(error) {
    if (error instanceof Unauthorized) {
      // A refused token is forgotten: the page asks for another.
      stop();
      closeDetail(false);
      sessionStorage.removeItem(TOKEN_KEY);
      token = null;
      askToken(error.message);
      return;
    }
    const line = $("error");
    line.textContent = String(error.message || error) + (error.hint ? " (" + error.hint + ")" : "");
    line.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  // -- Server-Sent Events over fetch (the Authorization header goes with it) ---------------------

  // Calls onEvent(kind, data, id) per message until the stream ends or `signal` aborts; throws
  // Unauthorized on a 401 and an Error on any other refusal.
  async function sse(path, signal, onEvent, onOpen, headers) {
    const all = { accept: "text/event-stream", ...(headers || {}) };
    if (token) all.authorization = "Bearer " + token;
    const response = await fetch(path, { headers: all, signal, cache: "no-store" });
    if (response.status === 401) throw new Unauthorized("the token was refused");
    if (!response.ok || !response.body) {
      const data = await response.json().catch(() => ({}));
      const error = new Error(data.error || response.statusText);
      error.status = response.status;
      error.hint = data.hint || "";
      throw error;
    }
    if (onOpen) await onOpen();
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let kind = "message";
        let id = null;
        const data = [];
        for (const line of frame.split("\n")) {
          if (!line || line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") kind = text;
          else if (field === "data") data.push(text);
          else if (field === "id") id = text;
        }
        if (data.length) {
          let parsed;
          try {
            parsed = JSON.parse(data.join("\n"));
          } catch {
            continue;
          }
          onEvent(kind, parsed, id);
        }
      }
    }
  }

  // Keeps `connect(signal)` running: again after it ends or fails, waiting longer each time
  // (1 s, half as long again each time, up to 30 s; 1 s again after a stream that opened);
  // stops on a 401, a 404 or 400 (no fleet here, no such run) or an abort.
  async function keep(signal, connect, onState) {
    let pause = 1000;
    while (!signal.aborted) {
      let opened = false;
      let why = "";
      try {
        await connect(signal, () => {
          opened = true;
          pause = 1000;
          onState("live");
        });
      } catch (error) {
        if (signal.aborted) return;
        if (error instanceof Unauthorized) {
          showError(error);
          return;
        }
        if (error.status === 404 || error.status === 400) {
          onState("refused");
          showError(error);
          return;
        }
        // A 503 says why (the fleet's NATS server is down); a network error says little.
        why = error.status ? error.message + "; " : "";
      }
      if (signal.aborted) return;
      if (!opened) pause = Math.min(pause * 1.5, 30000);
      onState(why + "reconnecting in " + Math.round(pause / 1000) + " s…");
      await new Promise((resolve) => setTimeout(resolve, pause));
    }
  }

  // -- elements ------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (value === true) node.setAttribute(key, "");
      else if (value !== false && value != null) node.setAttribute(key, value);
    }
    for (const child of children) if (child != null) node.append(child);
    return node;
  }

  function short(text, n) {
    const s = String(text == null ? "" : text);
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  // -- runs ------------------------------------------------------------------------------------------

  function group(status) {
    let g = groups.get(status);
    if (g) return g;
    const title = el("h3", { class: "group-title" }, el("span", { class: "badge s-" + status, text: status }));
    const count = el("span", { class: "muted" });
    title.append(" ", count);
    const list = el("ul", { class: "runs", "aria-label": status + " runs" });
    const section = el("section", { class: "group", "data-status": status }, title, list);
    g = { section, list, count };
    groups.set(status, g);
    // Place the group by ORDER, unknown states last, alphabetically.
    const after = [...groups.keys()]
      .filter((s) => s !== status)
      .sort(byRank)
      .find((s) => byRank(s, status) > 0);
    $("groups").insertBefore(section, after ? groups.get(after).section : null);
    return g;
  }

  function rank(status) {
    const i = ORDER.indexOf(status);
    return i < 0 ? ORDER.length : i;
  }

  function byRank(a, b) {
    return rank(a) - rank(b) || a.localeCompare(b);
  }

  function newest(a, b) {
    const x = String(a.summary.submitted || "") + a.summary.id;
    const y = String(b.summary.submitted || "") + b.summary.id;
    return x < y ? 1 : x > y ? -1 : 0;
  }

  function place(entry) {
    const status = entry.summary.status || "unknown";
    const g = group(status);
    if (entry.el.parentNode === g.list) return;
    const siblings = [...runs.values()].filter((r) => r !== entry && r.el.parentNode === g.list);
    const before = siblings.sort(newest).find((r) => newest(entry, r) < 0);
    g.list.insertBefore(entry.el, before ? before.el : null);
  }

  let countsDue = false;
  function recount() {
    if (countsDue) return;
    countsDue = true;
    queueMicrotask(() => {
      countsDue = false;
      counts();
    });
  }

  function upsert(summary) {
    if (!summary || !summary.id) return;
    recount();
    let entry = runs.get(summary.id);
    if (!entry) {
      entry = makeRun(summary);
      runs.set(summary.id, entry);
    }
    entry.summary = summary;
    fillRun(entry);
    place(entry);
    if (openRun && openRun.id === summary.id) fillDetail(summary);
  }

  function makeRun(summary) {
    const open = el("button", { type: "button", class: "open" });
    const parts = {
      open,
      id: el("span", { class: "id" }),
      badge: el("span", { class: "badge" }),
      prompt: el("span", { class: "prompt" }),
      meta: el("span", { class: "meta muted" }),
      actions: el("div", { class: "actions" }),
      question: el("div", { class: "question-slot" }),
      waits: null,
    };
    open.append(parts.badge, " ", parts.id, " ", parts.prompt, " ", parts.meta);
    const li = el("li", { class: "run", "data-run": summary.id }, open, parts.question, parts.actions);
    open.addEventListener("click", () => showDetail(summary.id));
    return { summary, el: li, parts };
  }

  function fillRun(entry) {
    const s = entry.summary;
    const p = entry.parts;
    const status = s.status || "unknown";
    p.badge.textContent = status;
    p.badge.className = "badge s-" + status;
    p.id.textContent = s.id;
    p.prompt.textContent = short(s.last_prompt || "", 80);
    const bits = [];
    if (s.worker) bits.push((status === "running" ? "on " : "worker ") + s.worker);
    if (s.attempts) bits.push("attempts " + s.attempts);
    if (s.error) bits.push(short(String(s.error).split("\n")[0], 100));
    else if (s.text && !ACTIVE.has(status)) bits.push(short(s.text, 100));
    if (s.cancel_requested && ACTIVE.has(status)) bits.push("cancel requested");
    p.meta.textContent = bits.join(" · ");
    entry.el.dataset.status = status;
    actions(p.actions, s);
    const waits = status === "parked" ? s.waits_on : null;
    const key = waits ? waits.request : null;
    if (key !== p.waits) {
      p.waits = key;
      p.question.replaceChildren(...(waits ? [question(s.id, waits)] : []));
    }
    applyFilter(entry);
  }

  function actions(box, s) {
    const want = [];
    if (ACTIVE.has(s.status)) want.push("cancel");
    if (RETRYABLE.has(s.status)) want.push("retry");
    const have = [...box.children].map((b) => b.dataset.action).join(",");
    if (have === want.join(",")) return;
    box.replaceChildren(
      ...want.map((what) =>
        el("button", {
          type: "button",
          class: what,
          "data-action": what,
          text: what === "cancel" ? "Cancel" : "Retry",
          "aria-label": (what === "cancel" ? "Cancel run " : "Retry run ") + s.id,
          onclick: (event) => act(event.currentTarget, what, s.id),
        }),
      ),
    );
  }

  async function act(button, what, run) {
    button.disabled = true;
    try {
      const before = runs.get(run)?.summary.status;
      const summary = await api("POST", "/v1/runs/" + encodeURIComponent(run) + "/" + what, {});
      // The stream may have brought a newer change while the answer was on its way (a worker
      // that closed the cancelled run first): an older answer must not roll the run back.
      const now = runs.get(run)?.summary.status;
      if (now === undefined || now === before || now === summary.status) upsert(summary);
      clearError();
    } catch (error) {
      showError(error);
    } finally {
      button.disabled = false;
    }
  }

  // A parked run's question: what it waits for, and the answers it takes.
  function question(run, waits) {
    const box = el("div", { class: "question", role: "group", "aria-label": "Run " + run + " waits for an answer" });
    const kind = waits.waits_for || "permission";
    box.append(
      el("p", { class: "asks" }, el("strong", { text: kind === "deferred" ? "Waits for a result: " : "Asks: " }), el("code", { text: waits.tool || "" }), " ", el("span", { class: "muted", text: waits.request || "" })),
    );
    if (waits.question) box.append(el("p", { class: "text", text: waits.question }));
    if (waits.input !== undefined) {
      box.append(el("pre", { class: "input", text: JSON.stringify(waits.input, null, 2) }));
    }
    const path = "/v1/runs/" + encodeURIComponent(run) + "/answers/" + encodeURIComponent(waits.request);
    const status = el("p", { class: "error", role: "alert" });
    const send = async (form, body) => {
      for (const b of form.querySelectorAll("button")) b.disabled = true;
      try {
        await api("POST", path, body);
        status.textContent = "";
        box.classList.add("answered");
        box.querySelector(".asks").append(el("span", { class: "done", text: " answered" }));
        for (const f of box.querySelectorAll("form")) f.remove();
      } catch (error) {
        if (error instanceof Unauthorized) showError(error);
        status.textContent = String(error.message || error);
        for (const b of form.querySelectorAll("button")) b.disabled = false;
      }
    };
    if (kind === "deferred") {
      const result = el("textarea", { name: "result", rows: "3", "aria-label": "Result of " + (waits.tool || "the tool") });
      const isError = el("input", { type: "checkbox", name: "is_error" });
      const form = el(
        "form",
        { class: "answer" },
        result,
        el("label", {}, isError, " the result is an error"),
        el("button", { type: "submit", class: "allow", text: "Send result" }),
      );
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        send(form, { result: result.value, is_error: isError.checked });
      });
      box.append(form);
    } else {
      const reason = el("input", { type: "text", name: "reason", placeholder: "reason (the model reads it on a denial)", "aria-label": "Reason" });
      const form = el(
        "form",
        { class: "answer" },
        el("button", { type: "button", class: "allow", text: "Allow", onclick: () => send(form, { allow: true, reason: reason.value }) }),
        reason,
        el("button", { type: "submit", class: "deny", text: "Deny" }),
      );
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        send(form, { allow: false, reason: reason.value });
      });
      box.append(form);
    }
    box.append(status);
    return box;
  }

  // -- filters and counts -------------------------------------------------------------------------

  function applyFilter(entry) {
    entry.el.hidden = filter !== "all" && entry.summary.status !== filter;
  }

  function counts() {
    const by = new Map();
    for (const r of runs.values()) by.set(r.summary.status, (by.get(r.summary.status) || 0) + 1);
    for (const [status, g] of groups) {
      const n = by.get(status) || 0;
      g.count.textContent = "(" + n + ")";
      g.section.hidden = n === 0 || (filter !== "all" && filter !== status);
    }
    // The page loads the newest LIMIT runs; `keel runs list` pages through the rest.
    $("total").textContent = older ? "(newest " + runs.size + " of " + (runs.size + older) + ")" : "(" + runs.size + ")";
    $("no-runs").hidden = runs.size > 0;
    // A tab in the background says how many runs wait for a person.
    const waiting = by.get("parked") || 0;
    document.title = waiting ? "(" + waiting + " parked) keel fleet" : "keel fleet";
    const box = $("filters");
    const states = ["all", ...[...groups.keys()].filter((s) => by.get(s)).sort(byRank)];
    if (filter !== "all" && !by.get(filter)) filter = "all";
    const have = [...box.children].map((b) => b.dataset.filter + ":" + b.dataset.n);
    const want = states.map((s) => s + ":" + (s === "all" ? runs.size : by.get(s)));
    if (have.join() !== want.join()) {
      box.replaceChildren(
        ...states.map((s) =>
          el("button", {
            type: "button",
            class: "chip",
            "data-filter": s,
            "data-n": s === "all" ? runs.size : by.get(s),
            "aria-pressed": String(filter === s),
            text: s + " " + (s === "all" ? runs.size : by.get(s)),
            onclick: () => setFilter(s),
          }),
        ),
      );
    }
    for (const b of box.children) b.setAttribute("aria-pressed", String(b.dataset.filter === filter));
  }

  function setFilter(status) {
    filter = status;
    for (const r of runs.values()) applyFilter(r);
    counts();
  }

  // -- the run's detail -----------------------------------------------------------------------------

  const FIELDS = [
    "id", "status", "last_prompt", "model", "mode", "worker", "attempts", "retries", "turns", "cost",
    "submitted", "updated", "text", "error", "note", "priority", "needs", "workspace",
  ];

  function fillDetail(s) {
    $("detail-title").textContent = "Run " + s.id;
    const dl = $("detail-summary");
    dl.replaceChildren();
    for (const key of FIELDS) {
      let value = key === "priority" || key === "needs" ? (s.request || {})[key] : s[key];
      if (value == null || value === "" || (Array.isArray(value) && !value.length)) continue;
      if (typeof value === "object") value = JSON.stringify(value);
      if (key === "cost") value = "$" + Number(value).toFixed(4);
      dl.append(el("dt", { text: key }), el("dd", { class: "f-" + key, text: String(value) }));
    }
    // The question is made again only when the run waits for another request: a reason being
    // typed survives the run's other changes.
    const waits = s.status === "parked" && s.waits_on ? s.waits_on : null;
    const key = waits ? waits.request : null;
    if (openRun && openRun.waits !== key) {
      openRun.waits = key;
      $("detail-question").replaceChildren(...(waits ? [question(s.id, waits)] : []));
    }
    actions($("detail-actions"), s);
    const log = $("detail-attempts");
    log.replaceChildren(
      ...(s.attempt_log || []).map((a) => {
        let how = a.ended || "running";
        if (how === "lost" && a.progress) how = "lost after some progress";
        return el("li", { text: (a.worker || "?") + " from " + (a.started || "?") + ", " + how + (a.reason ? ": " + a.reason : "") });
      }),
    );
    if (!log.children.length) log.append(el("li", { class: "muted", text: "none yet" }));
  }

  function describe(record) {
    const blocks = (record.message && record.message.content) || [];
    const text = (list) => list.filter((b) => b.type === "text").map((b) => b.text).join(" ");
    switch (record.type) {
      case "meta":
        return "model " + (record.model || "?") + " in " + (record.cwd || "?");
      case "user": {
        // The prompt is the last text: keel's context (working directory, date) comes first.
        const texts = blocks.filter((b) => b.type === "text");
        return texts.length ? short(texts[texts.length - 1].text, 300) : blocks.map((b) => b.type).join(", ");
      }
      case "assistant": {
        const calls = blocks.filter((b) => b.type === "tool_use").map((b) => b.name + " " + short(JSON.stringify(b.input), 120));
        return [text(blocks), ...calls.map((c) => "→ " + c)].filter(Boolean).join("  ");
      }
      case "tool_result": {
        const r = record.result || {};
        return (r.is_error ? "error: " : "") + short(text(r.content || []), 300);
      }
      case "decision":
        return record.tool + ": " + record.outcome + " (" + record.source + ")" + (record.reason ? ": " + record.reason : "");
      case "park":
        return "waits for " + record.waits_for + " on " + record.tool + " (" + record.request_id + ")";
      case "claim":
        return "claimed by " + record.worker + ", attempt " + record.attempt;
      case "terminal":
        return record.reason + (record.message ? ": " + record.message : "");
      case "note":
        return record.text || "";
      default:
        return "";
    }
  }

  function showDetail(id) {
    const entry = runs.get(id);
    if (!entry) return;
    closeDetail(false);
    const detail = $("detail");
    detail.hidden = false;
    const controller = new AbortController();
    openRun = { id, abort: controller, seq: 0, waits: undefined };
    fillDetail(entry.summary);
    const journal = $("detail-journal");
    journal.replaceChildren();
    const state = (text) => ($("journal-state").textContent = "(" + text + ")");
    keep(
      controller.signal,
      (signal, onOpen) =>
        sse(
          "/v1/runs/" + encodeURIComponent(id) + "/journal",
          signal,
          (kind, record, seq) => {
            if (kind !== "record" || !openRun || openRun.id !== id) return;
            openRun.seq = Number(seq) || openRun.seq;
            // Following the end of the journal: it stays in view as records come.
            const following = journal.scrollHeight - journal.scrollTop - journal.clientHeight < 8;
            journal.append(
              el("li", { class: "rec r-" + record.type, "data-seq": String(record.seq) },
                el("span", { class: "seq muted", text: "#" + record.seq }), " ",
                el("span", { class: "type", text: record.type }), " ",
                el("span", { class: "what", text: describe(record) })),
            );
            if (following) journal.scrollTop = journal.scrollHeight;
          },
          onOpen,
          openRun.seq ? { "last-event-id": String(openRun.seq) } : undefined,
        ),
      state,
    );
    $("detail-title").focus();
  }

  function closeDetail(refocus) {
    if (!openRun) return;
    const id = openRun.id;
    openRun.abort.abort();
    openRun = null;
    $("detail").hidden = true;
    const entry = runs.get(id);
    if (refocus && entry) entry.parts.open.focus();
  }

  $("detail-close").addEventListener("click", () => closeDetail(true));
  // Keys: Escape closes the run's detail; j and k (outside a text field) move to the next and
  // the previous run shown; Tab, Enter and Space do the rest.
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && openRun) {
      closeDetail(true);
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.target.closest && event.target.closest("input, textarea")) return;
    if (event.key !== "j" && event.key !== "k") return;
    const shown = [...document.querySelectorAll("#groups section.group:not([hidden]) li.run:not([hidden]) button.open")];
    if (!shown.length) return;
    const at = shown.indexOf(document.activeElement.closest("li.run")?.querySelector("button.open"));
    const next = at < 0 ? 0 : Math.min(shown.length - 1, Math.max(0, at + (event.key === "j" ? 1 : -1)));
    shown[next].focus();
    event.preventDefault();
  });

  // -- workers --------------------------------------------------------------------------------------

  function fillWorkers(list) {
    const body = $("workers").querySelector("tbody");
    body.replaceChildren(
      ...list.map((w) => {
        const state = w.silent ? "silent" : w.stopping ? "stopping" : "live";
        const running = w.running || [];
        return el(
          "tr",
          { "data-state": state, "data-worker": w.name },
          el("th", { scope: "row", text: w.name || "" }),
          el("td", { "data-label": "State" }, el("span", { class: "badge w-" + state, text: state })),
          el("td", { "data-label": "Heartbeat", text: Math.round(Number(w.age) || 0) + " s ago" }),
          el("td", { "data-label": "Busy", text: running.length + "/" + (w.concurrency == null ? "?" : w.concurrency) }),
          el("td", { "data-label": "Labels", text: (w.labels || []).join(", ") || "–" }),
          el("td", { "data-label": "Host", text: (w.host || "") + (w.pid ? " (pid " + w.pid + ")" : "") }),
          el("td", { "data-label": "Providers", text: (w.providers || []).join(", ") }),
          el("td", { "data-label": "Runs", class: "ids", text: running.join(" ") || "–" }),
        );
      }),
    );
    $("workers-count").textContent = "(" + list.filter((w) => !w.silent).length + " live)";
    $("no-workers").hidden = list.length > 0;
  }

  async function pollWorkers(signal) {
    while (!signal.aborted) {
      try {
        fillWorkers((await api("GET", "/v1/workers")).workers || []);
        $("workers-error").textContent = "";
      } catch (error) {
        if (error instanceof Unauthorized) return showError(error);
        $("workers-error").textContent = String(error.message || error);
        if (error.status === 404) return; // no fleet here: the page says so once
      }
      await new Promise((resolve) => setTimeout(resolve, WORKERS_EVERY));
    }
  }

  // -- start ------------------------------------------------------------------------------------------

  async function loadRuns() {
    const page = await api("GET", "/v1/runs?limit=" + LIMIT);
    for (const s of page.runs || []) upsert(s);
    older = Math.max(0, (page.total || 0) - (page.runs || []).length);
  }

  function setLive(text) {
    $("live").textContent = text;
    $("live").dataset.state = text === "live" ? "live" : "off";
  }

  function stop() {
    if (runsAbort) runsAbort.abort();
    runsAbort = null;
  }

  function start() {
    stop();
    clearError();
    const controller = new AbortController();
    runsAbort = controller;
    pollWorkers(controller.signal);
    keep(
      controller.signal,
      async (signal, onOpen) => {
        // Every (re)connection reads the list again: changes made while it was away are in it.
        await sse(
          "/v1/runs/events",
          signal,
          (kind, item) => {
            if (kind === "change") upsert(item.summary);
          },
          async () => {
            onOpen();
            await loadRuns();
          },
        );
      },
      setLive,
    );
  }

  takeToken();
  if (!token) askToken("");
  else start();
})();
