// det-launch ui: the pages. Plain DOM + inline SVG; data only from /api/v1/.
// Every page re-renders from the API once a second; unchanged answers are 304s.
"use strict";
const API = "/api/v1";
const COLORS = ["#2463eb", "#16a34a", "#9333ea", "#0891b2", "#ca8a04", "#db2777", "#4b5563",
  "#65a30d", "#7c3aed", "#0d9488", "#c2410c", "#1e40af"];
const cache = new Map(); // url -> {etag, data}
const CHART_TRIALS = 300;
function score(q, smaller) { // a curve's best value, best first
  const v = q.points.map((p) => p[1]).filter((y) => y !== null);
  if (!v.length) return Infinity;
  return smaller ? Math.min(...v) : -Math.max(...v);
}
const enc = encodeURIComponent;

class NotFound extends Error {}
// primary: the page's own thing (an experiment, a trial, a run); its 404 ends the page
async function get(url, text, primary) {
  const old = cache.get(url);
  const headers = old ? {"If-None-Match": old.etag} : {};
  const r = await fetch(url, {headers, cache: "no-store", credentials: "same-origin"});
  if (r.status === 304 && old) return {data: old.data, changed: false, headers: r.headers};
  if (r.status === 404 && primary) throw new NotFound(url);
  if (!r.ok) throw new Error(`${url}: ${r.status}`);
  const data = text ? await r.text() : await r.json();
  cache.set(url, {etag: r.headers.get("ETag"), data});
  return {data, changed: true, headers: r.headers};
}

function h(tag, attrs, ...kids) {
  const svg = ["svg", "path", "line", "text", "g", "rect", "circle", "title", "polyline"]
    .includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v); else el.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

const fmt = (v) => v === null || v === undefined ? "–" : typeof v === "number"
  ? (Number.isInteger(v) ? String(v) : Number(v.toPrecision(6)).toString()) : String(v);
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}
// What ended the run: its error or early exit, else the launcher's exit status.
function exitText(r) {
  if (r.error || r.early_exit) return r.error || r.early_exit;
  return r.exit_status === null || r.exit_status === undefined ? "–" : `exit status ${r.exit_status}`;
}
const when = (t) => t ? new Date(t * 1000).toLocaleString() : "–";
function dur(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m ${s % 60}s`
    : `${Math.floor(s / 3600)}h ${Math.floor(s % 3600 / 60)}m`;
}
// A state is a CSS class through its slug: "stopped (ASHA)" -> "stopped-asha".
const slug = (s) => String(s).toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "");
const state = (s) => h("span", {class: `state ${slug(s)}`}, s);

// -- tables: sortable, rendered from rows of cells --------------------------------------
function table(cols, rows, opts) {
  opts = opts || {};
  const key = opts.sortKey || "tbl";
  const sort = table.sorts[key] || {col: opts.sortCol ?? 0, asc: opts.asc ?? true};
  const sorted = rows.slice().sort((a, b) => {
    const x = a.sort[sort.col], y = b.sort[sort.col];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * (sort.asc ? 1 : -1);
  });
  const limit = opts.limit || 1000;
  const head = h("tr", {}, cols.map((c, i) => h("th", {
    class: i === sort.col ? `sorted ${sort.asc ? "asc" : ""}` : null,
    onclick: () => { table.sorts[key] = {col: i, asc: i === sort.col ? !sort.asc : true}; rerender(); },
  }, c)));
  const body = sorted.slice(0, limit).map((r) => h("tr", {class: r.cls}, r.cells.map((c) => h("td", {}, c))));
  const t = h("table", {}, h("thead", {}, head), h("tbody", {}, body));
  return rows.length > limit
    ? h("div", {}, t, h("p", {class: "muted"}, `showing ${limit} of ${rows.length} (sort to see others)`))
    : t;
}
table.sorts = {};

// -- charts --------------------------------------------------------------------------------
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

// -- pages ---------------------------------------------------------------------------------
const main = document.getElementById("main");
let page = null;

function show(...nodes) { main.replaceChildren(...nodes); }
function card(title, ...body) { return [h("h2", {}, title), h("div", {class: "card"}, ...body)]; }

async function home() {
  const [e, r] = await Promise.all([get(`${API}/experiments`), get(`${API}/runs`)]);
  if (!e.changed && !r.changed && !page.dirty) return;
  const exps = table(["name", "searcher", "state", "trials", "best", "start", "duration"],
    e.data.map((x) => ({
      cells: [h("a", {href: `/experiments/${enc(x.name)}`}, x.name), x.searcher,
        x.error ? h("span", {title: x.error}, state(x.state)) : state(x.state),
        Object.entries(x.trial_states).map(([s, n]) => `${n} ${s}`).join(", ") || "0",
        x.best_trial ? `${x.metric} ${fmt(x.best_trial.value)} (trial ${x.best_trial.trial_id})` : "–",
        when(x.start), dur(x.duration)],
      sort: [x.name, x.searcher, x.state, x.num_trials, x.best_trial ? x.best_trial.value : null,
        x.start, x.duration],
    })), {sortKey: "home-exp"});
  const runs = table(["run", "state", "steps", "start", "last update"], r.data.map((x) => ({
    cells: [h("a", {href: `/runs/${enc(x.name)}`}, x.name), state(x.state), fmt(x.steps_completed),
      when(x.start), when(x.last_update)],
    sort: [x.name, x.state, x.steps_completed, x.start, x.last_update],
  })), {sortKey: "home-runs"});
  show(h("h1", {}, "Experiments"), h("div", {class: "card"},
    e.data.length ? exps : h("p", {class: "muted"}, "No experiments under the served paths.")),
  h("h1", {}, "Runs"), h("div", {class: "card"},
    r.data.length ? runs : h("p", {class: "muted"}, "No plain runs under the served paths.")));
}

async function experiment(name) {
  const base = `${API}/experiments/${enc(name)}`;
  const [s, t, c, imp] = await Promise.all([get(base, false, true), get(`${base}/trials`),
    get(`${base}/searcher_metric`), get(`${base}/importance`)]);
  if (!s.changed && !t.changed && !c.changed && !imp.changed && !page.dirty) return;
  const x = s.data, trials = t.data;
  const bestId = x.best_trial ? x.best_trial.trial_id : null;
  const hp = [...new Set(trials.flatMap((r) => Object.keys(r.hparams || {})))].sort();
  const picked = page.picked || (page.picked = new Set());
  const cols = ["", "trial", "Optuna #", "state", ...hp, `best ${x.metric}`, `latest ${x.metric}`, "length",
    "restarts", "checkpoints"];
  const rows = trials.map((r) => ({
    cls: r.trial_id === bestId ? "best" : null,
    cells: [h("input", {type: "checkbox", checked: picked.has(r.trial_id) ? "" : null,
      onchange: (ev) => { ev.target.checked ? picked.add(r.trial_id) : picked.delete(r.trial_id); }}),
    h("a", {href: `/experiments/${enc(name)}/trials/${r.trial_id}`}, r.trial_id), fmt(r.optuna_number),
    state(r.state),
    ...hp.map((k) => fmt(r.hparams[k])), fmt(r.best_value), fmt(r.latest_value), fmt(r.length),
    fmt(r.restarts), fmt(r.checkpoints)],
    sort: [picked.has(r.trial_id) ? 0 : 1, r.trial_id, r.optuna_number, r.state, ...hp.map((k) => r.hparams[k]),
      r.best_value, r.latest_value, r.length, r.restarts, r.checkpoints],
  }));
  // Thousands of lines say nothing and cost the browser: draw the best CHART_TRIALS.
  const ranked = c.data.slice().sort((a, b) => score(a, x.smaller_is_better) - score(b, x.smaller_is_better));
  const shown = new Set(ranked.slice(0, CHART_TRIALS).map((q) => q.trial_id));
  const few = c.data.length > CHART_TRIALS ? ` (best ${CHART_TRIALS} of ${c.data.length})` : "";
  const curves = c.data.filter((q) => shown.has(q.trial_id)).map((q, i) => ({name: `trial ${q.trial_id}`, points: q.points,
    color: q.trial_id === bestId ? "#e8590c" : COLORS[i % COLORS.length],
    bold: q.trial_id === bestId, dim: bestId !== null && q.trial_id !== bestId}));
  const compare = h("button", {onclick: () => {
    const items = [...picked].map((id) => `exp:${name}:${id}`).join(",");
    location.href = `/compare?items=${enc(items)}`;
  }}, "Compare selected");
  const acts = (await get(`${API}/actions`)).data;
  // Determined's buttons: pause (checkpoint and stop), kill (stop, canceled), activate (resume)
  const action = (verb, label, ask, said) => acts[verb] ? h("button", {class: `action ${verb}`,
    onclick: async (ev) => {
      if (!confirm(ask)) return;
      ev.target.disabled = true;
      const r = await fetch(`${base}/${verb}`, {method: "POST", credentials: "same-origin",
        headers: {"X-CSRF-Token": acts.csrf}});
      const body = await r.json();
      ev.target.replaceWith(h("span", {class: r.ok ? "muted" : "error"}, r.ok ? said(body) : body.error));
    }}, label) : null;
  const live = ["running", "paused", "stopped", "pending"].includes(x.state);
  const pause = x.state === "running" ? action("pause", "Pause experiment",
    `Pause experiment ${x.name}? Its running trials checkpoint and stop; activate it to resume.`,
    (b) => `pausing: trials ${b.preempted_trials.join(", ")} asked to checkpoint and stop`) : null;
  const kill = live ? action("kill", "Kill experiment",
    `Kill experiment ${x.name}? Its trials stop now and it cannot be activated again.`,
    (b) => b.message || "killed") : null;
  const activate = ["paused", "stopped"].includes(x.state) ? action("activate", "Activate experiment",
    `Activate experiment ${x.name}? Its search resumes from the trials' checkpoints.`,
    (b) => b.message || "activated") : null;
  show(h("h1", {}, `Experiment ${x.name}`),
    h("div", {class: "card"}, h("dl", {class: "kv"},
      ...[["state", state(x.state)], ["searcher", x.searcher], ["metric",
        `${x.metric} (${x.smaller_is_better ? "smaller" : "larger"} is better)`],
      ["trials", `${x.num_trials} of ${fmt(x.max_trials)}`],
      ["best", x.best_trial ? `trial ${x.best_trial.trial_id}: ${fmt(x.best_trial.value)}` : "–"],
      ["start", when(x.start)], ["duration", dur(x.duration)], ["study", x.storage],
      ["directory", x.path]].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    x.error ? h("p", {class: "error"}, x.error) : null),
    h("div", {class: "charts"}, lineChart(`${x.metric} by trial${few}`, curves, "length"),
      trials.length ? parallel(trials.filter((r) => shown.has(r.trial_id)), x.metric,
        x.smaller_is_better, bestId) : null,
      Object.keys(imp.data.importance || {}).length ? bars(`hyperparameter importance (${imp.data.method})`,
        Object.entries(imp.data.importance)) : null),
    ...card("Trials", h("div", {class: "toolbar"}, compare, pause, activate, kill),
      table(cols, rows, {sortKey: `exp-${name}`, sortCol: 1})));
}

async function runPage(kind, name, tid) {
  const base = kind === "trial" ? `${API}/experiments/${enc(name)}/trials/${tid}` : `${API}/runs/${enc(name)}`;
  const info = await get(base, false, true);
  const r = info.data;
  const metrics = await Promise.all(r.groups.map((g) => get(`${base}/metrics?group=${enc(g)}&max_points=1000`)));
  const ck = await get(`${base}/checkpoints`);
  if (!page.shell) buildRunShell(kind, name, tid, base);
  if (info.changed || metrics.some((m) => m.changed) || ck.changed || page.dirty) {
    const title = kind === "trial" ? `Trial ${tid} of ${name}` + (r.optuna_number !== undefined
      && r.optuna_number !== null ? ` (Optuna trial ${r.optuna_number})` : "") : `Run ${name}`;
    const facts = [["state", state(r.state)], ["ended", r.ended || "–"],
      ["steps completed", fmt(r.steps_completed)],
      ["best " + (r.metric || ""), fmt(r.best_value)], ["exit", exitText(r)],
      ["status", r.status || r.outcome || "–"], ["resumed from", r.resumed_from || "–"],
      ["restarts seen", fmt(r.restarts)], ["latest checkpoint", r.latest_checkpoint || "–"]];
    page.parts.head.replaceChildren(h("h1", {}, title), h("dl", {class: "kv"},
      ...facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
    const hparams = r.hparams_all || r.hparams || {};
    page.parts.hparams.replaceChildren(Object.keys(hparams).length
      ? h("dl", {class: "kv"}, ...Object.entries(hparams).flatMap(([k, v]) =>
        [h("dt", {}, k), h("dd", {}, typeof v === "object" ? JSON.stringify(v) : fmt(v))]))
      : h("p", {class: "muted"}, "none recorded"));
    const charts = [];
    r.groups.forEach((g, gi) => {
      const rows = metrics[gi].data;
      const names = [...new Set(rows.flatMap((x) => Object.keys(x.metrics)))].sort();
      for (const m of names) {
        const pts = rows.filter((x) => typeof x.metrics[m] === "number").map((x) => [x.steps_completed, x.metrics[m]]);
        if (pts.length) charts.push(lineChart(`${g}: ${m}`, [{name: m, points: pts, color: COLORS[gi % COLORS.length]}]));
      }
    });
    page.parts.charts.replaceChildren(...(charts.length ? charts : [h("p", {class: "muted"}, "no metrics reported yet")]));
    page.parts.ckpts.replaceChildren(ck.data.length ? table(["uuid", "steps completed", "state", "size", "time", "storage"],
      ck.data.map((c) => ({cells: [h("code", {}, c.uuid), fmt(c.steps_completed), state(c.state),
        bytes(c.size), when(c.time), c.storage || "–"],
      sort: [c.uuid, c.steps_completed, c.state, c.size, c.time, c.storage]})), {sortKey: "ck", sortCol: 4})
      : h("p", {class: "muted"}, "no checkpoints yet"));
    page.parts.events.replaceChildren(r.history.length
      ? table(["time", "event"], r.history.map((e, i) => ({cls: `event ${e.kind}`, // in log order:
        cells: [when(e.time), e.text], sort: [i, e.text]})), {sortKey: "history", sortCol: 0})  // times may be unknown
      : h("p", {class: "muted"}, "no preemptions or restarts"));
    page.parts.tail.replaceChildren(...(r.output_tail ? [h("h2", {}, "Last lines of its output"),
      h("pre", {class: "logs tail"}, r.output_tail)] : r.state === "errored" || r.state === "failed"
      ? [h("p", {class: "muted"}, "no output kept: a plain run's output goes to its launcher's terminal")]
      : []));
    rankOptions(r.log_ranks || []);
  }
  await pollLogs(base);
}

function buildRunShell(kind, name, tid, base) {
  const p = page.parts = {head: h("div", {class: "card"}), tail: h("div"), hparams: h("div"),
    charts: h("div", {class: "charts"}), ckpts: h("div", {class: "card"}),
    events: h("div", {class: "card"}), logs: h("pre", {class: "logs"})};
  page.rank = ""; page.follow = true; page.logOffset = null;
  const rank = p.rank = h("select", {class: "ranks", onchange: (ev) => {
    page.rank = ev.target.value; page.logOffset = null; p.logs.textContent = ""; }});
  const follow = h("label", {}, h("input", {type: "checkbox", checked: "", onchange: (ev) => { page.follow = ev.target.checked; }}), " follow");
  show(p.head, p.tail, h("h2", {}, "Metrics"), p.charts, ...card("Hyperparameters", p.hparams),
    h("h2", {}, "Checkpoints"), p.ckpts, h("h2", {}, "Preemption and restart history"), p.events,
    ...card("Logs", h("div", {class: "toolbar"}, rank, follow), p.logs));
  page.shell = true;
}

// The rank filter offers the ranks the log labels; exec's output labels none.
function rankOptions(ranks) {
  const sel = page.parts.rank, key = ranks.join(",");
  if (sel.dataset.ranks === key) return;
  sel.dataset.ranks = key;
  sel.replaceChildren(h("option", {value: ""}, ranks.length ? "all ranks" : "all output (not labelled by rank)"),
    ...ranks.map((i) => h("option", {value: i, selected: String(i) === page.rank ? "" : null}, `rank ${i}`)));
  sel.disabled = !ranks.length;
}

async function pollLogs(base) {
  if (!page.follow && page.logOffset !== null) return;
  const q = [page.rank !== "" ? `rank=${page.rank}` : null, page.logOffset !== null ? `offset=${page.logOffset}` : null]
    .filter(Boolean).join("&");
  const r = await fetch(`${base}/logs${q ? "?" + q : ""}`, {cache: "no-store", credentials: "same-origin"});
  if (!r.ok) return;
  const text = await r.text();
  page.logOffset = Number(r.headers.get("X-Log-Offset") || 0);
  if (text) {
    const pre = page.parts.logs;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(text);
    if (page.follow && atEnd) pre.scrollTop = pre.scrollHeight;
  }
}

async function compare() {
  const params = new URLSearchParams(location.search);
  const items = (params.get("items") || "").split(",").filter(Boolean);
  const [e, r] = await Promise.all([get(`${API}/experiments`), get(`${API}/runs`)]);
  const choices = [...r.data.map((x) => `run:${x.name}`)];
  for (const x of e.data) {
    const t = await get(`${API}/experiments/${enc(x.name)}/trials`);
    for (const tr of t.data) choices.push(`exp:${x.name}:${tr.trial_id}`);
  }
  const group = params.get("group") || "validation";
  const url = (it) => { const p = it.split(":"); return p[0] === "run" ? `${API}/runs/${enc(p[1])}`
    : `${API}/experiments/${enc(p[1])}/trials/${p[2]}`; };
  const data = await Promise.all(items.map((it) => get(`${url(it)}/metrics?group=${enc(group)}&max_points=1000`)));
  if (!page.dirty && !data.some((d) => d.changed) && !e.changed && !r.changed) return;
  const names = [...new Set(data.flatMap((d) => d.data.flatMap((x) => Object.keys(x.metrics))))].sort();
  const metric = params.get("metric") || names[0] || "";
  const label = (it) => { const p = it.split(":"); return p[0] === "run" ? `run ${p[1]}` : `${p[1]} trial ${p[2]}`; };
  const series = items.map((it, i) => ({name: label(it), color: COLORS[i % COLORS.length],
    points: data[i].data.filter((x) => typeof x.metrics[metric] === "number").map((x) => [x.steps_completed, x.metrics[metric]])}));
  const go = (changes) => { const p = new URLSearchParams(location.search);
    for (const [k, v] of Object.entries(changes)) p.set(k, v); location.search = p.toString(); };
  const picker = h("select", {multiple: "", size: Math.min(10, Math.max(3, choices.length)),
    onchange: (ev) => go({items: [...ev.target.selectedOptions].map((o) => o.value).join(",")})},
  choices.map((c) => h("option", {value: c, selected: items.includes(c) ? "" : null}, label(c))));
  const groupSel = h("select", {onchange: (ev) => go({group: ev.target.value})},
    ["training", "validation"].map((g) => h("option", {value: g, selected: g === group ? "" : null}, g)));
  const metricSel = h("select", {onchange: (ev) => go({metric: ev.target.value})},
    names.map((m) => h("option", {value: m, selected: m === metric ? "" : null}, m)));
  show(h("h1", {}, "Compare"), h("div", {class: "card"}, h("div", {class: "toolbar"},
    h("span", {}, "trials and runs"), picker, groupSel, metricSel)),
  items.length ? h("div", {class: "charts"}, lineChart(`${group}: ${metric}`, series))
    : h("p", {class: "muted"}, "Pick trials or runs to overlay."));
}

function route() {
  const parts = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "experiments" && parts.length === 2) return () => experiment(parts[1]);
  if (parts[0] === "experiments" && parts[2] === "trials") return () => runPage("trial", parts[1], parts[3]);
  if (parts[0] === "runs" && parts.length === 2) return () => runPage("run", parts[1]);
  if (parts[0] === "compare") return compare;
  return home;
}

function rerender() { page.dirty = true; page.render().then(() => { page.dirty = false; }).catch(() => {}); }

function notFound() {
  const what = location.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  show(h("h1", {}, "Not found"), h("div", {class: "card"},
    h("p", {}, `No ${what[0] === "runs" ? "run" : what[2] === "trials" ? "trial" : "experiment"} `,
      h("code", {}, what.slice(1).join(" / ")), " under the served paths."),
    h("p", {}, h("a", {href: "/"}, "All experiments and runs"))));
}

async function loop() {
  page = {render: route(), dirty: true};
  const live = document.getElementById("live");
  for (;;) {
    try {
      await page.render();
      page.dirty = false;
      live.className = ""; live.textContent = "live";
    } catch (err) {
      if (err instanceof NotFound) { // nothing will appear by asking again each second
        notFound();
        live.className = "stale"; live.textContent = "not found";
        return;
      }
      live.className = "stale"; live.textContent = `offline (${err.message})`;
    }
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}
loop();
