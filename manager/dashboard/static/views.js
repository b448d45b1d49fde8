// Rendering of what the API answered: summary, services, observers, one observer's page.
// Pure DOM work; app.js decides what to fetch and when, and handles the buttons' actions.

import {
  ageSince, el, formatAge, formatTime, makeLoad, setAttr, setText, shortId, syncOptions, syncRows, updateLoad,
} from "./dom.js";

export const STATUSES = ["Scheduled", "Created", "Processing", "OnDeleting", "Deleted", "Failed"];
const STOPPABLE = new Set(["Scheduled", "Created", "Processing"]);

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- summary (GET /api/stats)

/** Counts per status as buttons: a click filters the observer list by that status. */
export function renderStatusCounts(stats, onPick) {
  const box = $("status-counts");
  if (box.children.length === 0) {
    for (const status of STATUSES) {
      const button = el("button", { type: "button", class: `chip st-${status}`, "data-testid": "status-count",
        "data-status": status, title: `show only ${status}` }, el("span", {}, status), " ", el("b"));
      button.addEventListener("click", () => onPick(status));
      box.append(button);
    }
  }
  for (const button of box.children) setText(button.querySelector("b"), stats.observers?.[button.dataset.status] ?? 0);
}

export function renderImbalance(stats) {
  const percent = Math.round(100 * (stats.imbalance ?? 0));
  setText($("imbalance"), `${percent} %`);
  setAttr($("imbalance"), "title", "the largest deviation of a service from its fair share of its pool");
}

/** Observers whose start the broker holds for an ended session (a node died): shown while any wait. */
export function renderAwaitingBroker(stats) {
  const count = stats.awaiting_broker ?? 0;
  $("awaiting-broker-line").hidden = count === 0;
  setText($("awaiting-broker"), count);
  setAttr($("awaiting-broker-line"), "title",
    "Created on no service: the broker session of the service that ran them ended, and their queue holds their "
    + "starts for it until it lets that session go");
}

export function renderCapacity(stats) {
  const pools = Object.entries(stats.capacity ?? {}).map(([pool, cap]) => ({ pool, ...cap }));
  syncRows($("capacity-body"), pools, (p) => p.pool,
    () => el("tr", { "data-testid": "capacity-row" }, el("th", { scope: "row" }), el("td"), el("td"),
      el("td", {}, makeLoad())),
    (row, p) => {
      setAttr(row, "data-pool", p.pool);
      setText(row.cells[0], p.pool);
      setText(row.cells[1], `${p.used} / ${p.total}`);
      setText(row.cells[2], p.free);
      updateLoad(row.cells[3].firstChild, p.used, p.total);
    });
}

/** Observers per kind and status; `kinds` may be missing from older managers. */
export function renderKindCounts(stats) {
  const head = $("kinds-head");
  if (head.children.length === 0) {
    head.append(el("tr", {}, el("th", { scope: "col" }, "kind"),
      ...STATUSES.map((s) => el("th", { scope: "col" }, s))));
  }
  const kinds = Object.entries(stats.kinds ?? {}).map(([kind, counts]) => ({ kind, counts }));
  syncRows($("kinds-body"), kinds, (k) => k.kind,
    () => el("tr", { "data-testid": "kind-count-row" }, el("th", { scope: "row" }), ...STATUSES.map(() => el("td"))),
    (row, k) => {
      setAttr(row, "data-kind", k.kind);
      setText(row.cells[0], k.kind);
      STATUSES.forEach((s, i) => setText(row.cells[i + 1], k.counts[s] ?? 0));
    });
}

// ---------------------------------------------------------------- services (GET /api/services)

export function renderServices(services) {
  syncRows($("services-body"), services, (s) => s.id, newServiceRow, updateServiceRow);
  $("services-empty").hidden = services.length > 0;
}

function newServiceRow() {
  const cells = ["service-name", "service-id", "service-host", "service-pools", "service-workers",
    "service-slots", "service-running", "service-load", "service-heartbeat", "service-lag", "service-status"]
    .map((testid) => el("td", { "data-testid": testid }));
  cells[7].append(makeLoad());
  return el("tr", { "data-testid": "service-row" }, ...cells);
}

function updateServiceRow(row, s) {
  const c = row.cells;
  setAttr(row, "data-name", s.name);
  setAttr(row, "data-status", s.status);
  setText(c[0], s.name);
  setText(c[1], shortId(s.id));
  setAttr(c[1], "title", s.id);
  setText(c[2], s.pid ? `${s.host} (pid ${s.pid})` : s.host);
  setText(c[3], (s.pools ?? []).join(", "));
  setText(c[4], s.workers_count);
  setText(c[5], s.process_slots);
  setText(c[6], s.running);
  updateLoad(c[7].firstChild, s.running, s.workers_count);
  setText(c[8], `${formatAge(s.heartbeat_age_s)} ago`);
  setText(c[9], `${Number(s.loop_lag_ms ?? 0).toFixed(1)} ms`);
  // A drained service is alive but takes no new starts: say so, and how far the drain is.
  setText(c[10], s.draining ? `draining: ${s.drain_note ?? ""}` : s.status);
  setAttr(c[10], "class", s.draining ? "svc-draining" : `svc-${s.status}`);
}

// ---------------------------------------------------------------- observers (GET /api/observers)

/** actions: {stop(id, button), restart(id, button)} */
export function renderObservers(items, actions) {
  syncRows($("observers-body"), items, (o) => o.id, (o) => newObserverRow(o, actions), updateObserverRow);
  $("observers-empty").hidden = items.length > 0;
}

function newObserverRow(o, actions) {
  const link = el("a", { href: `#/observers/${o.id}`, "data-testid": "observer-link" });
  const buttons = actionButtons(o.id, actions, "");
  const cells = [
    el("th", { scope: "row" }, link),
    el("td", { "data-testid": "observer-kind" }),
    el("td", { "data-testid": "observer-pool" }),
    el("td", {}, el("span", { class: "status", "data-testid": "observer-status" })),
    el("td", { "data-testid": "observer-service" }),
    el("td", { "data-testid": "observer-attempts", class: "num" }),
    el("td", { "data-testid": "observer-error", class: "error-cell" }),
    el("td", { "data-testid": "observer-start-at" }),
    el("td", { "data-testid": "observer-created" }),
    el("td", { class: "actions" }, ...buttons),
  ];
  return el("tr", { "data-testid": "observer-row" }, ...cells);
}

/** Stop and restart buttons; `prefix` tells the list's apart from the observer page's. */
export function actionButtons(id, actions, prefix) {
  const stop = el("button", { type: "button", class: "stop", "data-testid": `${prefix}stop-button` }, "Stop");
  const restart = el("button", { type: "button", class: "restart", "data-testid": `${prefix}restart-button` },
    "Restart");
  stop.addEventListener("click", () => actions.stop(id, stop));
  restart.addEventListener("click", () => actions.restart(id, restart));
  return [stop, restart];
}

/** Stop only while it can still be stopped; restart only for Failed (the API's rules). */
export function updateActionButtons(stop, restart, o) {
  const stoppable = STOPPABLE.has(o.status);
  stop.hidden = !stoppable && o.status !== "OnDeleting";
  if (!stop.dataset.busy) stop.disabled = !stoppable;
  setAttr(stop, "aria-label", `stop ${o.name}`);
  restart.hidden = o.status !== "Failed";
  setAttr(restart, "aria-label", `restart ${o.name}`);
}

function updateObserverRow(row, o) {
  const c = row.cells;
  setAttr(row, "data-name", o.name);
  setAttr(row, "data-id", o.id);
  setAttr(row, "data-status", o.status);
  setText(c[0].firstChild, o.name);
  setText(c[1], o.kind);
  setText(c[2], o.pool);
  const status = c[3].firstChild;
  // Paused for a process slot is not running, whatever the status says: show it as such.
  setText(status, o.paused ? `${o.status} · paused` : o.probation ? `${o.status} · probation` : o.status);
  setAttr(status, "title", o.paused ?? (o.probation ? probationText(o.probation) : ""));
  setAttr(status, "class", `status st-${o.status}`);
  setText(c[4], o.service_name ?? (o.service_id ? shortId(o.service_id) : "—"));
  setText(c[5], o.attempts);
  setText(c[6], o.last_error ?? "");
  setAttr(c[6], "title", o.last_error ?? "");
  setText(c[7], o.start_at ? formatTime(o.start_at) : "");
  setText(c[8], `${ageSince(o.created_at)} ago`);
  setAttr(c[8], "title", formatTime(o.created_at));
  const [stop, restart] = c[9].children;
  updateActionButtons(stop, restart, o);
}

// ---------------------------------------------------------------- filters and kinds

export function renderFilterOptions(kinds, stats, services) {
  const form = $("filters");
  const kindNames = new Set([...kinds.map((k) => k.name), ...Object.keys(stats?.kinds ?? {})]);
  syncOptions(form.elements.kind, [...kindNames].sort().map((k) => ({ value: k, label: k })));
  const pools = new Set([...Object.keys(stats?.capacity ?? {}), ...kinds.flatMap((k) => k.pools ?? [])]);
  syncOptions(form.elements.pool, [...pools].sort().map((p) => ({ value: p, label: p })));
  syncOptions(form.elements.service_id, services.map((s) => ({
    value: s.id, label: `${s.name} (${shortId(s.id)}, ${s.status})`,
  })));
}

export function renderKindPicker(kinds) {
  const select = $("create-kind");
  syncOptions(select, kinds.map((k) => ({ value: k.name, label: k.name })), false);
  if (!select.value && kinds.length > 0) select.value = kinds[0].name;
}

export function renderKindHelp(kind) {
  const help = $("create-kind-help");
  if (!kind) {
    setText(help, "");
    return;
  }
  const pools = kind.pools?.length ? `offered in ${kind.pools.join(", ")}` : "no live service offers it yet";
  setText(help, `${kind.description || kind.name} — ${kind.isolation} isolation, ${pools}`);
  syncOptions($("create-pools"), (kind.pools ?? []).map((p) => ({ value: p, label: p })), false);
}

// ---------------------------------------------------------------- one observer (#/observers/<id>)

export function renderDetail(o, servicesById) {
  setText($("detail-title"), `Observer ${o.name}`);
  const fields = [
    ["id", o.id], ["name", o.name], ["kind", o.kind], ["status", o.status], ["pool", o.pool],
    ["service", serviceLabel(o.service_id, servicesById, o.service_name)], ["attempts", o.attempts],
    ["isolation", o.isolation ?? "kind's default"],
    ["probation", o.probation ? probationText(o.probation) : "—"],
    ["memory limit", o.memory_limit_mb ? `${o.memory_limit_mb} MB` : "—"],
    ["args", JSON.stringify(o.args)], ["retry", o.retry ? JSON.stringify(o.retry) : "default"],
    ["start at", o.start_at ? formatTime(o.start_at) : "—"], ["stop at", o.stop_at ? formatTime(o.stop_at) : "—"],
    ["created", formatTime(o.created_at)], ["modified", formatTime(o.modified_at)],
  ];
  const dl = $("detail-fields");
  if (dl.children.length === 0) {
    for (const [name] of fields) {
      dl.append(el("dt", {}, name), el("dd", { "data-testid": `detail-${name.replace(" ", "-")}` }));
    }
  }
  fields.forEach(([, value], i) => setText(dl.children[2 * i + 1], value));
  setAttr(dl.querySelector('[data-testid="detail-status"]'), "class", `status st-${o.status}`);
  setText($("detail-error"), o.last_error ?? "—");
}

// Probation: its services died too often while it ran, so it runs in a child process of its own.
function probationText(p) {
  const isolated = p.isolated_since
    ? `in a child process since ${formatTime(p.isolated_since)}`
    : "waiting to be moved into a child process";
  return `since ${formatTime(p.since)}: its services died too often while it ran; ${isolated}`;
}

export function serviceLabel(id, servicesById, name) {
  if (!id) return "—";
  const known = servicesById.get(id);
  return `${name ?? known?.name ?? "?"} (${shortId(id)})`;
}

export function renderEvents(events, servicesById) {
  syncRows($("events-body"), events, (e) => e.id,
    () => el("tr", { "data-testid": "event-row" }, el("td", { class: "num" }), el("td"),
      el("td", { "data-testid": "event-name" }), el("td"), el("td"), el("td", { class: "detail" })),
    (row, e) => {
      const c = row.cells;
      setText(c[0], e.id);
      setText(c[1], formatTime(e.at));
      setText(c[2], e.event);
      setAttr(row, "data-event", e.event);
      setText(c[3], serviceLabel(e.service_id, servicesById));
      setText(c[4], serviceLabel(e.from_service_id, servicesById));
      setText(c[5], e.detail ?? "");
    });
}
