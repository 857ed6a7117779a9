// det-launch ui page: trials and runs side by side: several metrics (one chart each) and a
// table of their hyperparameters and final metrics. The URL holds the choice (items, metrics).
"use strict";
async function compare() {
  const params = new URLSearchParams(location.search);
  const items = (params.get("items") || "").split(",").filter(Boolean);
  const [e, r] = await Promise.all([get(`${API}/experiments`), get(`${API}/runs`)]);
  const choices = [...r.data.map((x) => `run:${x.name}`)];
  for (const x of e.data) {
    const t = await get(`${API}/experiments/${enc(x.name)}/trials`);
    for (const tr of t.data) choices.push(`exp:${x.name}:${tr.trial_id}`);
  }
  const url = (it) => { const p = it.split(":"); return p[0] === "run" ? `${API}/runs/${enc(p[1])}`
    : `${API}/experiments/${enc(p[1])}/trials/${p[2]}`; };
  const infos = await Promise.all(items.map((it) => get(url(it))));
  const data = await Promise.all(items.map((it, i) => Promise.all((infos[i].data.groups || []).map(
    (g) => get(`${url(it)}/metrics?group=${enc(g)}&max_points=1000`).then((m) => ({g, m}))))));
  if (!page.dirty && !infos.some((d) => d.changed) && !data.flat().some((d) => d.m.changed)
    && !e.changed && !r.changed) return;
  // per item: {"group: name": [[step, value], ...]}
  const curves = data.map((groups) => {
    const out = {};
    for (const {g, m} of groups) {
      for (const row of m.data) {
        for (const [k, v] of Object.entries(row.metrics)) {
          if (typeof v !== "number" || row.steps_completed === null) continue;
          (out[`${g}: ${k}`] = out[`${g}: ${k}`] || []).push([row.steps_completed, v]);
        }
      }
    }
    return out;
  });
  const names = [...new Set(curves.flatMap((c) => Object.keys(c)))].sort();
  let chosen = params.getAll("metrics").filter((m) => names.includes(m));
  if (!chosen.length && params.get("group")) { // the older URLs: one group and metric
    const g = params.get("group"), m = params.get("metric");
    chosen = names.filter((n) => m ? n === `${g}: ${m}` : n.startsWith(`${g}: `)).slice(0, 1);
  }
  if (!chosen.length) chosen = names.filter((n) => n.startsWith("validation: ")).slice(0, 2);
  if (!chosen.length) chosen = names.slice(0, 1);
  const label = (it) => { const p = it.split(":"); return p[0] === "run" ? `run ${p[1]}` : `${p[1]} trial ${p[2]}`; };
  const go = (set) => { const p = new URLSearchParams(location.search); set(p); location.search = p.toString(); };
  const picker = h("select", {multiple: "", size: Math.min(10, Math.max(3, choices.length)),
    onchange: (ev) => go((p) => p.set("items", [...ev.target.selectedOptions].map((o) => o.value).join(",")))},
  choices.map((c) => h("option", {value: c, selected: items.includes(c) ? "" : null}, label(c))));
  const metricSel = h("select", {multiple: "", class: "metrics", size: Math.min(10, Math.max(3, names.length)),
    onchange: (ev) => go((p) => { p.delete("metrics"); p.delete("group"); p.delete("metric");
      for (const o of ev.target.selectedOptions) p.append("metrics", o.value); })},
  names.map((m) => h("option", {value: m, selected: chosen.includes(m) ? "" : null}, m)));
  const charts = chosen.map((m) => lineChart(m, items.map((it, i) => ({name: label(it),
    color: COLORS[i % COLORS.length], points: curves[i][m] || []})),
  {key: `compare ${m}`, ylabel: m.split(": ").slice(1).join(": ")}));
  fill(main, h("h1", {}, "Compare"), h("div", {class: "card"}, h("div", {class: "toolbar"},
    h("span", {}, "trials and runs"), picker, h("span", {}, "metrics"), metricSel)),
  items.length ? h("div", {class: "charts"}, ...charts) : h("p", {class: "muted"}, "Pick trials or runs to compare."),
  items.length ? h("div", {class: "card"}, sideBySide(items.map(label), infos.map((i) => i.data), curves, names)) : null);
}

// One column per trial or run: its hyperparameters, then the last value of every metric.
function sideBySide(labels, infos, curves, names) {
  const hp = infos.map((r) => r.hparams_all || r.hparams || {});
  const keys = [...new Set(hp.flatMap((x) => Object.keys(x)))].sort();
  const show1 = (v) => v !== null && typeof v === "object" ? JSON.stringify(v) : fmt(v);
  const row = (head, cells, cls) => h("tr", {class: cls}, h("th", {}, head), cells.map((c) => h("td", {}, c)));
  return h("table", {class: "side-by-side"},
    h("thead", {}, row("", labels)),
    h("tbody", {}, keys.map((k) => row(k, hp.map((x) => show1(x[k])), "hparam")),
      names.map((m) => row(`final ${m}`, curves.map((c) => c[m] ? fmt(c[m][c[m].length - 1][1]) : "–"), "final"))));
}
