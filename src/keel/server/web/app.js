// keel web front end: the sessions page (docs/web.md).
//
// A client of keel serve's HTTP API (docs/server.md) and nothing else: the session list, and a
// conversation that follows the session's event stream (fetch + a streaming SSE parser, so the
// token travels in a header, never in a URL), reconnecting with Last-Event-ID after a drop and
// reloading the transcript after a gap. Model text reaches the page only as text nodes
// (markdown.js), never as HTML.
"use strict";

(function () {
  const TOKEN_KEY = "keel.token";
  // Keys on a question card within this long of its appearing are ignored (typed for the prompt).
  const KEY_GRACE_MS = 400;
  const $ = (id) => document.getElementById(id);
  const md = window.keelMarkdown;

  const state = {
    token: null,
    info: null,
    sid: null, // the open session
    session: null, // its description (GET /v1/sessions/{id})
    lastSeq: null, // the last event seq seen: Last-Event-ID on reconnect
    follow: null, // the AbortController of the event stream
    cards: new Map(), // tool_use_id -> tool card
    asks: new Map(), // request_id -> question card
    tasks: new Map(), // background task id -> its line on the card of the call that started it
    contexts: new Map(), // parent tool_use_id (or "") -> where its events render
    listTimer: null,
    reloadWhenIdle: false, // opened mid-run: reload the transcript when the run ends
    held: null, // events that arrive while the transcript reloads (then shown after it)
  };

  // -- small helpers -----------------------------------------------------------------------------

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function button(label, onClick, cls) {
    const b = el("button", cls, label);
    b.type = "button";
    b.addEventListener("click", onClick);
    return b;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function money(usd) {
    return `$${Number(usd || 0).toFixed(4)}`;
  }

  function kilo(n) {
    if (n >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
    return n >= 1000 ? `${+(n / 1000).toFixed(n < 10000 ? 1 : 0)}k` : String(n);
  }

  let toastTimer = null;
  function toast(message, hint) {
    const box = $("toast");
    box.replaceChildren(el("span", "", message));
    if (hint) box.appendChild(el("span", "hint", ` (${hint})`));
    box.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => (box.hidden = true), 8000);
  }

  function linkState(text) {
    $("link-state").textContent = text;
  }

  // -- the token ---------------------------------------------------------------------------------

  /** The token: taken once from the address's `#token=` (then removed from it), else the one
   * this tab kept. */
  function takeToken() {
    const hash = location.hash.replace(/^#/, "");
    const parts = hash ? hash.split("&") : [];
    const kept = [];
    for (const part of parts) {
      if (part.startsWith("token=")) {
        sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(part.slice(6)));
      } else {
        kept.push(part);
      }
    }
    if (kept.length !== parts.length) {
      history.replaceState(null, "", location.pathname + location.search + (kept.length ? `#${kept.join("&")}` : ""));
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function askToken(why) {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    stopFollowing();
    $("app").hidden = true;
    $("token-form").hidden = false;
    if (why) toast(why, "paste the token keel serve printed");
    $("token-input").focus();
  }

  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    start(token);
  });

  // -- the API -----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message, hint) {
      super(message);
      this.status = status;
      this.hint = hint || "";
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${state.token}` };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (_err) {
      throw new ApiError(0, "keel serve cannot be reached", "is it running?");
    }
    if (response.status === 401) {
      askToken("the server refused the token");
      throw new ApiError(401, "the server refused the token");
    }
    if (response.status === 204) return null;
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new ApiError(response.status, data.error || response.statusText, data.hint);
    return data;
  }

  /** Run `work`; an API error becomes a toast. */
  async function attempt(work) {
    try {
      return await work();
    } catch (err) {
      if (err instanceof ApiError) {
        if (err.status !== 401) toast(err.message, err.hint);
        return undefined;
      }
      throw err;
    }
  }

  // -- the session list --------------------------------------------------------------------------

  async function refreshList() {
    const data = await attempt(() => api("GET", "/v1/sessions"));
    if (!data) return;
    const list = $("sessions");
    list.replaceChildren();
    if (!data.sessions.length) list.appendChild(el("li", "muted", "No sessions yet: start one."));
    for (const s of data.sessions) list.appendChild(sessionRow(s));
  }

  function sessionRow(s) {
    const li = el("li", "session");
    li.dataset.id = s.id;
    if (s.id === state.sid) li.classList.add("current");
    const open = button("", () => openSession(s.id), "session-open");
    const head = el("span", "session-head");
    head.appendChild(el("span", `badge status-${s.status}`, s.status));
    if (s.busy) head.appendChild(el("span", "badge busy", "busy"));
    else if (s.loaded) head.appendChild(el("span", "badge loaded", "loaded"));
    head.appendChild(el("span", "session-model", s.model || ""));
    head.appendChild(el("span", "session-cost", money(s.cost_usd)));
    open.appendChild(head);
    open.appendChild(el("span", "session-prompt", s.last_prompt || "(no prompt yet)"));
    const meta = state.info && state.info.all_projects ? `${s.cwd} · ${s.id}` : s.id;
    open.appendChild(el("span", "session-id muted", meta));
    li.appendChild(open);
    const actions = el("span", "session-actions");
    actions.appendChild(button("Fork", () => fork(s.id), "small"));
    if (s.loaded) actions.appendChild(button("Unload", () => unload(s.id), "small"));
    li.appendChild(actions);
    return li;
  }

  async function fork(sid) {
    const forked = await attempt(() => api("POST", `/v1/sessions/${sid}/fork`, { load: true }));
    if (!forked) return;
    toast(`forked ${sid} as ${forked.id}`);
    await openSession(forked.id);
  }

  async function unload(sid) {
    const done = await attempt(() => api("DELETE", `/v1/sessions/${sid}`));
    if (done === undefined) return;
    toast(`unloaded ${sid}; its file stays (open it again to resume)`);
    if (state.sid === sid) closeConversation();
    await refreshList();
  }

  $("new-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { mode: $("new-mode").value };
    const model = $("new-model").value.trim();
    if (model) body.model = model;
    const created = await attempt(() => api("POST", "/v1/sessions", body));
    if (created) await openSession(created.id, created);
  });

  // -- the conversation --------------------------------------------------------------------------

  function resetTranscript() {
    $("transcript").replaceChildren();
    state.cards.clear();
    state.asks.clear();
    state.tasks.clear();
    state.contexts.clear();
  }

  function closeConversation() {
    stopFollowing();
    state.sid = null;
    state.session = null;
    resetTranscript();
    $("conv-pane").hidden = true;
    document.body.classList.remove("in-session");
    history.replaceState(null, "", location.pathname + location.search);
    refreshList();
  }

  async function loaded(sid) {
    try {
      return await api("GET", `/v1/sessions/${sid}`);
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 404) throw err;
    }
    return api("POST", "/v1/sessions", { resume: sid });
  }

  async function openSession(sid, described) {
    stopFollowing();
    resetTranscript();
    state.sid = sid;
    state.lastSeq = null;
    state.held = null;
    $("conv-pane").hidden = false;
    document.body.classList.add("in-session");
    history.replaceState(null, "", `${location.pathname}${location.search}#session=${encodeURIComponent(sid)}`);
    const session = described || (await attempt(() => loaded(sid)));
    if (!session || state.sid !== sid) {
      if (state.sid === sid) closeConversation();
      return;
    }
    showSession(session);
    await loadHistory(sid);
    showTasks(session.tasks);
    for (const pending of session.pending) handle(pending);
    // Opened mid-run: what it streamed before now is in the file once it ends.
    state.reloadWhenIdle = session.busy;
    follow(sid);
    refreshList();
    $("prompt").focus();
  }

  /** The link to the session's trace in the trace viewer, when it has one (debug mode). */
  async function showTrace(sid) {
    const link = $("trace-link");
    if (!link.hidden && link.dataset.sid === sid) return;
    link.hidden = true;
    let found;
    try {
      found = await api("GET", `/v1/sessions/${sid}/trace`);
    } catch (_err) {
      return; // no trace (or the server is away): no link
    }
    if (state.sid !== sid) return;
    link.href = found.url;
    link.dataset.sid = sid;
    link.hidden = false;
  }

  function showSession(session) {
    state.session = session;
    showTrace(session.id);
    $("conv-title").textContent = session.id;
    $("conv-title").title = `${session.model} in ${session.cwd}`;
    if (session.mode) $("mode").value = session.mode;
    $("cost-meter").textContent = money(session.cost_usd);
    setBusy(session.busy);
    showTasks(session.tasks);
  }

  async function loadHistory(sid) {
    const data = await attempt(() => api("GET", `/v1/sessions/${sid}/messages`));
    if (!data || state.sid !== sid) return;
    resetTranscript();
    for (const message of data.messages) renderMessage(message);
    if (data.last_seq !== null && data.last_seq !== undefined) state.lastSeq = data.last_seq;
    scrollDown(true);
  }

  function setBusy(busy) {
    $("busy").hidden = !busy;
    $("interrupt").disabled = !busy;
    document.body.classList.toggle("busy", Boolean(busy));
  }

  function scrollDown(force) {
    const box = $("transcript");
    const near = box.scrollHeight - box.scrollTop - box.clientHeight < 120;
    if (force || near) box.scrollTop = box.scrollHeight;
  }

  // -- where events render: the transcript, or a subagent's call card ---------------------------

  function context(parent) {
    const key = parent || "";
    let ctx = state.contexts.get(key);
    if (!ctx) {
      let container = $("transcript");
      if (key) container = toolCard(key, "task", ctx).nested;
      ctx = { container, text: null, thinking: null };
      state.contexts.set(key, ctx);
    }
    return ctx;
  }

  function contextOf(data) {
    return context(data.subagent ? data.subagent.parent_tool_use_id : "");
  }

  function endStreaming(ctx) {
    ctx.text = null;
    ctx.thinking = null;
  }

  function textBlock(ctx) {
    if (!ctx.text) {
      const node = el("div", "assistant md");
      ctx.container.appendChild(node);
      ctx.text = { node, source: "", queued: false };
    }
    return ctx.text;
  }

  function appendText(ctx, text) {
    ctx.thinking = null;
    const block = textBlock(ctx);
    block.source += text;
    if (!block.queued) {
      block.queued = true;
      requestAnimationFrame(() => {
        block.queued = false;
        md.render(block.source, block.node);
        scrollDown(false);
      });
    }
  }

  function appendThinking(ctx, text) {
    ctx.text = null;
    if (!ctx.thinking) {
      const details = el("details", "thinking");
      details.appendChild(el("summary", "", "thinking"));
      const body = el("div", "thinking-text");
      details.appendChild(body);
      ctx.container.appendChild(details);
      ctx.thinking = body;
    }
    ctx.thinking.textContent += text;
    scrollDown(false);
  }

  function line(ctx, cls, text) {
    endStreaming(ctx);
    const node = el("div", `line ${cls}`, text);
    ctx.container.appendChild(node);
    scrollDown(false);
    return node;
  }

  function userMessage(text) {
    const ctx = context("");
    endStreaming(ctx);
    const node = el("div", "user");
    node.appendChild(el("div", "user-text", text));
    ctx.container.appendChild(node);
    scrollDown(true);
  }

  // -- tool cards --------------------------------------------------------------------------------

  function summary(name, input) {
    if (!input || typeof input !== "object") return "";
    for (const key of ["command", "path", "file_path", "pattern", "url", "query", "description", "prompt"]) {
      if (typeof input[key] === "string") return input[key].split("\n")[0];
    }
    const first = Object.values(input).find((v) => typeof v === "string");
    return first ? first.split("\n")[0] : "";
  }

  function toolCard(id, name, ctx) {
    let card = state.cards.get(id);
    if (card) return card;
    const root = el("div", "tool");
    root.dataset.id = id;
    const head = el("div", "tool-head");
    const nameNode = el("span", "tool-name", name);
    const sum = el("span", "tool-summary");
    const status = el("span", "tool-status", "…");
    head.append(nameNode, sum, status);
    const input = el("div", "tool-input");
    const nested = el("div", "tool-nested");
    const asks = el("div", "tool-asks");
    const output = el("details", "tool-output");
    output.hidden = true;
    root.append(head, input, asks, nested, output);
    (ctx || context("")).container.appendChild(root);
    card = { root, nameNode, sum, status, input, nested, asks, output, name, hasInput: false };
    state.cards.set(id, card);
    scrollDown(false);
    return card;
  }

  function setInput(card, name, input) {
    if (card.hasInput || !input) return;
    card.hasInput = true;
    card.name = name;
    card.nameNode.textContent = name;
    card.sum.textContent = summary(name, input);
    card.input.replaceChildren(renderInput(name, input));
  }

  function renderInput(name, input) {
    if (name === "edit" && typeof input.old_string === "string") {
      return diffView(input.path, [[input.old_string, input.new_string || ""]]);
    }
    if (name === "multi_edit" && Array.isArray(input.edits)) {
      return diffView(input.path, input.edits.map((e) => [e.old_string || "", e.new_string || ""]));
    }
    if (name === "write" && typeof input.content === "string") {
      return diffView(input.path, [["", input.content]]);
    }
    if (name === "bash" && typeof input.command === "string") {
      const pre = el("pre", "command");
      pre.textContent = `$ ${input.command}`;
      return pre;
    }
    if (name === "exit_plan_mode" && typeof input.plan === "string") {
      const plan = el("div", "plan md");
      md.render(input.plan, plan);
      return plan;
    }
    const details = el("details", "raw-input");
    details.appendChild(el("summary", "", "input"));
    details.appendChild(el("pre", "", JSON.stringify(input, null, 2)));
    return details;
  }

  /** Lines removed and added, by a longest common subsequence of lines (small inputs), else
   * all old then all new. */
  function diffLines(before, after) {
    const a = before ? before.split("\n") : [];
    const b = after ? after.split("\n") : [];
    if (a.length * b.length > 250000) {
      return [...a.map((t) => ["-", t]), ...b.map((t) => ["+", t])];
    }
    const n = a.length;
    const m = b.length;
    const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i -= 1) {
      for (let j = m - 1; j >= 0; j -= 1) {
        lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    const out = [];
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && a[i] === b[j]) {
        out.push([" ", a[i]]);
        i += 1;
        j += 1;
      } else if (i < n && (j === m || lcs[i + 1][j] >= lcs[i][j + 1])) {
        out.push(["-", a[i]]);
        i += 1;
      } else {
        out.push(["+", b[j]]);
        j += 1;
      }
    }
    return out;
  }

  function diffView(path, pairs) {
    const box = el("div", "diff");
    box.appendChild(el("div", "diff-path", path || ""));
    pairs.forEach(([before, after], index) => {
      if (index > 0) box.appendChild(el("div", "diff-sep", "…"));
      const pre = el("pre", "diff-body");
      for (const [mark, text] of diffLines(before, after)) {
        const cls = mark === "+" ? "add" : mark === "-" ? "del" : "ctx";
        pre.appendChild(el("span", `diff-line ${cls}`, `${mark} ${text}\n`));
      }
      box.appendChild(pre);
    });
    return box;
  }

  function setOutput(card, text, isError) {
    card.output.hidden = false;
    card.output.replaceChildren(el("summary", "", isError ? "error" : "output"), el("pre", "", text));
    if (isError) card.output.open = true;
    let status = isError ? "error" : "done";
    if (card.name === "bash") {
      const exit = /\[exit code (-?\d+)\]\s*$/.exec(text);
      if (exit) status = `exit ${exit[1]}`;
    }
    card.status.textContent = status;
    card.root.classList.toggle("failed", Boolean(isError));
    card.root.classList.add("finished");
    const started = /^started (\S+?):? (?:in the background|a )/.exec(text);
    if (started && !isError) {
      // A background task this call started: its state shows on the card.
      const line = el("div", "task-line", `background task ${started[1]}: running`);
      card.root.insertBefore(line, card.nested);
      state.tasks.set(started[1], line);
    }
  }

  function taskFinished(data) {
    const line = state.tasks.get(data.task_id);
    if (line) line.textContent = `background task ${data.task_id}: ${data.status}`;
  }

  // -- permission, plan and MCP question cards ---------------------------------------------------

  function answer(data, body) {
    return attempt(() => api("POST", `/v1/sessions/${state.sid}/permissions/${encodeURIComponent(data.request_id)}`, body));
  }

  function permissionCard(data) {
    if (state.asks.has(data.request_id)) return;
    const ctx = contextOf(data);
    endStreaming(ctx);
    const card = toolCard(data.tool_use_id, data.tool, ctx);
    setInput(card, data.tool, data.input);
    card.status.textContent = "waiting for an answer";
    const box = el("div", "ask");
    box.tabIndex = 0;
    box.dataset.request = data.request_id;
    const plan = Boolean(data.plan);
    const who = data.agent ? `${data.agent} (a subagent) wants` : "keel wants";
    box.appendChild(el("div", "ask-title", plan ? `${who} to leave plan mode with this plan` : `${who} to run ${data.tool}: ${data.reason || ""}`));
    if (plan) {
      const planNode = el("div", "plan md");
      md.render(data.plan, planNode);
      box.appendChild(planNode);
    }
    const reason = el("input", "ask-reason");
    reason.placeholder = plan ? "feedback: what to plan differently" : "reason for denying (the model sees it)";
    reason.setAttribute("aria-label", plan ? "feedback" : "reason");
    const choices = el("div", "ask-choices");
    const keys = {};
    const choice = (key, label, body, cls) => {
      const b = button(`${label} [${key}]`, () => answer(data, typeof body === "function" ? body() : body), cls);
      b.dataset.key = key;
      keys[key] = b;
      choices.appendChild(b);
    };
    const denial = () => (reason.value.trim() ? { allow: false, reason: reason.value.trim() } : { allow: false });
    if (plan) {
      choice("a", "Approve, accept edits", { allow: true, mode: "accept-edits" }, "allow");
      choice("y", "Approve, ask before edits", { allow: true, mode: "default" }, "allow");
      choice("n", "Keep planning", denial, "deny");
    } else {
      choice("y", "Allow once", { allow: true }, "allow");
      choice("s", "Allow for this session", { allow: true, session: true }, "allow");
      if (data.suggestion && !data.confirm) choice("a", `Always allow ${data.suggestion}`, { allow: true, always: true }, "allow");
      choice("n", "Deny", denial, "deny");
    }
    box.append(choices, reason);
    reason.addEventListener("keydown", (event) => {
      if (event.key === "Enter") {
        event.preventDefault();
        keys.n.click();
      }
    });
    // Keys typed for something else just as the card appeared do not answer it: it takes keys
    // once armed.
    setTimeout(() => box.classList.add("armed"), KEY_GRACE_MS);
    box.addEventListener("keydown", (event) => {
      if (event.target !== box || event.ctrlKey || event.metaKey || event.altKey) return;
      if (!box.classList.contains("armed")) return;
      const key = event.key.toLowerCase();
      if (key === "n" && !reason.value) {
        event.preventDefault();
        reason.focus(); // a reason first; Enter denies (empty: without one)
        return;
      }
      if (keys[key]) {
        event.preventDefault();
        keys[key].click();
      }
    });
    card.asks.appendChild(box);
    state.asks.set(data.request_id, box);
    card.root.scrollIntoView({ block: "nearest" });
    takeFocus(box);
  }

  /** Focus a new question card, unless the user is writing something (then Tab reaches it). */
  function takeFocus(card) {
    const active = document.activeElement;
    const writing = active && (active.tagName === "TEXTAREA" || active.tagName === "INPUT") && active.value;
    if (!writing) card.focus({ preventScroll: true });
  }

  function permissionAnswered(data) {
    const box = state.asks.get(data.request_id);
    if (!box) return;
    state.asks.delete(data.request_id);
    const scope = { once: "once", session: "for this session", always: "always" }[data.scope] || data.scope || "";
    let text = data.allow ? `allowed ${scope}` : "denied";
    if (!data.allow && data.reason && data.reason !== data.by) text += `: ${data.reason}`;
    if (data.by && data.by !== "user") text += ` (${data.by})`;
    const note = el("div", `answered ${data.allow ? "allowed" : "denied"}`, text);
    const hadFocus = box.contains(document.activeElement);
    box.replaceWith(note);
    if (hadFocus) focusNextAsk();
  }

  function focusNextAsk() {
    const next = [...state.asks.values()][0];
    if (next) next.focus();
    else $("prompt").focus();
  }

  function questionCard(data) {
    if (state.asks.has(data.request_id)) return;
    const ctx = contextOf(data);
    endStreaming(ctx);
    const form = el("form", "ask question");
    form.tabIndex = 0;
    form.dataset.request = data.request_id;
    form.appendChild(el("div", "ask-title", `${data.source} asks: ${data.message}`));
    const schema = data.schema || {};
    const props = schema.properties || {};
    const required = new Set(schema.required || []);
    const fields = [];
    for (const [name, prop] of Object.entries(props)) {
      const label = el("label", "field");
      label.appendChild(el("span", "", `${prop.title || name}${required.has(name) ? " *" : ""}`));
      let input;
      if (Array.isArray(prop.enum)) {
        input = el("select");
        for (const value of prop.enum) input.appendChild(el("option", "", value));
      } else if (prop.type === "boolean") {
        input = el("input");
        input.type = "checkbox";
      } else {
        input = el("input");
        input.type = prop.type === "number" || prop.type === "integer" ? "number" : "text";
        if (prop.type === "integer") input.step = "1";
        input.required = required.has(name);
      }
      if (prop.default !== undefined) {
        if (input.type === "checkbox") input.checked = Boolean(prop.default);
        else input.value = String(prop.default);
      }
      if (prop.description) label.title = prop.description;
      label.appendChild(input);
      form.appendChild(label);
      fields.push([name, prop, input]);
    }
    const send = el("button", "allow", "Send");
    send.type = "submit";
    const decline = button("Decline", () => {
      answer(data, { values: null }).then((done) => done && questionDone(data.request_id, "declined"));
    }, "deny");
    const choices = el("div", "ask-choices");
    choices.append(send, decline);
    form.appendChild(choices);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const values = {};
      for (const [name, prop, input] of fields) {
        if (input.type === "checkbox") values[name] = input.checked;
        else if (input.value === "" && !required.has(name)) continue;
        else if (prop.type === "number" || prop.type === "integer") values[name] = Number(input.value);
        else values[name] = input.value;
      }
      answer(data, { values }).then((done) => done && questionDone(data.request_id, "answered"));
    });
    ctx.container.appendChild(form);
    state.asks.set(data.request_id, form);
    takeFocus(form);
    scrollDown(true);
  }

  /** Answered anywhere (this tab, another, a terminal): the form closes with what it was. */
  function questionAnswered(data) {
    const how = { accept: "answered", decline: "declined", refused: "refused" }[data.action] || data.action;
    questionDone(data.request_id, data.by && data.by !== "user" ? `${how} (${data.by})` : how);
  }

  function questionDone(requestId, how) {
    const form = state.asks.get(requestId);
    if (!form) return;
    state.asks.delete(requestId);
    form.replaceWith(el("div", "answered", how));
    focusNextAsk();
  }

  // -- the transcript from GET …/messages ------------------------------------------------------

  function renderMessage(message) {
    const ctx = context("");
    if (message.role === "user" && message.typed && message.typed.trim()) userMessage(message.typed);
    for (const block of message.content) {
      if (message.role === "user") {
        if (block.type === "tool_result") {
          const card = state.cards.get(block.tool_use_id);
          const text = (block.content || []).filter((b) => b.type === "text").map((b) => b.text).join("\n");
          if (card) setOutput(card, text, block.is_error);
        }
        continue;
      }
      if (block.type === "text") {
        endStreaming(ctx);
        const node = el("div", "assistant md");
        md.render(block.text, node);
        ctx.container.appendChild(node);
      } else if (block.type === "thinking" && block.text) {
        endStreaming(ctx);
        appendThinking(ctx, block.text);
        ctx.thinking = null;
      } else if (block.type === "tool_use") {
        endStreaming(ctx);
        setInput(toolCard(block.id, block.name, ctx), block.name, block.input);
      }
    }
    endStreaming(ctx);
  }

  // -- events ------------------------------------------------------------------------------------

  function handle(data) {
    const ctx = contextOf(data);
    switch (data.type) {
      case "user_message":
        userMessage(data.text);
        break;
      case "text_delta":
        appendText(ctx, data.text);
        break;
      case "thinking_delta":
        if (data.text) appendThinking(ctx, data.text);
        break;
      case "tool_use_start":
        endStreaming(ctx);
        toolCard(data.id, data.name, ctx);
        break;
      case "tool_started":
        setInput(toolCard(data.id, data.name, ctx), data.name, data.input);
        state.cards.get(data.id).status.textContent = "running…";
        break;
      case "tool_finished":
        setOutput(toolCard(data.id, data.name, ctx), data.output, data.is_error);
        break;
      case "permission_request":
        permissionCard(data);
        break;
      case "permission_answered":
        permissionAnswered(data);
        break;
      case "question":
        questionCard(data);
        break;
      case "question_answered":
        questionAnswered(data);
        break;
      case "assistant":
        endStreaming(ctx);
        break;
      case "usage":
        if (!data.subagent) meters(data);
        break;
      case "notice":
        line(ctx, `notice ${data.level}`, data.text);
        break;
      case "auto_decision": {
        const verb = { allow: "allowed", deny: "refused" }[data.decision];
        const what = verb ? `auto mode ${verb} ${data.tool}` : `auto mode could not decide ${data.tool}`;
        line(ctx, data.decision === "allow" ? "notice info" : "notice warning", `${what}: ${data.reason}`);
        break;
      }
      case "compacted":
        line(ctx, "notice", `context compacted (${data.trigger}): ${kilo(data.tokens_before)} → ${kilo(data.tokens_after)} tokens`);
        break;
      case "background_finished":
        line(ctx, "notice", `background ${data.kind} ${data.task_id} ${data.status}: ${data.description}`);
        taskFinished(data);
        refreshTasks();
        break;
      case "result":
        if (!data.subagent) finished(data);
        break;
      case "status":
        setBusy(data.busy);
        if (!data.busy) refreshSession();
        refreshList(); // its status, cost and last prompt
        if (!data.busy && state.reloadWhenIdle) {
          state.reloadWhenIdle = false;
          reloadAfterGap();
        }
        break;
      case "error":
        line(ctx, "error", data.hint ? `${data.error} (${data.hint})` : data.error);
        break;
      case "gap":
        state.lastSeq = data.last_seq;
        state.held = [];
        reloadAfterGap();
        break;
      case "cleared":
        openSession(data.new_session);
        break;
      case "session_closed":
        if (data.reason !== "exit") {
          line(context(""), "notice", "this session was unloaded; its file stays (open it again to resume)");
          stopFollowing();
          setBusy(false);
        }
        break;
      default:
        break; // request, turn_started, request_finished, server_stopping, tool_use_delta
    }
  }

  function meters(data) {
    $("cost-meter").textContent = money(data.cost_usd);
    if (data.context_window) {
      const share = Math.round((100 * data.context_tokens) / data.context_window);
      $("context-meter").textContent = `${kilo(data.context_tokens)}/${kilo(data.context_window)} (${share}%)`;
    } else {
      $("context-meter").textContent = `${kilo(data.context_tokens)} tokens`;
    }
  }

  function finished(data) {
    const ctx = context("");
    const how = data.stop_reason === "end_turn" ? "done" : data.stop_reason;
    line(ctx, `result ${data.is_error ? "error" : ""}`, `${how} · ${data.turns} turn${data.turns === 1 ? "" : "s"} · ${money(data.cost_usd)}${data.error ? ` · ${data.error}` : ""}`);
    for (const [id, form] of state.asks) {
      if (form.classList.contains("question")) questionDone(id, "withdrawn (the run ended)");
    }
  }

  async function refreshSession() {
    const sid = state.sid;
    if (!sid) return;
    const session = await attempt(() => api("GET", `/v1/sessions/${sid}`));
    if (session && state.sid === sid) showSession(session);
  }

  /** The transcript again from the session file; events that arrive meanwhile are held and
   * shown after it. */
  async function reloadAfterGap() {
    const sid = state.sid;
    if (!state.held) state.held = [];
    await loadHistory(sid);
    const session = await attempt(() => api("GET", `/v1/sessions/${sid}`));
    const held = state.held || [];
    state.held = null;
    if (!session || state.sid !== sid) return;
    showSession(session);
    for (const pending of session.pending) handle(pending);
    for (const data of held) handle(data);
  }

  async function refreshTasks() {
    const sid = state.sid;
    const data = await attempt(() => api("GET", `/v1/sessions/${sid}/tasks`));
    if (data && state.sid === sid) showTasks(data.tasks);
  }

  function showTasks(tasks) {
    const panel = $("tasks");
    const running = tasks.filter((t) => t.status === "running");
    $("tasks-button").hidden = tasks.length === 0;
    $("tasks-button").textContent = `Tasks ${running.length}/${tasks.length}`;
    panel.replaceChildren();
    for (const task of tasks) {
      const line = state.tasks.get(task.id);
      if (line) line.textContent = `background task ${task.id}: ${task.status}`;
      const row = el("div", `task task-${task.status}`);
      row.appendChild(el("span", "badge", task.status));
      row.appendChild(el("span", "", ` ${task.kind} ${task.id}: ${task.description} (${task.seconds}s)`));
      if (task.status === "running") {
        row.appendChild(button("Stop", () => attempt(() => api("DELETE", `/v1/sessions/${state.sid}/tasks/${task.id}`)).then(refreshTasks), "small"));
      }
      panel.appendChild(row);
    }
  }

  $("tasks-button").addEventListener("click", () => ($("tasks").hidden = !$("tasks").hidden));

  // -- the event stream: fetch + SSE parser, resumed with Last-Event-ID --------------------------

  function stopFollowing() {
    if (state.follow) state.follow.abort();
    state.follow = null;
  }

  async function readStream(body, onMessage) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let data = [];
    let id = null;
    let kind = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const raw = buffer.slice(0, end);
        buffer = buffer.slice(end + 1);
        const text = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
        if (text === "") {
          if (data.length) onMessage({ id, event: kind || "message", data: data.join("\n") });
          data = [];
          id = null;
          kind = "";
          continue;
        }
        if (text.startsWith(":")) continue; // a keepalive comment
        const colon = text.indexOf(":");
        const field = colon < 0 ? text : text.slice(0, colon);
        let val = colon < 0 ? "" : text.slice(colon + 1);
        if (val.startsWith(" ")) val = val.slice(1);
        if (field === "data") data.push(val);
        else if (field === "id") id = val;
        else if (field === "event") kind = val;
      }
    }
  }

  async function follow(sid) {
    const control = new AbortController();
    state.follow = control;
    let delay = 250;
    while (!control.signal.aborted) {
      try {
        const headers = { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" };
        if (state.lastSeq !== null) headers["Last-Event-ID"] = String(state.lastSeq);
        const response = await fetch(`/v1/sessions/${sid}/events`, { headers, signal: control.signal, cache: "no-store" });
        if (response.status === 401) {
          askToken("the server refused the token");
          return;
        }
        if (response.status === 404) {
          // Not loaded here (the server restarted): load it again; the stream then says what
          // was lost (a gap) and the transcript is reloaded.
          linkState("reloading the session…");
          const session = await api("POST", "/v1/sessions", { resume: sid });
          if (control.signal.aborted) return;
          showSession(session);
          continue;
        }
        if (!response.ok) {
          const err = await response.json().catch(() => ({}));
          throw new ApiError(response.status, err.error || response.statusText, err.hint);
        }
        linkState("live");
        delay = 250;
        await readStream(response.body, (message) => {
          if (control.signal.aborted) return;
          if (message.id) state.lastSeq = Number(message.id);
          let data;
          try {
            data = JSON.parse(message.data);
          } catch (_err) {
            return;
          }
          if (state.held && data.type !== "gap") state.held.push(data);
          else handle(data);
        });
      } catch (err) {
        if (control.signal.aborted) return;
        if (err instanceof ApiError && err.status !== 0) {
          toast(err.message, err.hint);
          if (err.status === 409 || err.status === 400 || err.status === 404) {
            linkState("not following");
            return;
          }
        }
      }
      if (control.signal.aborted) return;
      linkState("reconnecting…");
      await sleep(delay + Math.random() * delay);
      delay = Math.min(delay * 2, 4000); // so at most 8 s between tries, jitter included
    }
  }

  // -- actions -----------------------------------------------------------------------------------

  async function send(text) {
    const sid = state.sid;
    const command = text.trim();
    if (command === "/undo") return undo();
    if (command === "/clear") {
      const fresh = await attempt(() => api("POST", `/v1/sessions/${sid}/clear`));
      if (fresh) openSession(fresh.id, fresh);
      return true;
    }
    if (command === "/compact" || command.startsWith("/compact ")) {
      line(context(""), "notice", "compacting…");
      const done = await attempt(() => api("POST", `/v1/sessions/${sid}/compact`, { instructions: command.slice(8).trim() }));
      return Boolean(done);
    }
    return Boolean(await attempt(() => api("POST", `/v1/sessions/${sid}/prompt`, { text })));
  }

  async function undo() {
    const done = await attempt(() => api("POST", `/v1/sessions/${state.sid}/undo`));
    if (!done) return false;
    const parts = [];
    if (done.restored.length) parts.push(`restored ${done.restored.join(", ")}`);
    if (done.removed.length) parts.push(`removed ${done.removed.join(", ")}`);
    for (const f of [...done.overwritten, ...done.failed]) parts.push(`${f.path}: ${f.why}`);
    line(context(""), "notice", `undid ${done.label}${parts.length ? `: ${parts.join("; ")}` : ""}`);
    return true;
  }

  function interrupt() {
    if (!state.sid) return;
    attempt(() => api("POST", `/v1/sessions/${state.sid}/cancel`));
  }

  $("prompt-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const box = $("prompt");
    const text = box.value;
    if (!text.trim() || !state.sid) return;
    box.value = "";
    if (!(await send(text))) box.value = text; // refused (busy): keep it to send again
  });

  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("prompt-form").requestSubmit();
    }
  });

  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.sid && document.body.classList.contains("busy")) {
      event.preventDefault();
      interrupt();
    }
  });

  $("interrupt").addEventListener("click", interrupt);
  $("undo").addEventListener("click", undo);
  $("back").addEventListener("click", closeConversation);
  $("home").addEventListener("click", (event) => {
    event.preventDefault();
    closeConversation();
  });
  $("mode").addEventListener("change", async () => {
    const session = await attempt(() => api("PATCH", `/v1/sessions/${state.sid}`, { mode: $("mode").value }));
    if (session) showSession(session);
    else if (state.session) $("mode").value = state.session.mode;
  });

  // -- start -------------------------------------------------------------------------------------

  async function start(token) {
    state.token = token;
    $("token-form").hidden = true;
    const info = await attempt(() => api("GET", "/v1/info"));
    if (!info) return;
    state.info = info;
    $("app").hidden = false;
    $("project").textContent = info.all_projects ? "all projects" : info.cwd;
    $("fleet-link").hidden = !info.fleet;
    const wanted = /(?:^#|&)session=([^&]+)/.exec(location.hash);
    if (wanted) await openSession(decodeURIComponent(wanted[1]));
    await refreshList();
    clearInterval(state.listTimer);
    state.listTimer = setInterval(() => {
      // Not while someone is moving through the list: a new list would take their place.
      if (!document.hidden && state.token && !$("sessions").contains(document.activeElement)) refreshList();
    }, 5000);
  }

  const token = takeToken();
  if (token) start(token);
  else askToken("");
})();
