// Small DOM helpers. The page is redrawn every second, so updates touch only what changed:
// rows are kept by key and texts are written only when they differ. That keeps focus, text
// selection and a button under the pointer intact while the data moves.

/** Create an element: attrs (false/null/undefined are skipped), then children (strings or nodes). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    node.setAttribute(key, value === true ? "" : String(value));
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

export function setText(node, text) {
  const value = String(text ?? "");
  if (node.textContent !== value) node.textContent = value;
}

export function setAttr(node, name, value) {
  const text = String(value ?? "");
  if (node.getAttribute(name) !== text) node.setAttribute(name, text);
}

/**
 * Make tbody's rows match items, in order, reusing the row of each key:
 * create(item) builds a new row, update(row, item) refreshes one (new rows too).
 */
export function syncRows(tbody, items, keyOf, create, update) {
  const existing = new Map();
  for (const row of tbody.rows) existing.set(row.dataset.key, row);
  let cursor = tbody.firstElementChild;
  for (const item of items) {
    const key = String(keyOf(item));
    let row = existing.get(key);
    if (row) {
      existing.delete(key);
    } else {
      row = create(item);
      row.dataset.key = key;
    }
    update(row, item);
    if (row !== cursor) tbody.insertBefore(row, cursor);
    else cursor = cursor.nextElementSibling;
  }
  for (const row of existing.values()) row.remove();
}

/**
 * Make a <select>'s options match [{value, label}] after a fixed first option ("any"),
 * keeping the current choice even if it disappeared from the list (it is still the filter).
 */
export function syncOptions(select, options, keepFirst = true) {
  const current = select.value;
  const wanted = [...options];
  if (current && !wanted.some((o) => o.value === current)) wanted.push({ value: current, label: current });
  const fixed = keepFirst ? 1 : 0;
  const have = [...select.options].slice(fixed).map((o) => `${o.value}\u0000${o.textContent}`);
  const want = wanted.map((o) => `${o.value}\u0000${o.label}`);
  if (have.join("\u0001") === want.join("\u0001")) return;
  while (select.options.length > fixed) select.remove(fixed);
  for (const o of wanted) select.append(el("option", { value: o.value }, o.label));
  select.value = current;
}

/** A <meter> with its numbers as text beside it (a meter alone is not read out everywhere). */
export function makeLoad() {
  const meter = el("meter", { min: 0, max: 1, value: 0, low: 0.7, high: 0.9, optimum: 0.2 });
  const label = el("span", { class: "load-text" });
  return el("span", { class: "load" }, meter, label);
}

export function updateLoad(load, used, total) {
  const [meter, label] = load.children;
  const max = Math.max(total, 1);
  setAttr(meter, "max", max);
  setAttr(meter, "low", max * 0.7);
  setAttr(meter, "high", max * 0.9);
  setAttr(meter, "optimum", max * 0.2);
  setAttr(meter, "value", Math.min(used, max));
  setText(label, total > 0 ? `${Math.round((100 * used) / total)} %` : "—");
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "";
}

/** "12 s", "3 min", "2 h", "4 d": ages read at a glance. */
export function formatAge(seconds) {
  if (!Number.isFinite(seconds)) return "";
  const s = Math.max(0, seconds);
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 120) return `${Math.round(s)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

export function ageSince(iso) {
  return formatAge((Date.now() - Date.parse(iso)) / 1000);
}

export function formatTime(iso) {
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}
