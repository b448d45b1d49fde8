// The "Last hour" charts (GET /api/history): observers per status, creates and stops per
// minute, failovers per minute and each service's load. The manager samples every few
// seconds, so the page asks at most once per sample period, whatever its own poll.

import { api } from "./api.js";
import { el, setText } from "./dom.js";
import { lineChart } from "./charts.js";

const $ = (id) => document.getElementById(id);
const SERVICE_COLOURS = 6; // .c0 … .c5 in style.css

let loadedAt = 0;
let everyMs = 5000;

/** Fetch and redraw, unless the last answer is younger than one sample period. */
export async function loadHistory() {
  if (Date.now() - loadedAt < everyMs) return;
  const history = await api("GET", "/api/history");
  loadedAt = Date.now();
  everyMs = Math.max(1000, history.period_s * 1000);
  renderHistory(history);
}

function legend(box, series) {
  box.replaceChildren(...series.map((s) => el("span", { class: `key ${s.cls ?? ""}` }, s.label)));
}

function chart(name, xs, series, options) {
  lineChart($(`chart-${name}`), { xs, series, to: options.now, ...options });
  legend($(`legend-${name}`), series);
}

export function renderHistory(h) {
  const now = h.at.length ? h.at[h.at.length - 1] : Date.now() / 1000;
  // A manager up for less than the window draws what it has across the whole width.
  const from = Math.max(now - h.window_s, h.at.length ? h.at[0] : now - h.window_s);
  const statuses = Object.entries(h.observers).map(([status, values]) => ({
    key: status, label: status, values, cls: `st-${status}`,
  }));
  chart("observers", h.at, statuses, { now, from });

  const m = h.per_minute;
  const rates = [
    { key: "created", label: "created", values: m.created, cls: "st-Created" },
    { key: "stopped", label: "stopped (Deleted)", values: m.stopped, cls: "st-Deleted" },
    { key: "failed", label: "Failed", values: m.failed, cls: "st-Failed" },
  ];
  chart("rates", m.at, rates, { now, from, unit: "/min", step: 60 });
  chart("failovers", m.at, [{ key: "failovers", label: "taken over", values: m.failovers, cls: "st-OnDeleting" }],
    { now, from, unit: "/min", step: 60 });

  const loads = h.services.map((s, i) => ({
    key: s.name, label: s.name, cls: `c${i % SERVICE_COLOURS}`,
    values: s.running.map((r, j) => (r === null || !s.workers[j] ? null : Math.round((100 * r) / s.workers[j]))),
  }));
  chart("load", h.at, loads, { now, from, unit: "%", least: 100 });
  setText($("history-note"), `sampled every ${h.period_s} s by this manager since it started (kept in its memory)`);
}
