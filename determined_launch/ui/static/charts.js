// det-launch ui: every chart. Line charts are uPlot (static/vendor, MIT): the value of each
// series under the pointer in the legend, drag to zoom, double-click to reset, a log-scale
// toggle and TensorBoard's smoothing. Parallel coordinates and scatters are SVG (uPlot draws
// neither); their axes can be brushed to filter the trials.
"use strict";
const COLORS = ["#2463eb", "#16a34a", "#9333ea", "#0891b2", "#ca8a04", "#db2777", "#4b5563",
  "#65a30d", "#7c3aed", "#0d9488", "#c2410c", "#1e40af"];
const BEST = "#e8590c";
function score(q, smaller) { // a curve's best value, best first
  const v = q.points.map((p) => p[1]).filter((y) => y !== null);
  if (!v.length) return Infinity;
  return smaller ? Math.min(...v) : -Math.max(...v);
}
// Charts outlive the page's redraws (each second): one per key, with the user's settings.
const chartState = new Map(); // key -> {el, u, sig, series, log, smooth}
const chartBrushes = new Map(); // parallel-coordinates key -> {axis: [lo, hi] in 0..1}
// key -> the brush being dragged {axis, ax, y0, y1} (svg units): part of what a redraw draws, so a
// redraw mid-drag (a poll tick, a new trial that moves the page's sections) never loses the band
const chartDrags = new Map();

function ticks(lo, hi, n) {
  if (!(hi > lo)) return [lo];
  const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
  const err = (hi - lo) / n / step;
  const s = step * (err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1);
  const out = [];
  for (let v = Math.ceil(lo / s) * s; v <= hi + s * 1e-9; v += s) out.push(+v.toPrecision(12));
  return out;
}

// TensorBoard's smoothing: an exponential moving average, debiased so the first points are
// not pulled towards 0; missing values stay missing.
function ema(ys, weight) {
  if (!(weight > 0)) return ys;
  let last = 0, n = 0;
  return ys.map((y) => {
    if (y === null || y === undefined || !Number.isFinite(y)) return y;
    last = last * weight + (1 - weight) * y;
    n++;
    return last / (1 - Math.pow(weight, n));
  });
}

// uPlot wants one x array and one y array per series, aligned (null where a series has no
// point at that x).
function aligned(series, smooth) {
  const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))]
    .filter((x) => x !== null).sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  return [xs, ...series.map((s) => {
    const ys = new Array(xs.length).fill(null);
    for (const [x, y] of s.points) if (x !== null && typeof y === "number") ys[at.get(x)] = y;
    return ema(ys, smooth);
  })];
}

// series: [{name, points: [[x, y]], color, bold, dim}]; opts: {key, xlabel, ylabel}
function lineChart(title, series, opts) {
  opts = typeof opts === "string" ? {xlabel: opts} : opts || {};
  const key = opts.key || title;
  const sig = JSON.stringify([title, series.map((s) => [s.name, s.color, !!s.bold, !!s.dim])]);
  let c = chartState.get(key);
  if (c && c.sig === sig) {
    if (c.series !== series) { c.series = series; c.u.setData(aligned(series, c.smooth), !c.zoomed); }
    return c.el;
  }
  const keep = c ? {log: c.log, smooth: c.smooth} : {log: false, smooth: 0};
  if (c) c.u.destroy();
  c = {sig, series, ...keep, zoomed: false};
  chartState.set(key, c);
  c.el = h("div", {class: "chart uchart", "data-key": key, "data-keep": ""}); // patch() keeps it
  const positive = series.every((s) => s.points.every((p) => typeof p[1] !== "number" || p[1] > 0));
  if (!positive) c.log = false;
  const plot = h("div", {class: "plot"});
  const shown = h("span", {class: "muted"}, c.smooth ? c.smooth.toFixed(2) : "off");
  const tools = h("div", {class: "chart-tools"},
    h("label", {title: positive ? "logarithmic y axis" : "a value ≤ 0: no log scale"},
      h("input", {type: "checkbox", class: "log", checked: c.log ? "" : null, disabled: positive ? null : "",
        onchange: (ev) => { c.log = ev.target.checked; draw(); }}), " log y"),
    h("label", {title: "TensorBoard's smoothing: a debiased exponential moving average"}, " smoothing ",
      h("input", {type: "range", class: "smooth", min: 0, max: 0.99, step: 0.01, value: c.smooth,
        oninput: (ev) => { c.smooth = Number(ev.target.value);
          shown.textContent = c.smooth ? c.smooth.toFixed(2) : "off";
          c.u.setData(aligned(c.series, c.smooth), !c.zoomed); }}), " ", shown),
    h("span", {class: "muted"}, "drag to zoom, double-click to reset"));
  c.el.append(plot, tools);
  // the y axis's title: given, else what follows "group: " in the chart's title
  const ylabel = opts.ylabel ?? (title.includes(": ") ? title.split(": ").slice(1).join(": ") : "");
  const draw = () => {
    if (c.u) c.u.destroy();
    const many = series.length > 12;
    c.u = new uPlot({
      title, width: opts.width || 520, height: opts.height || 240,
      scales: {x: {time: false}, y: {distr: c.log ? 3 : 1}},
      axes: [{label: opts.xlabel || "steps completed", size: 40}, {label: ylabel, size: 60,
        values: c.log ? undefined : (u, vals) => vals.map((v) => fmt(v))}],
      series: [{label: opts.xlabel || "steps", value: (u, v) => fmt(v)},
        ...series.map((s) => ({label: s.name, stroke: s.dim ? s.color + "88" : s.color,
          width: s.bold ? 2.6 : many ? 1 : 1.4, spanGaps: true,
          points: {show: s.points.length < 3}, value: (u, v) => fmt(v)}))],
      cursor: {drag: {x: true, y: false}, focus: {prox: 16}},
      focus: {alpha: series.length > 1 ? 0.35 : 1},
      legend: {live: true},
      hooks: {setScale: [(u, k) => { if (k === "x") c.zoomed = u.scales.x.min > u.data[0][0]
        || u.scales.x.max < u.data[0][u.data[0].length - 1]; }]},
    }, aligned(c.series, c.smooth), plot);
    c.el.uplot = c.u; // for tests and the console
  };
  draw();
  return c.el;
}

// A hyperparameter's or the metric's axis: numbers (log when they span > 2 decades) or
// categories, each as a unit position 0..1 with real tick labels.
function axisScale(vals, categorical) {
  vals = vals.filter((v) => v !== null && v !== undefined);
  if (!categorical && vals.length && vals.every((v) => typeof v === "number")) {
    let lo = Math.min(...vals), hi = Math.max(...vals);
    const log = lo > 0 && hi / lo > 100;
    const tr = (v) => log ? Math.log10(v) : v;
    let a = tr(lo), b = tr(hi);
    if (a === b) { a -= log ? 0.5 : Math.abs(a) * 0.1 || 1; b += log ? 0.5 : Math.abs(b) * 0.1 || 1; }
    const f = (v) => (tr(v) - a) / (b - a);
    const tv = log ? ticks(Math.ceil(a), Math.floor(b), 5).filter(Number.isInteger).map((e) => 10 ** e)
      : ticks(a, b, 5);
    return {f, ticks: (tv.length ? tv : [lo, hi]).map((v) => [f(v), v]), kind: log ? "log" : "linear"};
  }
  const cats = [...new Set(vals)].sort((a, b) => a < b ? -1 : a > b ? 1 : 0).map(String);
  const f = (v) => cats.length < 2 ? 0.5 : cats.indexOf(String(v)) / (cats.length - 1);
  return {f, ticks: cats.map((c) => [f(c), c]), kind: "category"};
}

function hpNames(trials) {
  return [...new Set(trials.flatMap((t) => Object.keys(t.hparams || {})))].sort();
}

// The trials inside every brush of the parallel-coordinates chart `key` (null: no brush).
function brushedIds(key, trials, metric, cats) {
  const br = chartBrushes.get(key);
  if (!br || !Object.keys(br).length) return null;
  const value = (t, a) => a === metric ? t.best_value : (t.hparams || {})[a];
  const scales = Object.fromEntries(Object.keys(br).map((a) => [a, axisScale(trials.map((t) => value(t, a)), cats && cats.has(a))]));
  return new Set(trials.filter((t) => Object.entries(br).every(([a, [lo, hi]]) => {
    const v = value(t, a);
    if (v === null || v === undefined) return false;
    const u = scales[a].f(v);
    return u >= lo - 1e-9 && u <= hi + 1e-9;
  })).map((t) => t.trial_id));
}

// Parallel coordinates: one axis per hyperparameter and one for the metric. Drag along an
// axis to keep the trials inside (the trial list follows); a click on an axis clears it.
// cats: the hyperparameters the search space declares categorical.
function parallel(trials, metric, smaller, bestId, key, cats) {
  key = key || "parallel";
  const br = chartBrushes.get(key) || {};
  chartBrushes.set(key, br);
  const axes = [...hpNames(trials), metric];
  const W = Math.max(460, 130 * axes.length), H = 300, T = 48, B = 26, L = 50, R = 60;
  const svg = h("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "parallel coordinates",
    "data-brushes": key},
    h("text", {x: 8, y: 15, class: "title"}, "hyperparameters (parallel coordinates: drag an axis to filter)"));
  const value = (t, a) => a === metric ? t.best_value : (t.hparams || {})[a];
  const scales = axes.map((a) => axisScale(trials.map((t) => value(t, a)), cats && cats.has(a)));
  const x = (i) => L + i * (W - L - R) / Math.max(1, axes.length - 1);
  const y = (u) => H - B - u * (H - T - B);
  const unit = (py) => Math.min(1, Math.max(0, (H - B - py) / (H - T - B)));
  const ms = trials.map((t) => t.best_value).filter((v) => v !== null && v !== undefined);
  const mlo = Math.min(...ms), mhi = Math.max(...ms);
  const kept = brushedIds(key, trials, metric, cats);
  const ordered = trials.slice().sort((a, b) => (a.trial_id === bestId) - (b.trial_id === bestId));
  for (const t of ordered) {
    const d = axes.map((a, i) => {
      const v = value(t, a);
      return v === null || v === undefined ? null : `${x(i).toFixed(1)},${y(scales[i].f(v)).toFixed(1)}`;
    });
    if (d.some((p) => p === null)) continue;
    const good = mhi === mlo ? 0.5 : (smaller ? mhi - t.best_value : t.best_value - mlo) / (mhi - mlo);
    const best = t.trial_id === bestId, out = kept && !kept.has(t.trial_id);
    svg.append(h("polyline", {points: d.join(" "), fill: "none", class: out ? "series out" : "series",
      "data-trial": t.trial_id,
      stroke: out ? "#d0d5dd" : best ? BEST : `hsl(${Math.round(220 * good)}, 70%, 45%)`,
      "stroke-width": best ? 3 : 1.2, opacity: out ? 0.5 : best ? 1 : 0.6},
    h("title", {}, `trial ${t.trial_id}: ${axes.map((a) => `${a}=${fmt(value(t, a))}`).join(", ")}`)));
  }
  axes.forEach((a, i) => {
    svg.append(h("line", {x1: x(i), x2: x(i), y1: T, y2: H - B, stroke: "#667085"}),
      h("text", {x: x(i), y: T - 10, "text-anchor": "middle", class: "title"}, a));
    for (const [u, lab] of scales[i].ticks) {
      svg.append(h("line", {x1: x(i) - 3, x2: x(i), y1: y(u), y2: y(u), stroke: "#667085"}),
        h("text", {x: x(i) + 5, y: y(u) + 4}, fmt(lab)));
    }
    if (br[a]) svg.append(h("rect", {class: "brush", x: x(i) - 8, width: 16, y: y(br[a][1]),
      height: Math.max(1, y(br[a][0]) - y(br[a][1])), fill: "#2463eb", "fill-opacity": 0.18,
      stroke: "#2463eb"}));
    // the brush's grip: a band along the axis that takes the pointer
    svg.append(h("rect", {class: "axis-grip", "data-axis": a, x: x(i) - 12, width: 24, y: T - 8,
      height: H - T - B + 16, fill: "transparent", style: "cursor: ns-resize",
      onmousedown: (ev) => startBrush(ev, key, a, unit, x(i))}));
  });
  const drag = chartDrags.get(key);
  if (drag) svg.append(dragBand(drag));
  return h("div", {class: "chart parallel"}, svg);
}

const dragBand = (d) => h("rect", {class: "brush dragging", x: d.ax - 8, width: 16,
  y: Math.min(d.y0, d.y1), height: Math.abs(d.y1 - d.y0), fill: "#2463eb", "fill-opacity": 0.18,
  stroke: "#2463eb"});

// A brush drag: its state lives in chartDrags (a redraw draws it); the pointer is read against
// whichever svg the page shows now (a redraw may have replaced the one pressed on).
function startBrush(ev, key, axis, unit, ax) {
  ev.preventDefault();
  const svgNow = () => document.querySelector(`svg[data-brushes="${key}"]`);
  const toSvg = (e) => { const svg = svgNow(); const p = svg.createSVGPoint(); p.x = e.clientX;
    p.y = e.clientY; return p.matrixTransform(svg.getScreenCTM().inverse()).y; };
  const drag = {axis, ax, y0: toSvg(ev), y1: toSvg(ev)};
  chartDrags.set(key, drag);
  const draw = () => { const svg = svgNow(); if (!svg) return;
    const band = svg.querySelector("rect.brush.dragging");
    if (band) band.replaceWith(dragBand(drag)); else svg.append(dragBand(drag)); };
  draw();
  const move = (e) => { if (svgNow()) { drag.y1 = toSvg(e); draw(); } };
  const up = (e) => {
    window.removeEventListener("mousemove", move); window.removeEventListener("mouseup", up);
    chartDrags.delete(key);
    if (svgNow()) drag.y1 = toSvg(e);
    const br = chartBrushes.get(key);
    if (Math.abs(drag.y1 - drag.y0) < 3) delete br[axis]; // a click clears this axis
    else br[axis] = [unit(Math.max(drag.y0, drag.y1)), unit(Math.min(drag.y0, drag.y1))];
    rerender();
  };
  window.addEventListener("mousemove", move);
  window.addEventListener("mouseup", up);
}

// The metric against each hyperparameter, one small scatter each (hover a dot for its trial).
function scatters(trials, metric, bestId, key, cats) {
  const kept = brushedIds(key || "parallel", trials, metric, cats);
  const ms = axisScale(trials.map((t) => t.best_value));
  return hpNames(trials).map((a) => {
    const W = 300, H = 220, L = 52, R = 10, T = 22, B = 36;
    const sc = axisScale(trials.map((t) => (t.hparams || {})[a]), cats && cats.has(a));
    // inset from the axes: the extremes are points, not lines on the frame
    const px = (u) => L + 10 + u * (W - L - R - 20), py = (u) => H - B - 8 - u * (H - T - B - 16);
    const svg = h("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${metric} against ${a}`},
      h("text", {x: 8, y: 14, class: "title"}, `${metric} against ${a}`),
      h("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#98a2b3"}),
      h("line", {x1: L, x2: L, y1: T, y2: H - B, stroke: "#98a2b3"}),
      h("text", {x: (L + W - R) / 2, y: H - 3, "text-anchor": "middle"}, `${a}${sc.kind === "log" ? " (log)" : ""}`),
      h("text", {x: 12, y: (T + H - B) / 2, "text-anchor": "middle",
        transform: `rotate(-90 12 ${(T + H - B) / 2})`}, metric));
    for (const [u, lab] of sc.ticks) svg.append(h("text", {x: px(u), y: H - B + 14, "text-anchor": "middle"}, fmt(lab)));
    for (const [u, lab] of ms.ticks) svg.append(h("text", {x: L - 4, y: py(u) + 4, "text-anchor": "end"}, fmt(lab)));
    for (const t of trials) {
      const v = (t.hparams || {})[a];
      if (v === null || v === undefined || typeof t.best_value !== "number") continue;
      const out = kept && !kept.has(t.trial_id), best = t.trial_id === bestId;
      const jit = sc.kind === "category" ? ((t.trial_id * 0.618) % 1 - 0.5) * 0.08 : 0; // see each dot
      svg.append(h("circle", {cx: px(sc.f(v)) + jit * (W - L - R), cy: py(ms.f(t.best_value)), r: best ? 4.5 : 3,
        class: "dot", fill: out ? "#d0d5dd" : best ? BEST : "#2463eb", opacity: 0.75},
      h("title", {}, `trial ${t.trial_id}: ${a}=${fmt(v)}, ${metric}=${fmt(t.best_value)}`)));
    }
    return h("div", {class: "chart scatter"}, svg);
  });
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

// -- the experiment page's charts ------------------------------------------------------------
const CHART_TRIALS = 300; // thousands of lines say nothing and cost the browser
const NAMES_EVERY_MS = 10_000; // the groups and names a search reports change rarely

function bestFirst(curves, smaller) {
  return curves.slice().sort((a, b) => score(a, smaller) - score(b, smaller));
}

// -> {toolbar, charts, kept: the trial ids inside the parallel coordinates' brushes, or null}.
// searcher: the /searcher_metric curves; picked: the selected trial ids (a Set).
async function experimentCharts(name, x, trials, searcher, picked) {
  const base = `${API}/experiments/${enc(name)}`;
  const st = page.charts || (page.charts = {group: "", metric: "", which: "all", names: null, at: 0});
  if (!st.asking && Date.now() - st.at > NAMES_EVERY_MS) { // never in the way of the first paint
    st.asking = true;
    get(`${base}/metric_names`).then((r) => { st.names = r.data; if (r.changed) rerender(); })
      .catch(() => {}).finally(() => { st.asking = false; st.at = Date.now(); });
  }
  const bestId = x.best_trial ? x.best_trial.trial_id : null;
  const ranked = bestFirst(searcher, x.smaller_is_better);
  const ids = st.which === "selected" ? [...picked].sort((a, b) => a - b)
    : ranked.slice(0, CHART_TRIALS).map((q) => q.trial_id);
  let curves, label;
  if (!st.metric) {
    const want = new Set(ids);
    curves = searcher.filter((q) => want.has(q.trial_id));
    label = `${x.metric} (searcher metric)`;
  } else {
    curves = ids.length ? (await get(`${base}/metrics?group=${enc(st.group)}&metric=${enc(st.metric)}`
      + `&trials=${ids.join(",")}`)).data : [];
    label = `${st.group}: ${st.metric}`;
  }
  const few = st.which === "selected" ? ` (${ids.length} selected)`
    : searcher.length > CHART_TRIALS ? ` (best ${CHART_TRIALS} of ${searcher.length})` : "";
  const series = curves.map((q, i) => ({name: `trial ${q.trial_id}`, points: q.points,
    color: q.trial_id === bestId ? BEST : COLORS[i % COLORS.length],
    bold: q.trial_id === bestId, dim: bestId !== null && q.trial_id !== bestId}));
  const groups = (st.names && st.names.groups) || {};
  const picker = h("select", {class: "metric-pick", onchange: (ev) => {
    [st.group, st.metric] = ev.target.value ? JSON.parse(ev.target.value) : ["", ""]; rerender(); }},
  h("option", {value: ""}, `searcher metric: ${x.metric}`),
  Object.entries(groups).map(([g, ms]) => h("optgroup", {label: g}, ms.map((m) => h("option", {
    value: JSON.stringify([g, m]), selected: g === st.group && m === st.metric ? "" : null}, m)))));
  const which = h("select", {class: "trials-pick", onchange: (ev) => { st.which = ev.target.value; rerender(); }},
    h("option", {value: "all", selected: st.which === "all" ? "" : null}, "all trials"),
    h("option", {value: "selected", selected: st.which === "selected" ? "" : null},
      "the selected trials (tick them below)"));
  const cats = new Set((st.names && st.names.categorical_hparams) || []);
  const drawn = new Set(ids);
  const inChart = trials.filter((r) => drawn.has(r.trial_id));
  const kept = brushedIds("parallel", inChart, x.metric, cats); // the scales of the trials drawn
  return {
    kept,
    toolbar: h("div", {class: "toolbar"}, h("span", {}, "chart"), picker, which,
      kept ? h("span", {class: "muted"}, `${kept.size} of ${trials.length} trials inside the `
        + "parallel coordinates' brushes (click an axis to clear it)") : null),
    charts: [lineChart(`${label} by trial${few}`, series, {key: "experiment", xlabel: "steps completed",
      ylabel: st.metric || x.metric}),
    trials.length ? parallel(inChart, x.metric, x.smaller_is_better, bestId, "parallel", cats) : null,
    ...(trials.length ? scatters(inChart, x.metric, bestId, "parallel", cats) : [])],
  };
}
