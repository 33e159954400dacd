// The fencelock dashboard: plain JavaScript, no framework, no build step.
//
// State comes from a `GET /v1/locks` snapshot (on load, after every
// reconnection of the event stream, and periodically to catch what a stream
// cannot say, such as a lease that expired with nobody watching) and is kept
// live by the server-sent events of `/v1/events`. Every string from the
// server reaches the page through `textContent` or an attribute, never as
// markup. What the lease list does not say (waiters, standbys, renewals,
// the losses and fenced-out writes the service kept, the counts behind the
// plots) comes from `GET /v1/activity`, read every few seconds.
"use strict";

const TOKEN_STORAGE = "fencelock.token";
// `?refresh=SECONDS` sets how often the whole list is read again (default 5;
// 0: only when the event stream (re)connects or reports a grant it has no
// details of).
const SNAPSHOT_EVERY_MS = refreshSetting(new URLSearchParams(window.location.search).get("refresh"), 5);
// `?activity=SECONDS` sets how often `GET /v1/activity` is read (default 2).
const ACTIVITY_EVERY_MS = Math.max(500, refreshSetting(new URLSearchParams(window.location.search).get("activity"), 2));
const TICK_MS = 250;
const MAX_EVENTS = 100;
const RECONNECT_MIN_MS = 500;
const RECONNECT_MAX_MS = 10000;
const ELECTION_PREFIX = "fencelock/election/";
const SEMAPHORE_PREFIX = "fencelock/semaphore/";
const SVG_NS = "http://www.w3.org/2000/svg";

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
// The last `GET /v1/activity` answer, this page's monotonic clock when it
// arrived, and the service's clock when it was made: times the service
// reports are shown relative to the latter, so no browser wall clock takes
// part.
let activity = null;
let activityAt = 0;
let activityServerAt = NaN;
let activityTimer = null;
// key -> the kind of its last lease seen, so that events of a lease that
// ended still follow the kind filter.
const kinds = new Map();

// ---- helpers ----------------------------------------------------------

function refreshSetting(text, fallback) {
  const seconds = text === null ? fallback : Number(text);
  return Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : fallback * 1000;
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

// A lease length: "800 ms", "30 s", "5 min 00 s".
function formatLength(ms) {
  if (!Number.isFinite(ms)) return "—";
  return ms < 1000 ? Math.round(ms) + " ms" : formatDuration(ms);
}

// How long ago the service's clock read `iso`, now.
function serviceAgo(iso) {
  return activityServerAt - Date.parse(iso) + (performance.now() - activityAt);
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
  if (typeof info.key === "string") kinds.set(info.key, info.kind === undefined ? null : info.kind);
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
  activity = null;
  renderActivity();
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
  scheduleActivity(0);
}

// `GET /v1/activity`; a failure leaves what was shown.
async function readActivity() {
  try {
    const response = await fetch("/v1/activity", { headers: headers(), cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      needToken();
      return;
    }
    if (!response.ok) return;
    const body = await response.json();
    activity = body;
    activityAt = performance.now();
    activityServerAt = Date.parse(body.at);
    renderActivity();
  } catch {
    // The status line already says when the service cannot be reached.
  }
}

function scheduleActivity(delay) {
  clearTimeout(activityTimer);
  activityTimer = setTimeout(async () => {
    await readActivity();
    scheduleActivity(ACTIVITY_EVERY_MS);
  }, delay);
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

// The one rule of the filters, for leases, waiters, losses and events.
function matches(key, kind) {
  if (filters.prefix && !key.startsWith(filters.prefix)) return false;
  if (filters.kind === "\u0000none") return kind === undefined || kind === null;
  if (filters.kind && kind !== filters.kind) return false;
  return true;
}

function visible(key, e) {
  return matches(key, e.info.kind);
}

// The kind of `key`'s current lease, else of the last one seen.
function kindOf(key) {
  const e = locks.get(key);
  return e ? e.info.kind : kinds.get(key);
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

function renewalCell() {
  return h("td", { className: "renewal", "data-renewed": "" });
}

function lockRow(key, e) {
  const data = formatData(e.info.data);
  return h("tr", {},
    h("th", { scope: "row", className: "key" }, key),
    h("td", {}, e.info.kind || ""),
    h("td", { className: "owner" }, String(e.info.owner)),
    h("td", { className: "num" }, String(e.info.token)),
    timeCell("age"),
    timeCell("length"),
    timeCell("left"),
    renewalCell(),
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
    timeCell("length"),
    timeCell("left"),
    renewalCell(),
    h("td", { className: "standbys", "data-standbys": "" }),
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
    timeCell("length"),
    timeCell("left"),
    renewalCell(),
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
  showEmpty(id, wanted.length);
}

// Hides the element `id` without rows and shows why it has none.
function showEmpty(id, rows, filtered) {
  $(id).hidden = rows === 0;
  const empty = $(id + "-empty");
  if (!empty.dataset.text) empty.dataset.text = empty.textContent;
  empty.textContent = authNeeded
    ? "Not shown: the service needs a token (enter it above)."
    : filtered ? "Nothing matches the filters." : empty.dataset.text;
  empty.hidden = rows !== 0;
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
  // The rows, not the backend's count: expired leases not yet cleaned and
  // readers are not rows, and the filters apply.
  $("stat-held").textContent = authNeeded ? "—" : String(plain.length + elections.length + semaphores.length);
  renderKinds();
  renderEvents();
  renderActivity();
  tick();
}

// What the service noted of the lease `e` of `key` (length, renewals), if
// it is the same lease.
function noteOf(key, e) {
  if (!activity || !Array.isArray(activity.leases)) return null;
  const note = activity.leases.find((n) => n.key === key);
  return note && note.token === e.info.token ? note : null;
}

function renewalText(note) {
  if (!note) return { text: "—", title: "Not renewed through this service" };
  let text = note.renewed_at ? formatDuration(serviceAgo(note.renewed_at)) + " ago" : "never";
  if (note.renewals > 1) text += " (" + note.renewals + "\u00d7)";
  let title = note.renewals + " renewal(s) through this service";
  if (note.renewal_failures > 0) {
    text += " \u00b7 " + note.renewal_failures + " failed";
    title += "; last failure: " + (note.last_failure || "unknown");
  }
  return { text, title };
}

function standbysText(key) {
  const election = activity && Array.isArray(activity.elections)
    ? activity.elections.find((el) => el.key === key)
    : null;
  if (!election || election.standbys.length === 0) return "none";
  return election.standbys.map((s) => Number.isFinite(s.waited_ms)
    ? s.owner + " (" + formatDuration(s.waited_ms + (performance.now() - activityAt)) + ")"
    : s.owner).join(", ");
}

function tick() {
  for (const { row, e } of rowCache.values()) {
    const age = row.querySelector("[data-age]");
    const left = row.querySelector("[data-left]");
    const remaining = leftNow(e);
    if (age) age.textContent = formatDuration(ageNow(e));
    if (left) left.textContent = remaining > 0 ? formatDuration(remaining) : "expired";
    row.classList.toggle("expired", remaining <= 0);
    const note = noteOf(row.dataset.key, e);
    const length = row.querySelector("[data-length]");
    // The note follows renewals; the list only at its next read.
    const ttl = note && Number.isFinite(note.ttl_ms) ? note.ttl_ms : e.info.ttl_ms;
    if (length) length.textContent = formatLength(Number.isFinite(ttl) ? ttl : NaN);
    const renewed = row.querySelector("[data-renewed]");
    if (renewed) {
      const { text, title } = renewalText(note);
      renewed.textContent = text;
      renewed.title = title;
      renewed.classList.toggle("failing", Boolean(note && note.renewal_failures > 0));
    }
    const standbys = row.querySelector("[data-standbys]");
    if (standbys) standbys.textContent = standbysText(row.dataset.key);
  }
  for (const cell of document.querySelectorAll("#waiters [data-waited]")) {
    cell.textContent = formatDuration(Number(cell.dataset.waited) + (performance.now() - activityAt));
  }
}

function renderEvents() {
  const list = $("events");
  const shown = events.filter((e) => matches(e.key || "", kindOf(e.key)));
  list.replaceChildren(...shown.map((e) => h("li", { className: "event event-" + e.type },
    h("time", { datetime: e.time.toISOString() }, e.time.toLocaleTimeString()),
    " ",
    h("span", { className: "badge" }, e.type),
    " ",
    h("span", { className: "key" }, e.key || ""),
    e.owner !== undefined && e.owner !== null ? " by " + e.owner : "",
    e.token !== undefined && e.token !== null ? " (token " + e.token + ")" : "",
    e.detail ? ": " + e.detail : "")));
  $("events-count").textContent = shown.length === events.length
    ? "(" + events.length + ")"
    : "(" + shown.length + " of " + events.length + ")";
  showEmpty("events", shown.length, events.length > 0);
}

// ---- activity: waiters, losses, plots ------------------------------------

function renderActivity() {
  const waiters = activity ? activity.waiters.filter((w) => matches(w.key, kindOf(w.key))) : [];
  $("waiters").querySelector("tbody").replaceChildren(...waiters.map((w) => h("tr", { "data-key": w.key },
    h("th", { scope: "row", className: "key" }, w.key),
    h("td", { className: "num" }, String(w.count)),
    h("td", { className: "num", "data-waited": String(w.longest_ms) }, formatDuration(w.longest_ms)),
    h("td", { className: "owner" }, w.waiting.map((x) => x.owner).join(", ")))));
  $("waiters-count").textContent = "(" + waiters.reduce((n, w) => n + w.count, 0) + ")";
  // From the same reading as the table, so that the two never disagree.
  $("stat-waiters").textContent = activity ? String(activity.waiting) : "—";
  showEmpty("waiters", waiters.length, activity !== null && activity.waiters.length > 0);

  const all = activity ? activity.incidents : [];
  const incidents = all.filter((i) => matches(i.key, kindOf(i.key)));
  $("incidents").querySelector("tbody").replaceChildren(...incidents.map(incidentRow));
  $("incidents-count").textContent = incidents.length === all.length
    ? "(" + all.length + ")"
    : "(" + incidents.length + " of " + all.length + ")";
  showEmpty("incidents", incidents.length, all.length > 0);

  const total = (series) => (activity ? activity.rates[series].reduce((a, b) => a + b, 0) : NaN);
  const count = (n) => (Number.isFinite(n) ? String(n) : "—");
  $("stat-lost").textContent = count(total("lost"));
  $("stat-fenced-out").textContent = count(total("fenced_out"));
  renderRates();
  renderHistogram("plot-wait", activity ? activity.wait_ms : null);
  renderHistogram("plot-hold", activity ? activity.hold_ms : null);
}

const INCIDENT_NAMES = { lost: "lost", renewal_refused: "renewal refused", fenced_out: "fenced out" };

function incidentRow(i) {
  const at = new Date(i.at);
  let detail = "";
  if (i.type === "fenced_out" && Number.isFinite(i.current)) detail = "highest admitted token " + i.current;
  else if (i.type === "lost") detail = "force-released";
  else if (i.type === "renewal_refused") detail = "the backend no longer had this lease";
  return h("tr", { className: "incident-" + i.type },
    h("td", {}, h("time", { datetime: i.at }, at.toLocaleString())),
    h("td", { className: "badge" }, INCIDENT_NAMES[i.type] || String(i.type)),
    h("td", { className: "key" }, i.key),
    h("td", { className: "owner" }, i.owner === undefined || i.owner === null ? "" : String(i.owner)),
    h("td", { className: "num" }, String(i.token)),
    h("td", {}, detail));
}

// Builds an SVG element; children that are strings become text nodes.
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) node.append(typeof child === "string" ? document.createTextNode(child) : child);
  return node;
}

const PLOT = { width: 640, height: 180, left: 44, right: 10, top: 12, bottom: 26 };

// A round ceiling for an axis: 1, 2, 5, 10, 20, 50, …
function axisMax(n) {
  let step = 1;
  for (;;) {
    for (const m of [1, 2, 5]) if (n <= step * m) return step * m;
    step *= 10;
  }
}

const RATE_SERIES = [["acquired", "acquisitions"], ["lost", "losses"], ["fenced_out", "fenced-out writes"]];

function renderRates() {
  const plot = $("plot-rates");
  const legend = $("plot-rates-legend");
  if (!activity) {
    plot.replaceChildren();
    legend.replaceChildren();
    return;
  }
  const rates = activity.rates;
  const n = rates.acquired.length;
  let peak = 0;
  for (const [name] of RATE_SERIES) for (const v of rates[name]) peak = Math.max(peak, v);
  const max = axisMax(Math.max(1, peak));
  const { width, height, left, right, top, bottom } = PLOT;
  const x = (i) => left + ((width - left - right) * i) / Math.max(1, n - 1);
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  const parts = [];
  for (const v of [0, max / 2, max]) {
    parts.push(svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid" }));
    parts.push(svg("text", { x: left - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, String(v)));
  }
  for (let minutes = Math.floor((n - 1) / 60); minutes >= 0; minutes -= 1) {
    const i = n - 1 - minutes * 60;
    parts.push(svg("text", { x: x(i), y: height - 8, class: "tick", "text-anchor": minutes === 0 ? "end" : "middle" },
      minutes === 0 ? "now" : "\u2212" + minutes + " min"));
  }
  for (const [name, label] of RATE_SERIES) {
    const points = rates[name].map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
    const sum = rates[name].reduce((a, b) => a + b, 0);
    parts.push(svg("polyline", { points, class: "series series-" + name, "data-total": sum },
      svg("title", {}, label + ": " + sum + " in the last " + Math.round(n / 60) + " min")));
  }
  plot.replaceChildren(...parts);
  legend.replaceChildren(...RATE_SERIES.map(([name, label]) => {
    const series = rates[name];
    const sum = series.reduce((a, b) => a + b, 0);
    return h("li", {}, h("span", { className: "swatch swatch-" + name }), label + ": " + sum +
      " (peak " + Math.max(0, ...series) + "/s)");
  }));
}

// "5 ms", "0.5 s", "2 min", "1 h".
function bucketLabel(ms) {
  if (ms < 100) return ms + " ms";
  if (ms < 60000) return ms / 1000 + " s";
  if (ms < 3600000) return ms / 60000 + " min";
  return ms / 3600000 + " h";
}

function renderHistogram(id, histogram) {
  const plot = $(id);
  if (!histogram) {
    plot.replaceChildren();
    plot.removeAttribute("data-total");
    return;
  }
  const { counts, bounds_ms: bounds } = histogram;
  const total = counts.reduce((a, b) => a + b, 0);
  const max = axisMax(Math.max(1, ...counts));
  const { width, height, left, right, top, bottom } = PLOT;
  const slot = (width - left - right) / counts.length;
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  const parts = [];
  for (const v of [0, max / 2, max]) {
    parts.push(svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid" }));
    parts.push(svg("text", { x: left - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, String(v)));
  }
  counts.forEach((count, i) => {
    const label = i < bounds.length ? "\u2264 " + bucketLabel(bounds[i]) : "> " + bucketLabel(bounds[bounds.length - 1]);
    const x = left + slot * i;
    parts.push(svg("rect", { x: x + 2, y: y(count), width: Math.max(1, slot - 4), height: y(0) - y(count),
      class: "bar", "data-count": count }, svg("title", {}, label + ": " + count)));
    if (count > 0) {
      parts.push(svg("text", { x: x + slot / 2, y: y(count) - 3, class: "tick", "text-anchor": "middle" }, String(count)));
    }
    // Every other bound, so that the labels do not overlap.
    if (i % 2 === 0) {
      parts.push(svg("text", { x: x + slot / 2, y: height - 8, class: "tick", "text-anchor": "middle" },
        i < bounds.length ? bucketLabel(bounds[i]) : ">"));
    }
  });
  plot.replaceChildren(...parts);
  plot.setAttribute("data-total", String(total));
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
  setInterval(tick, TICK_MS);
  restart();
}

document.addEventListener("DOMContentLoaded", start);
