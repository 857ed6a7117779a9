// det-launch ui page: one run or one trial: facts, metrics, checkpoints, history, logs.
"use strict";
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
      ["restarts seen", fmt(r.restarts)], ["latest checkpoint", r.latest_checkpoint || "–"],
      ["slow ranks", stragglerFacts(r.stragglers)]];
    fill(page.parts.head, h("h1", {}, title), h("dl", {class: "kv"},
      ...facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
    const hparams = r.hparams_all || r.hparams || {};
    fill(page.parts.hparams, Object.keys(hparams).length
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
    fill(page.parts.charts, ...(charts.length ? charts : [h("p", {class: "muted"}, "no metrics reported yet")]));
    fill(page.parts.ckpts, ck.data.length ? table(["uuid", "steps completed", "state", "size", "time", "storage", "metadata"],
      ck.data.map((c) => ({cells: [h("code", {}, c.uuid), fmt(c.steps_completed), state(c.state),
        bytes(c.size), when(c.time), c.storage || "–", ckptMetadata(c.metadata)],
      sort: [c.uuid, c.steps_completed, c.state, c.size, c.time, c.storage,
        JSON.stringify(c.metadata)]})), {sortKey: "ck", sortCol: 4})
      : h("p", {class: "muted"}, "no checkpoints yet"));
    fill(page.parts.events, r.history.length
      ? table(["time", "event"], r.history.map((e, i) => ({cls: `event ${e.kind}`, // in log order:
        cells: [when(e.time), e.text], sort: [i, e.text]})), {sortKey: "history", sortCol: 0})  // times may be unknown
      : h("p", {class: "muted"}, "no preemptions or restarts"));
    fill(page.parts.tail, ...(r.output_tail ? [h("h2", {}, "Last lines of its output"),
      h("pre", {class: "logs tail"}, r.output_tail)] : r.state === "errored" || r.state === "failed"
      ? [h("p", {class: "muted"}, "no output kept (its launcher ran with --no-output-log, or on another node)")]
      : []));
    fill(page.parts.slow, stragglerTable(r.stragglers));
    rankOptions(r.log_ranks || []);
  }
  await pollLogs(base);
  await systemSection(base); // system.js: a trial's or a run's profiler samples
}

function buildRunShell(kind, name, tid, base) {
  const p = page.parts = {head: h("div", {class: "card"}), tail: h("div"), hparams: h("div"),
    charts: h("div", {class: "charts"}), ckpts: h("div", {class: "card"}),
    events: h("div", {class: "card"}), slow: h("div", {class: "card"}), logs: h("pre", {class: "logs"})};
  page.rank = ""; page.follow = true; page.logOffset = null;
  const rank = p.rank = h("select", {class: "ranks", onchange: (ev) => {
    page.rank = ev.target.value; restartLogs(); }});
  page.search = "";
  const search = h("input", {type: "search", class: "log-search", placeholder: "search the log",
    oninput: (ev) => { clearTimeout(page.searchTimer); page.searchTimer = setTimeout(() => {
      page.search = ev.target.value; restartLogs(); }, 300); }});
  const follow = h("label", {}, h("input", {type: "checkbox", checked: "", onchange: (ev) => { page.follow = ev.target.checked; }}), " follow");
  show(p.head, p.tail, h("h2", {}, "Metrics"), p.charts, ...card("Hyperparameters", p.hparams),
    h("h2", {}, "Checkpoints"), p.ckpts, h("h2", {}, "Preemption and restart history"), p.events,
    h("h2", {}, "Slow ranks (stragglers)"), p.slow,
    ...card("Logs", h("div", {class: "toolbar"}, rank, search, follow), p.logs));
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
  const gen = page.logGen;
  const q = [page.rank !== "" ? `rank=${page.rank}` : null, page.logOffset !== null ? `offset=${page.logOffset}` : null,
    page.search ? `q=${enc(page.search)}` : null]
    .filter(Boolean).join("&");
  const r = await fetch(`${base}/logs${q ? "?" + q : ""}`, {cache: "no-store", credentials: "same-origin"});
  if (!r.ok) return;
  const text = await r.text();
  if (gen !== page.logGen) return;  // the filter changed while this answer came
  page.logOffset = Number(r.headers.get("X-Log-Offset") || 0);
  if (text) {
    const pre = page.parts.logs;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(text);
    if (page.follow && atEnd) pre.scrollTop = pre.scrollHeight;
  }
}
// Checkpoints: the user's metadata beside uuid, steps, time and size (steps_completed has its column).
function ckptMetadata(meta) {
  const own = meta && typeof meta === "object" ? Object.entries(meta).filter(([k]) => k !== "steps_completed") : [];
  if (!own.length) return "–";
  const text = own.map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
  return h("span", {class: "ck-meta", title: text,  // wraps inside the table's nowrap cells
    style: "display: inline-block; max-width: 32em; white-space: normal; overflow-wrap: anywhere"}, text.length > 200 ? text.slice(0, 200) + "…" : text);
}

// Slow ranks the launcher recorded (stragglers.jsonl): who is slow now, and the changes.
function stragglerFacts(s) {
  return s && s.now.length ? s.now.map((e) => `rank ${e.rank} on node ${e.node} (${e.host}): `
    + `${fmt(e.step_time)} s a step, ${(e.step_time / e.median).toFixed(1)}× its peers' median`).join("; ") : "none";
}
function stragglerTable(s) {
  return s && s.events.length ? table(["time", "rank", "node", "step time (s)", "peers' median (s)", "change"],
    s.events.map((e, i) => ({cls: e.straggler ? "event failed" : "event succeeded",
      cells: [when(e.time), fmt(e.rank), `${e.node} (${e.host})`, fmt(e.step_time), fmt(e.median),
        e.straggler ? "became a straggler" : "recovered"],
      sort: [i, e.rank, e.node, e.step_time, e.median, e.straggler]})), {sortKey: "stragglers", sortCol: 0})
    : h("p", {class: "muted"}, "no slow ranks recorded");
}

// A new rank or search: the log is asked again from its end, and an answer on its way is dropped.
function restartLogs() {
  page.logOffset = null; page.logGen = (page.logGen || 0) + 1; page.parts.logs.textContent = "";
}
