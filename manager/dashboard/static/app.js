// The dashboard: polls the manager's API every second and redraws what changed.
//
// Two pages on one document, chosen by the URL hash: the overview (#/) with the summary,
// services, the create form and one page of observers, and one observer (#/observers/<id>)
// with its fields and history. Only what the current page shows is fetched, and only one
// page of observers (keyset paging with next_cursor), so a fleet of 100,000 stays cheap.

import { api, ApiError, getToken, query, setToken } from "./api.js";
import { setText } from "./dom.js";
import { loadHistory } from "./history.js";
import { renderArgs } from "./schemaform.js";
import * as views from "./views.js";

const POLL_MS = 1000;
const KINDS_EVERY_MS = 10000; // kinds change only when services come and go
const PAGE_SIZE = 100;
const ROUTE = /^#\/observers\/([0-9a-fA-F-]{36})$/;

const $ = (id) => document.getElementById(id);

const state = {
  cursors: [null], // cursor of each page seen so far; the last is the current page's
  nextCursor: null,
  generation: 0, // bumped when filters or the page change: answers to older requests are dropped
  kinds: [],
  kindsAt: 0,
  stats: null,
  services: [],
  servicesById: new Map(),
  detailId: null,
  events: [],
  pollError: "", // cleared by the next successful poll
  actionError: "", // stays until dismissed or the next action succeeds
  tokenNeeded: false,
  readArgs: () => ({}),
  argsSchemaKey: "",
};

const actions = { stop: stopObserver, restart: restartObserver };

// ---------------------------------------------------------------- polling

let pollTimer = null;
let polling = false;
let pollAgain = false;

/** Poll now (or right after the poll in flight), then every POLL_MS; never two at once. */
async function poll() {
  clearTimeout(pollTimer);
  if (polling) {
    pollAgain = true;
    return;
  }
  polling = true;
  pollAgain = false;
  const started = performance.now();
  try {
    if (!document.hidden && !state.tokenNeeded) await refresh();
  } finally {
    polling = false;
    const wait = pollAgain ? 0 : Math.max(100, POLL_MS - (performance.now() - started));
    pollTimer = setTimeout(poll, wait);
  }
}

async function refresh() {
  const jobs = [loadServices()];
  if (state.detailId) jobs.push(loadDetail(state.detailId));
  else jobs.push(loadStats(), loadObservers(), loadHistory());
  if (Date.now() - state.kindsAt > KINDS_EVERY_MS) jobs.push(loadKinds());
  const failures = (await Promise.allSettled(jobs)).filter((r) => r.status === "rejected").map((r) => r.reason);
  const auth = failures.find((e) => e instanceof ApiError && e.needsToken);
  if (auth) {
    askForToken(auth.message);
    return;
  }
  state.pollError = failures.length ? failures.map((e) => e.message).join("; ") : "";
  setText($("live-state"), failures.length ? "not updating" : `live · ${new Date().toLocaleTimeString()}`);
  renderBanner();
}

async function loadServices() {
  state.services = await api("GET", "/api/services");
  state.servicesById = new Map(state.services.map((s) => [s.id, s]));
  views.renderServices(state.services);
  views.renderFilterOptions(state.kinds, state.stats, state.services);
}

async function loadStats() {
  state.stats = await api("GET", "/api/stats");
  views.renderStatusCounts(state.stats, pickStatus);
  views.renderCapacity(state.stats);
  views.renderImbalance(state.stats);
  views.renderAwaitingBroker(state.stats);
  views.renderKindCounts(state.stats);
}

async function loadKinds() {
  state.kinds = await api("GET", "/api/kinds");
  state.kindsAt = Date.now();
  views.renderKindPicker(state.kinds);
  showKindArgs();
}

function filters() {
  const form = $("filters");
  const values = Object.fromEntries(new FormData(form));
  values.q = (values.q ?? "").trim();
  return values;
}

async function loadObservers() {
  const generation = state.generation;
  const cursor = state.cursors[state.cursors.length - 1];
  const page = await api("GET", `/api/observers${query({ ...filters(), limit: PAGE_SIZE, cursor })}`);
  if (generation !== state.generation) return; // the filters changed while this was in flight
  state.nextCursor = page.next_cursor;
  views.renderObservers(page.items, actions);
  $("page-prev").disabled = state.cursors.length <= 1;
  $("page-next").disabled = !page.next_cursor;
  setText($("page-number"), `page ${state.cursors.length}`);
}

async function loadDetail(id) {
  const after = state.events.length ? state.events[state.events.length - 1].id : undefined;
  const [observer, events] = await Promise.all([
    api("GET", `/api/observers/${id}`),
    api("GET", `/api/observers/${id}/events${query({ limit: 1000, after })}`),
  ]);
  if (id !== state.detailId) return; // the user went elsewhere meanwhile
  state.events = state.events.concat(events); // only new ones come back (after=)
  views.renderDetail(observer, state.servicesById);
  views.renderEvents(state.events, state.servicesById);
  const [stop, restart] = $("detail-actions").children;
  views.updateActionButtons(stop, restart, observer);
}

// ---------------------------------------------------------------- errors, notices, token

function renderBanner() {
  const message = [state.actionError, state.pollError].filter(Boolean).join(" — ");
  setText($("error-text"), message);
  $("error-banner").hidden = !message;
}

let noticeTimer = null;

function notify(message) {
  const notice = $("notice");
  setText(notice, message);
  notice.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => (notice.hidden = true), 5000);
}

function showTokenForm(reason) {
  setText($("token-reason"), reason);
  $("token-form").hidden = false;
  $("token-input").focus();
}

/** Polls answered 401/403: stop asking the API until the user gives a token. */
function askForToken(reason) {
  state.tokenNeeded = true;
  setText($("live-state"), "waiting for a token");
  showTokenForm(reason);
}

function useToken(event) {
  event.preventDefault();
  setToken($("token-input").value.trim());
  $("token-input").value = "";
  $("token-form").hidden = true;
  $("token-change").hidden = !getToken();
  state.tokenNeeded = false;
  state.actionError = "";
  state.kindsAt = 0; // the kinds call failed too: ask again now
  poll();
}

// ---------------------------------------------------------------- actions

/** Run a change; show its error, or refresh at once so its effect shows without waiting. */
async function act(button, work) {
  if (button) {
    button.dataset.busy = "1";
    button.disabled = true;
  }
  try {
    const message = await work();
    state.actionError = "";
    if (message) notify(message);
  } catch (err) {
    state.actionError = err.message;
    // A change refused (e.g. a read-only token): offer another token, but keep the page live.
    if (err instanceof ApiError && err.needsToken) showTokenForm(err.message);
  } finally {
    if (button) {
      delete button.dataset.busy;
      button.disabled = false;
    }
    renderBanner();
    poll();
  }
}

function stopObserver(id, button) {
  return act(button, async () => {
    const o = await api("DELETE", `/api/observers/${id}`);
    return `Stopping ${o.name} (${o.status})`;
  });
}

function restartObserver(id, button) {
  return act(button, async () => {
    const o = await api("POST", `/api/observers/${id}/restart`);
    return `Restarted ${o.name} (${o.status})`;
  });
}

function createObserver(event) {
  event.preventDefault();
  const form = event.target;
  const button = form.querySelector('button[type="submit"]');
  act(button, async () => {
    let args;
    try {
      args = state.readArgs();
    } catch (err) {
      throw new ApiError(err.message, 0); // a bad JSON field: say which, send nothing
    }
    const pool = form.elements.pool.value.trim();
    const body = { name: form.elements.name.value.trim(), kind: form.elements.kind.value, args };
    if (pool) body.pool = pool;
    const o = await api("POST", "/api/observers", body);
    form.elements.name.value = "";
    return `Created ${o.name} (${o.status})`;
  });
}

/** Inputs for the chosen kind's args; kept as they are while its schema does not change. */
function showKindArgs() {
  const kind = state.kinds.find((k) => k.name === $("create-kind").value);
  views.renderKindHelp(kind);
  const key = kind ? `${kind.name}\u0000${JSON.stringify(kind.args_schema)}` : "";
  if (key === state.argsSchemaKey) return;
  state.argsSchemaKey = key;
  state.readArgs = renderArgs($("create-args"), kind ? kind.args_schema : {});
}

// ---------------------------------------------------------------- filters, paging, routing

function filtersChanged() {
  state.cursors = [null];
  state.generation += 1;
  poll();
}

function pickStatus(status) {
  const select = $("filters").elements.status;
  select.value = select.value === status ? "" : status; // a second click clears the filter
  filtersChanged();
}

function turnPage(forward) {
  if (forward && state.nextCursor) state.cursors.push(state.nextCursor);
  else if (!forward && state.cursors.length > 1) state.cursors.pop();
  else return;
  state.generation += 1;
  poll();
}

function route() {
  const match = ROUTE.exec(location.hash);
  const id = match ? match[1].toLowerCase() : null;
  if (id !== state.detailId) {
    state.detailId = id;
    state.events = [];
    $("events-body").replaceChildren();
    $("detail-fields").replaceChildren();
    setText($("detail-error"), "—");
    $("detail-actions").replaceChildren(...(id ? views.actionButtons(id, actions, "detail-") : []));
  }
  $("observer-detail").hidden = !id;
  $("overview").hidden = Boolean(id);
  poll();
}

function debounce(fn, ms) {
  let timer = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
}

function start() {
  $("filters").addEventListener("change", filtersChanged);
  $("filters").addEventListener("submit", (e) => e.preventDefault());
  $("filters").elements.q.addEventListener("input", debounce(filtersChanged, 300));
  $("page-prev").addEventListener("click", () => turnPage(false));
  $("page-next").addEventListener("click", () => turnPage(true));
  $("create-form").addEventListener("submit", createObserver);
  $("create-kind").addEventListener("change", showKindArgs);
  $("token-form").addEventListener("submit", useToken);
  $("token-change").hidden = !getToken();
  $("token-change").addEventListener("click", () => showTokenForm("Enter another token (empty: none)."));
  $("error-dismiss").addEventListener("click", () => {
    state.actionError = "";
    renderBanner();
  });
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => document.hidden || poll());
  route(); // also starts polling
}

start();
