// det-launch ui: every chart (line charts, parallel coordinates, bars). Inline SVG.
"use strict";
const COLORS = ["#2463eb", "#16a34a", "#9333ea", "#0891b2", "#ca8a04", "#db2777", "#4b5563",
  "#65a30d", "#7c3aed", "#0d9488", "#c2410c", "#1e40af"];
const CHART_TRIALS = 300;
function score(q, smaller) { // a curve's best value, best first
  const v = q.points.map((p) => p[1]).filter((y) => y !== null);
  if (!v.length) return Infinity;
  return smaller ? Math.min(...v) : -Math.max(...v);
}

function ticks(lo, hi, n) {
  if (!(hi > lo)) return [lo];
  const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
  const err = (hi - lo) / n / step;
  const s = step * (err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1);
  const out = [];
  for (let v = Math.ceil(lo / s) * s; v <= hi + s * 1e-9; v += s) out.push(+v.toPrecision(12));
  return out;
}

// series: [{name, points: [[x, y]], color, bold}]
function lineChart(title, series, xlabel) {
  const W = 460, H = 250, L = 56, R = 12, T = 24, B = 34;
  const pts = series.flatMap((s) => s.points).filter((p) => p[1] !== null && p[0] !== null);
  const svg = h("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title},
    h("text", {x: L, y: 15, class: "title"}, title));
  if (!pts.length) {
    svg.append(h("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, "no data yet"));
    return h("div", {class: "chart"}, svg);
  }
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...pts.map((p) => p[1])), Math.max(...pts.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  for (const v of ticks(y0, y1, 5)) {
    svg.append(h("line", {x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: "#eef0f3"}),
      h("text", {x: L - 5, y: sy(v) + 4, "text-anchor": "end"}, fmt(v)));
  }
  for (const v of ticks(x0, x1, 6)) {
    svg.append(h("text", {x: sx(v), y: H - B + 15, "text-anchor": "middle"}, fmt(v)));
  }
  svg.append(h("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#98a2b3"}),
    h("text", {x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle"}, xlabel || "steps"));
  const ordered = series.slice().sort((a, b) => (a.bold ? 1 : 0) - (b.bold ? 1 : 0));
  ordered.forEach((s) => {
    const p = s.points.filter((q) => q[1] !== null && q[0] !== null);
    if (!p.length) return;
    const d = p.map((q, i) => `${i ? "L" : "M"}${sx(q[0]).toFixed(1)},${sy(q[1]).toFixed(1)}`).join("");
    svg.append(h("path", {d, fill: "none", stroke: s.color, "stroke-width": s.bold ? 2.6 : 1.3,
      opacity: s.dim ? 0.45 : 1, class: "series"}, h("title", {}, s.name)));
    if (p.length === 1) svg.append(h("circle", {cx: sx(p[0][0]), cy: sy(p[0][1]), r: 3, fill: s.color}));
  });
  if (series.length <= 8 && series.length > 1) {
    series.forEach((s, i) => svg.append(h("text", {x: W - R - 4, y: T + 12 * i + 4,
      "text-anchor": "end", fill: s.color, style: `fill:${s.color}`}, s.name)));
  }
  return h("div", {class: "chart"}, svg);
}

// Parallel coordinates: one axis per hyperparameter and one for the metric.
function parallel(trials, metric, smaller, bestId) {
  const names = [...new Set(trials.flatMap((t) => Object.keys(t.hparams || {})))].sort();
  const axes = [...names, metric];
  const W = Math.max(460, 130 * axes.length), H = 290, T = 48, B = 26, L = 50, R = 50;
  const svg = h("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "parallel coordinates"},
    h("text", {x: 8, y: 15, class: "title"}, "hyperparameters (parallel coordinates)"));
  const value = (t, a) => a === metric ? t.best_value : (t.hparams || {})[a];
  const scales = axes.map((a) => {
    const vals = trials.map((t) => value(t, a)).filter((v) => v !== null && v !== undefined);
    if (vals.length && vals.every((v) => typeof v === "number")) {
      let lo = Math.min(...vals), hi = Math.max(...vals);
      const log = lo > 0 && hi / lo > 100;
      if (log) { lo = Math.log10(lo); hi = Math.log10(hi); }
      if (lo === hi) { lo -= 1; hi += 1; }
      return {f: (v) => ((log ? Math.log10(v) : v) - lo) / (hi - lo),
        labels: [[0, log ? 10 ** lo : lo], [1, log ? 10 ** hi : hi]]};
    }
    const cats = [...new Set(vals.map(String))].sort();
    return {f: (v) => cats.length < 2 ? 0.5 : cats.indexOf(String(v)) / (cats.length - 1),
      labels: cats.map((c, i) => [cats.length < 2 ? 0.5 : i / (cats.length - 1), c])};
  });
  const x = (i) => L + i * (W - L - R) / Math.max(1, axes.length - 1);
  const y = (u) => H - B - u * (H - T - B);
  const ms = trials.map((t) => t.best_value).filter((v) => v !== null);
  const mlo = Math.min(...ms), mhi = Math.max(...ms);
  const ordered = trials.slice().sort((a, b) => (a.trial_id === bestId) - (b.trial_id === bestId));
  for (const t of ordered) {
    const d = axes.map((a, i) => {
      const v = value(t, a);
      return v === null || v === undefined ? null : `${x(i).toFixed(1)},${y(scales[i].f(v)).toFixed(1)}`;
    });
    if (d.some((p) => p === null)) continue;
    const good = t.best_value === null || mhi === mlo ? 0.5
      : (smaller ? mhi - t.best_value : t.best_value - mlo) / (mhi - mlo);
    const best = t.trial_id === bestId;
    svg.append(h("polyline", {points: d.join(" "), fill: "none", class: "series",
      stroke: best ? "#e8590c" : `hsl(${Math.round(220 * good)}, 70%, 45%)`,
      "stroke-width": best ? 3 : 1.2, opacity: best ? 1 : 0.55},
    h("title", {}, `trial ${t.trial_id}`)));
  }
  axes.forEach((a, i) => {
    svg.append(h("line", {x1: x(i), x2: x(i), y1: T, y2: H - B, stroke: "#667085"}),
      h("text", {x: x(i), y: T - 8, "text-anchor": "middle", class: "title"}, a));
    for (const [u, lab] of scales[i].labels) {
      svg.append(h("text", {x: x(i) + 4, y: y(u) + 4}, fmt(lab)));
    }
  });
  return h("div", {class: "chart"}, svg);
}

function bars(title, entries) {
  const W = 460, row = 22, L = 130, T = 26, H = T + row * entries.length + 8;
  const top = Math.max(...entries.map((e) => e[1]), 1e-12);
  const svg = h("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title},
    h("text", {x: 8, y: 15, class: "title"}, title));
  entries.forEach(([name, v], i) => {
    const y = T + i * row;
    svg.append(h("text", {x: L - 6, y: y + 14, "text-anchor": "end"}, name),
      h("rect", {x: L, y: y + 3, height: row - 8, width: Math.max(1, (W - L - 60) * v / top),
        fill: "#2463eb", class: "bar"}),
      h("text", {x: L + (W - L - 60) * v / top + 6, y: y + 14}, fmt(v)));
  });
  return h("div", {class: "chart"}, svg);
}
