// det-launch ui page: the experiments and runs, with each experiment's progress and a filter.
"use strict";
// A trial in one of these states is not done yet.
const LIVE_TRIALS = ["running", "pending", "paused", "queued", "active"];

async function home() {
  const [e, r] = await Promise.all([get(`${API}/experiments`), get(`${API}/runs`)]);
  if (!page.parts) homeShell();
  if (!e.changed && !r.changed && !page.dirty) return;
  const f = page.filter.trim().toLowerCase();
  const keep = (...words) => !f || words.some((w) => String(w ?? "").toLowerCase().includes(f));
  const exps = e.data.filter((x) => keep(x.name, x.state));
  const runs = r.data.filter((x) => keep(x.name, x.state));
  const expTable = table(["name", "searcher", "state", "progress", "trials", "best", "start", "duration"],
    exps.map((x) => {
      const total = Math.max(x.max_trials ?? x.num_trials, x.num_trials);
      const done = Object.entries(x.trial_states).filter(([s]) => !LIVE_TRIALS.includes(s))
        .reduce((n, [, k]) => n + k, 0);
      return {
        cells: [h("a", {href: `/experiments/${enc(x.name)}`}, x.name), x.searcher,
          x.error ? h("span", {title: x.error}, state(x.state)) : state(x.state),
          h("span", {class: "progress", title: `${done} of ${total} trials done`},
            h("progress", {max: total || 1, value: done}), ` ${done}/${total}`),
          Object.entries(x.trial_states).map(([s, n]) => `${n} ${s}`).join(", ") || "0",
          x.best_trial ? `${x.metric} ${fmt(x.best_trial.value)} (trial ${x.best_trial.trial_id})` : "–",
          when(x.start), dur(x.duration)],
        sort: [x.name, x.searcher, x.state, total ? done / total : 0, x.num_trials,
          x.best_trial ? x.best_trial.value : null, x.start, x.duration],
      };
    }), {sortKey: "home-exp"});
  const runTable = table(["run", "state", "steps", "start", "last update"], runs.map((x) => ({
    cells: [h("a", {href: `/runs/${enc(x.name)}`}, x.name), state(x.state), fmt(x.steps_completed),
      when(x.start), when(x.last_update)],
    sort: [x.name, x.state, x.steps_completed, x.start, x.last_update],
  })), {sortKey: "home-runs"});
  const none = (all, what) => h("p", {class: "muted"}, all.length ? `No ${what} match "${page.filter}".`
    : `No ${what} under the served paths.`);
  fill(page.parts.exps, exps.length ? expTable : none(e.data, "experiments"));
  fill(page.parts.runs, runs.length ? runTable : none(r.data, "plain runs"));
}

// Built once: the filter box lives across redraws (its text, focus and caret stay).
function homeShell() {
  const p = page.parts = {exps: h("div", {class: "card"}), runs: h("div", {class: "card"})};
  page.filter = "";
  const box = h("input", {type: "search", class: "table-filter home-filter", placeholder: "filter by name or state",
    "aria-label": "filter experiments and runs by name or state",
    oninput: (ev) => { page.filter = ev.target.value; rerender(); }});
  show(h("div", {class: "toolbar"}, box), h("h1", {}, "Experiments"), p.exps, h("h1", {}, "Runs"), p.runs);
}
