// Small line charts drawn as plain inline SVG: no library, nothing fetched. One function,
// lineChart, redraws one <svg> from columns of numbers; a null value breaks its line (a
// gap in the samples, a service not alive then).

const NS = "http://www.w3.org/2000/svg";
const W = 320; // the viewBox; the SVG scales with its box (style.css)
const H = 120;
const PAD = { left: 34, right: 6, top: 8, bottom: 16 };

function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A round upper bound for the y axis: 1, 2 or 5 times a power of ten, at least `least`. */
export function niceMax(value, least = 1) {
  const top = Math.max(value, least);
  const step = 10 ** Math.floor(Math.log10(top));
  return [1, 2, 5, 10].map((m) => m * step).find((m) => m >= top);
}

function ago(seconds) {
  return seconds < 120 ? `${Math.round(seconds)} s` : `${Math.round(seconds / 60)} min`;
}

/**
 * "M x,y L x,y …" through the points; null values start a new piece. With `step` (seconds),
 * each value is a flat segment from its time to its time + step (a count per minute), so a
 * single minute still draws a line; x values are kept inside [from, to].
 */
export function pathOf(xs, ys, x, y, { step = 0, from = -Infinity, to = Infinity } = {}) {
  const clamp = (t) => Math.min(to, Math.max(from, t));
  let d = "";
  let pen = "M";
  for (let i = 0; i < xs.length; i += 1) {
    if (ys[i] === null || ys[i] === undefined) {
      pen = "M";
      continue;
    }
    const level = y(ys[i]).toFixed(1);
    d += `${pen}${x(clamp(xs[i])).toFixed(1)},${level} `;
    if (step) d += `L${x(clamp(xs[i] + step)).toFixed(1)},${level} `;
    pen = "L";
  }
  return d.trim();
}

/**
 * Redraw `svg`: series [{key, label, values, cls}] over the times `xs` (Unix seconds),
 * from `from` to `to`. `unit` follows the y axis' top value ("%", "/min", ""); `step` draws
 * each value as a flat segment that long (see pathOf).
 */
export function lineChart(svg, { xs, series, from, to, unit = "", least = 1, step = 0 }) {
  const top = niceMax(Math.max(0, ...series.flatMap((s) => s.values.filter((v) => v !== null))), least);
  const x = (t) => PAD.left + ((t - from) / Math.max(1, to - from)) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (v / top) * (H - PAD.top - PAD.bottom);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const parts = [
    svgEl("line", { class: "axis", x1: PAD.left, y1: y(0), x2: W - PAD.right, y2: y(0) }),
    svgEl("line", { class: "grid", x1: PAD.left, y1: y(top), x2: W - PAD.right, y2: y(top) }),
    svgEl("text", { class: "tick", x: PAD.left - 3, y: y(top) + 4, "text-anchor": "end" }, `${top}${unit}`),
    svgEl("text", { class: "tick", x: PAD.left - 3, y: y(0), "text-anchor": "end" }, "0"),
    svgEl("text", { class: "tick", x: PAD.left, y: H - 3 }, `−${ago(to - from)}`),
    svgEl("text", { class: "tick", x: W - PAD.right, y: H - 3, "text-anchor": "end" }, "now"),
  ];
  for (const s of series) {
    const drawn = s.values.filter((v) => v !== null);
    const path = svgEl("path", { class: `line ${s.cls ?? ""}`, d: pathOf(xs, s.values, x, y, { step, from, to }),
      "data-series": s.key, "data-points": drawn.length, "data-max": Math.max(0, ...drawn),
      "data-last": drawn.length ? drawn[drawn.length - 1] : "", "data-sum": drawn.reduce((a, b) => a + b, 0) });
    path.append(svgEl("title", {}, s.label));
    parts.push(path);
  }
  svg.replaceChildren(...parts);
}
