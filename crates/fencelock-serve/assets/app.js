// The fencelock dashboard: plain JavaScript, no framework, no build step.
//
// State comes from a `GET /v1/locks` snapshot (on load, after every
// reconnection of the event stream, and periodically to catch what a stream
// cannot say, such as a lease that expired with nobody watching) and is kept
// live by the server-sent events of `/v1/events`. Every string from the
// server reaches the page through `textContent` or an attribute, never as
// markup.
"use strict";

const TOKEN_STORAGE = "fencelock.token";
// `?refresh=SECONDS` sets how often the whole list is read again (default 5;
// 0: only when the event stream (re)connects or reports a grant it has no
// details of).
const SNAPSHOT_EVERY_MS = refreshSetting(new URLSearchParams(window.location.search).get("refresh"));
const TICK_MS = 250;
const MAX_EVENTS = 100;
const RECONNECT_MIN_MS = 500;
const RECONNECT_MAX_MS = 10000;
const ELECTION_PREFIX = "fencelock/election/";
const SEMAPHORE_PREFIX = "fencelock/semaphore/";

// key -> { info, at, ageMs, leftMs }: `at` is this page's monotonic clock
// when the server answered, `ageMs`/`leftMs` the lease's age and time left
// then, both from the backend's clock, so no browser wall clock takes part.
const locks = new Map();
const events = [];
const filters = { prefix: "", kind: "" };
let snapshotTimer = null;
// The service refused the token (or wants one): the tables say so instead
// of claiming that nothing is held.
let authNeeded = false;
let streamAbort = null;

// ---- helpers ----------------------------------------------------------

function refreshSetting(text) {
  const seconds = text === null ? 5 : Number(text);
  return Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : 5000;
}

function $(id) {
  return document.getElementById(id);
}

// Builds an element; children that are strings become text nodes.
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (name === "className") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === undefined || child === null) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function token() {
  return sessionStorage.getItem(TOKEN_STORAGE) || "";
}

function headers(extra) {
  const all = Object.assign({ Accept: "application/json" }, extra || {});
  const t = token();
  if (t) all.Authorization = "Bearer " + t;
  return all;
}

// The outcome of an operator's action, announced to screen readers.
function setNotice(text) {
  const notice = $("notice");
  notice.textContent = text;
  notice.hidden = !text;
}

function setStatus(state, text) {
  const status = $("status");
  status.dataset.state = state;
  status.textContent = text;
}

// "4 s", "2 min 05 s", "3 h 07 min", "2 d 4 h".
function formatDuration(ms) {
  if (!Number.isFinite(ms)) return "—";
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return s + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + " min " + String(s % 60).padStart(2, "0") + " s";
  const hours = Math.floor(m / 60);
  if (hours < 24) return hours + " h " + String(m % 60).padStart(2, "0") + " min";
  return Math.floor(hours / 24) + " d " + (hours % 24) + " h";
}

function formatData(data) {
  if (data === undefined || data === null) return "";
  return typeof data === "string" ? data : JSON.stringify(data);
}

function keyOf(info) {
  return info && typeof info.key === "string" ? info.key : null;
}

// ---- lock state -------------------------------------------------------

function entry(info) {
  const acquired = Date.parse(info.acquired_at);
  const expires = Date.parse(info.expires_at);
  const leftMs = Number.isFinite(info.expires_in_ms)
    ? info.expires_in_ms
    : Number.isFinite(info.ttl_ms) ? info.ttl_ms : NaN;
  // Both instants are the backend's, so their difference is free of skew.
  const held = expires - acquired;
  const ageMs = Number.isFinite(held) && Number.isFinite(leftMs) ? held - leftMs : NaN;
  return { info, at: performance.now(), ageMs, leftMs };
}

function ageNow(e) {
  return e.ageMs + (performance.now() - e.at);
}

function leftNow(e) {
  return e.leftMs - (performance.now() - e.at);
}

// A snapshot's answer may predate events applied while it was on its way
// (a release that it still lists): what changed since a snapshot was asked
// for is journalled and applied again on top of its answer.
let journal = [];
let snapshotsInFlight = 0;

function change(c) {
  if (snapshotsInFlight > 0) journal.push(c);
  applyChange(c);
}

// Tokens grow per key (I2): a lease with a higher token is the newer one.
function applyChange(c) {
  const current = locks.get(c.key);
  if (c.entry) {
    if (!current || current.info.token <= c.entry.info.token) locks.set(c.key, c.entry);
  } else if (current && (c.token === undefined || c.token === null || current.info.token <= c.token)) {
    locks.delete(c.key);
  }
}

function applySnapshot(list, since) {
  locks.clear();
  for (const info of list) {
    const key = keyOf(info);
    if (key !== null) locks.set(key, entry(info));
  }
  for (const c of journal.slice(since)) applyChange(c);
  render();
}

function remember(info) {
  change({ key: info.key, entry: entry(info) });
}

// Forgets `key`'s lease `token` (or any lease of `key` without a token),
// unless a newer lease replaced it.
function forget(key, token) {
  change({ key, token });
}

// ---- events -----------------------------------------------------------

// An event's type: its SSE `event:` field, which the service sets to the
// `type` of its JSON (`docs/http.md`).
function classify(name, data) {
  const type = name && name !== "message" ? name : String(data.type || "");
  return type.replace(/_/g, "-");
}

function handleEvent(name, data) {
  const type = classify(name, data);
  if (typeof data.key !== "string") return;
  if (type === "resync") {
    // The service dropped events for this page: only a snapshot is sure.
    scheduleSnapshot(0);
    return;
  }
  if (type === "acquired") {
    // Grants made through the service carry no lease details: ask for them.
    if (data.lock && typeof data.lock.key === "string") remember(data.lock);
    else scheduleSnapshot(0);
  } else if (type === "released" || type === "expired" || type === "lost") {
    forget(data.key, data.token);
  }
  logEvent({ type, key: data.key, owner: data.owner, token: data.token, detail: describeDetail(type, data) });
  render();
}

function describeDetail(type, data) {
  if (type === "fenced-out" && data.current !== undefined && data.current !== null) {
    return "refused at this resource; highest admitted token " + data.current;
  }
  if (type === "lost") return "force-released or renewal refused";
  return "";
}

function logEvent(e) {
  e.time = new Date();
  events.unshift(e);
  if (events.length > MAX_EVENTS) events.length = MAX_EVENTS;
  renderEvents();
}

// ---- network ----------------------------------------------------------

// What the page shows without a token it may use: nothing of the locks,
// and why.
function needToken() {
  authNeeded = true;
  locks.clear();
  setStatus("auth", "The service wants a token: enter it above.");
  render();
}

async function snapshot() {
  const since = journal.length;
  snapshotsInFlight += 1;
  try {
    const response = await fetch("/v1/locks", { headers: headers(), cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      needToken();
      return;
    }
    if (!response.ok) throw new Error("GET /v1/locks answered " + response.status);
    const body = await response.json();
    authNeeded = false;
    applySnapshot(Array.isArray(body.locks) ? body.locks : [], since);
    await summary();
  } catch (err) {
    setStatus("error", "Cannot reach the service: " + err.message);
  } finally {
    snapshotsInFlight -= 1;
    if (snapshotsInFlight === 0) journal = [];
  }
}

// The figures of `GET /v1/stats`; a failure leaves the last ones shown.
async function summary() {
  const response = await fetch("/v1/stats", { headers: headers(), cache: "no-store" });
  if (!response.ok) return;
  const stats = await response.json();
  const count = (n) => (Number.isFinite(n) ? String(n) : "—");
  $("stat-held").textContent = count(stats.held);
  $("stat-waiters").textContent = count(stats.waiters);
  $("stat-expired").textContent = count(stats.expired_not_cleaned);
  $("stat-max-hold").textContent = Number.isFinite(stats.max_hold_seconds)
    ? formatDuration(stats.max_hold_seconds * 1000)
    : "—";
}

function scheduleSnapshot(delay) {
  clearTimeout(snapshotTimer);
  snapshotTimer = setTimeout(async () => {
    await snapshot();
    if (SNAPSHOT_EVERY_MS > 0) scheduleSnapshot(SNAPSHOT_EVERY_MS);
  }, delay);
}

// Reads `/v1/events` with fetch rather than EventSource, which cannot send
// an Authorization header; the parser follows the SSE format (event/data
// fields, blank line ends an event, lines starting with ':' are comments).
async function stream() {
  let backoff = RECONNECT_MIN_MS;
  for (;;) {
    const controller = new AbortController();
    streamAbort = controller;
    try {
      const response = await fetch("/v1/events", {
        headers: headers({ Accept: "text/event-stream" }),
        cache: "no-store",
        signal: controller.signal,
      });
      if (response.status === 401 || response.status === 403) {
        needToken();
        return;
      }
      if (!response.ok || !response.body) throw new Error("GET /v1/events answered " + response.status);
      setStatus("live", "Live");
      backoff = RECONNECT_MIN_MS;
      // Events missed while disconnected are covered by a fresh snapshot.
      scheduleSnapshot(0);
      await readEvents(response.body);
      throw new Error("the event stream ended");
    } catch (err) {
      if (controller.signal.aborted) return;
      setStatus("error", "Reconnecting… (" + err.message + ")");
      await new Promise((resolve) => setTimeout(resolve, backoff));
      backoff = Math.min(backoff * 2, RECONNECT_MAX_MS);
    }
  }
}

async function readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let name = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let newline;
    while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
      // A CR at the end of a chunk may be the first half of a CRLF.
      if (buffer[newline] === "\r" && newline === buffer.length - 1) break;
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
      if (line === "") {
        if (data.length > 0) dispatch(name, data.join("\n"));
        name = "";
        data = [];
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let rest = colon < 0 ? "" : line.slice(colon + 1);
      if (rest.startsWith(" ")) rest = rest.slice(1);
      if (field === "event") name = rest;
      else if (field === "data") data.push(rest);
    }
  }
}

function dispatch(name, text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch {
    return;
  }
  if (data && typeof data === "object") handleEvent(name, data);
}

function restart() {
  if (streamAbort) streamAbort.abort();
  stream();
  scheduleSnapshot(0);
}

async function forceRelease(key, e) {
  const who = e.info.owner + " (token " + e.info.token + ")";
  if (!window.confirm("Force-release \u201c" + key + "\u201d held by " + who + "?\n\nThe holder loses the lock.")) return;
  try {
    const response = await fetch("/v1/locks/" + encodeURIComponent(key), {
      method: "DELETE",
      headers: headers(),
    });
    if (response.status === 401 || response.status === 403) {
      setNotice("Force-release of \u201c" + key + "\u201d was refused: it needs the admin token.");
      return;
    }
    if (!response.ok && response.status !== 404) {
      throw new Error("DELETE answered " + response.status);
    }
    // The stream reports it as `lost`; the row goes now.
    forget(key, e.info.token);
    setNotice(response.status === 404 ? "\u201c" + key + "\u201d was no longer held." : "Force-released \u201c" + key + "\u201d.");
    render();
  } catch (err) {
    setNotice("Force-release of \u201c" + key + "\u201d failed: " + err.message);
  }
}

// ---- rendering ----------------------------------------------------------

function visible(key, e) {
  if (filters.prefix && !key.startsWith(filters.prefix)) return false;
  if (filters.kind === "\u0000none") return e.info.kind === undefined || e.info.kind === null;
  if (filters.kind && e.info.kind !== filters.kind) return false;
  return true;
}

function releaseButton(key, e) {
  return h("button", {
    type: "button",
    className: "danger",
    "aria-label": "Force-release " + key,
    onclick: () => forceRelease(key, e),
  }, "Force release");
}

// Cells whose text changes every tick carry `data-age` or `data-left`.
function timeCell(kind) {
  return h("td", { className: "num", ["data-" + kind]: "" });
}

function lockRow(key, e) {
  const data = formatData(e.info.data);
  return h("tr", {},
    h("th", { scope: "row", className: "key" }, key),
    h("td", {}, e.info.kind || ""),
    h("td", { className: "owner" }, String(e.info.owner)),
    h("td", { className: "num" }, String(e.info.token)),
    timeCell("age"),
    timeCell("left"),
    h("td", { className: "data", title: data }, data),
    h("td", {}, releaseButton(key, e)));
}

function electionRow(key, e) {
  const value = formatData(e.info.data);
  return h("tr", {},
    h("th", { scope: "row", className: "key" }, key.slice(ELECTION_PREFIX.length)),
    h("td", { className: "owner" }, String(e.info.owner)),
    h("td", { className: "num" }, String(e.info.token)),
    timeCell("age"),
    timeCell("left"),
    h("td", { className: "data", title: value }, value),
    h("td", {}, releaseButton(key, e)));
}

function semaphoreParts(key) {
  const rest = key.slice(SEMAPHORE_PREFIX.length);
  const slash = rest.lastIndexOf("/");
  return slash < 0 ? { name: rest, slot: "" } : { name: rest.slice(0, slash), slot: rest.slice(slash + 1) };
}

// A permit's data is `{"fencelock_semaphore": {"permits": N}, "data": …}`
// (the semaphore's size beside the caller's data).
function semaphoreRow(key, e) {
  const { name, slot } = semaphoreParts(key);
  const meta = e.info.data && typeof e.info.data === "object" ? e.info.data.fencelock_semaphore : null;
  const size = meta && Number.isFinite(meta.permits) ? " of " + meta.permits : "";
  const data = formatData(e.info.data && typeof e.info.data === "object" && "data" in e.info.data ? e.info.data.data : null);
  return h("tr", {},
    h("th", { scope: "row", className: "key" }, name),
    h("td", { className: "num" }, slot + size),
    h("td", { className: "owner" }, String(e.info.owner)),
    h("td", { className: "num" }, String(e.info.token)),
    timeCell("age"),
    timeCell("left"),
    h("td", { className: "data", title: data }, data),
    h("td", {}, releaseButton(key, e)));
}

// Rows are kept per key and replaced only when the lease changes, so that a
// focused button survives the updates around it.
const rowCache = new Map();

function signature(e) {
  return JSON.stringify([e.info.owner, e.info.token, e.info.kind, e.info.data]);
}

function renderTable(id, rows, build) {
  const tbody = $(id).querySelector("tbody");
  const wanted = [];
  for (const [key, e] of rows) {
    const cacheKey = id + "\u0000" + key;
    const sig = signature(e);
    let cached = rowCache.get(cacheKey);
    if (!cached || cached.sig !== sig) {
      const row = build(key, e);
      row.dataset.key = key;
      if (cached) cached.row.replaceWith(row);
      cached = { sig, row, e };
      rowCache.set(cacheKey, cached);
    }
    // The same lease seen again: its timings move, its row stays.
    cached.e = e;
    wanted.push(cached.row);
  }
  const keep = new Set(wanted);
  for (const row of Array.from(tbody.children)) {
    if (!keep.has(row)) {
      row.remove();
      rowCache.delete(id + "\u0000" + row.dataset.key);
    }
  }
  wanted.forEach((row, i) => {
    if (tbody.children[i] !== row) tbody.insertBefore(row, tbody.children[i] || null);
  });
  $(id).hidden = wanted.length === 0;
  const empty = $(id + "-empty");
  if (!empty.dataset.text) empty.dataset.text = empty.textContent;
  empty.textContent = authNeeded
    ? "Not shown: the service needs a token (enter it above)."
    : empty.dataset.text;
  empty.hidden = wanted.length !== 0;
}

function renderKinds() {
  const select = $("filter-kind");
  const kinds = new Set();
  let unlabelled = false;
  for (const e of locks.values()) {
    if (e.info.kind === undefined || e.info.kind === null) unlabelled = true;
    else kinds.add(String(e.info.kind));
  }
  if (filters.kind && filters.kind !== "\u0000none") kinds.add(filters.kind);
  const options = [["", "All kinds"]];
  for (const kind of Array.from(kinds).sort()) options.push([kind, kind]);
  if (unlabelled || filters.kind === "\u0000none") options.push(["\u0000none", "(no kind)"]);
  const current = Array.from(select.options).map((o) => o.value + "\u0001" + o.textContent).join("\u0002");
  const next = options.map(([v, t]) => v + "\u0001" + t).join("\u0002");
  if (current === next) return;
  select.replaceChildren(...options.map(([value, text]) => h("option", { value }, text)));
  select.value = filters.kind;
}

function render() {
  const plain = [];
  const elections = [];
  const semaphores = [];
  const sorted = Array.from(locks.entries()).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  for (const [key, e] of sorted) {
    if (!visible(key, e)) continue;
    if (key.startsWith(ELECTION_PREFIX)) elections.push([key, e]);
    else if (key.startsWith(SEMAPHORE_PREFIX)) semaphores.push([key, e]);
    else plain.push([key, e]);
  }
  semaphores.sort(([a], [b]) => {
    const pa = semaphoreParts(a);
    const pb = semaphoreParts(b);
    if (pa.name !== pb.name) return pa.name < pb.name ? -1 : 1;
    return Number(pa.slot) - Number(pb.slot);
  });
  renderTable("locks", plain, lockRow);
  renderTable("elections", elections, electionRow);
  renderTable("semaphores", semaphores, semaphoreRow);
  $("locks-count").textContent = "(" + plain.length + ")";
  $("elections-count").textContent = "(" + elections.length + ")";
  $("semaphores-count").textContent = "(" + semaphores.length + ")";
  renderKinds();
  tick();
}

function tick() {
  for (const { row, e } of rowCache.values()) {
    const age = row.querySelector("[data-age]");
    const left = row.querySelector("[data-left]");
    const remaining = leftNow(e);
    if (age) age.textContent = formatDuration(ageNow(e));
    if (left) left.textContent = remaining > 0 ? formatDuration(remaining) : "expired";
    row.classList.toggle("expired", remaining <= 0);
  }
}

function renderEvents() {
  const list = $("events");
  list.replaceChildren(...events.map((e) => h("li", { className: "event event-" + e.type },
    h("time", { datetime: e.time.toISOString() }, e.time.toLocaleTimeString()),
    " ",
    h("span", { className: "badge" }, e.type),
    " ",
    h("span", { className: "key" }, e.key || ""),
    e.owner !== undefined && e.owner !== null ? " by " + e.owner : "",
    e.token !== undefined && e.token !== null ? " (token " + e.token + ")" : "",
    e.detail ? ": " + e.detail : "")));
  list.hidden = events.length === 0;
  $("events-empty").hidden = events.length !== 0;
}

// ---- start --------------------------------------------------------------

function start() {
  $("filters").addEventListener("submit", (ev) => ev.preventDefault());
  $("filter-prefix").addEventListener("input", (ev) => {
    filters.prefix = ev.target.value;
    render();
  });
  $("filter-kind").addEventListener("change", (ev) => {
    filters.kind = ev.target.value;
    render();
  });
  $("token").value = token();
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("token").value.trim();
    if (value) sessionStorage.setItem(TOKEN_STORAGE, value);
    else sessionStorage.removeItem(TOKEN_STORAGE);
    restart();
  });
  $("token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_STORAGE);
    $("token").value = "";
    restart();
  });
  render();
  renderEvents();
  setInterval(tick, TICK_MS);
  restart();
}

document.addEventListener("DOMContentLoaded", start);
