// det-launch ui page: curves of trials and runs overlaid.
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
