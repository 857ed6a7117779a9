// det-launch ui page: the experiments and runs.
"use strict";
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
