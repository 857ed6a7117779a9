// det-launch ui page: one experiment: its trials, charts and actions.
"use strict";
// A trial's duration: to its end, or to now while it runs.
const trialSpan = (r) => !r.start ? null : r.end ? r.end - r.start
  : r.state === "running" ? Date.now() / 1000 - r.start : null;

async function experiment(name) {
  const base = `${API}/experiments/${enc(name)}`;
  const [s, t, c] = await Promise.all([get(base, false, true), get(`${base}/trials`),
    get(`${base}/searcher_metric`)]);
  // Importance (Optuna's: seconds on a first visit) is drawn when it comes, never waited for.
  if (!page.impAsked) {
    page.impAsked = true;
    get(`${base}/importance`).then((r) => {
      page.impAsked = false;
      if (r.changed) { page.imp = r.data; rerender(); }
    }, () => { page.impAsked = false; });
  }
  const imp = {data: page.imp};
  if (!s.changed && !t.changed && !c.changed && !page.dirty) return;
  const x = s.data, trials = t.data;
  const bestId = x.best_trial ? x.best_trial.trial_id : null;
  const hp = [...new Set(trials.flatMap((r) => Object.keys(r.hparams || {})))].sort();
  const picked = page.picked || (page.picked = new Set());
  const ch = await experimentCharts(name, x, trials, c.data, picked); // charts.js
  const listed = ch.kept ? trials.filter((r) => ch.kept.has(r.trial_id)) : trials; // brushed
  const cols = ["", "trial", "Optuna #", "state", "start", "duration", ...hp, `best ${x.metric}`,
    `latest ${x.metric}`, "length", "restarts", "checkpoints"];
  const rows = listed.map((r) => ({
    cls: r.trial_id === bestId ? "best" : null,
    cells: () => [h("input", {type: "checkbox", checked: picked.has(r.trial_id) ? "" : null,
      onchange: (ev) => { ev.target.checked ? picked.add(r.trial_id) : picked.delete(r.trial_id);
        if (page.charts && page.charts.which === "selected") rerender(); }}),
    h("a", {href: `/experiments/${enc(name)}/trials/${r.trial_id}`}, r.trial_id), fmt(r.optuna_number),
    state(r.state), when(r.start), dur(trialSpan(r)),
    ...hp.map((k) => fmt(r.hparams[k])), fmt(r.best_value), fmt(r.latest_value), fmt(r.length),
    fmt(r.restarts), fmt(r.checkpoints)],
    sort: [picked.has(r.trial_id) ? 0 : 1, r.trial_id, r.optuna_number, r.state, r.start, trialSpan(r),
      ...hp.map((k) => r.hparams[k]),
      r.best_value, r.latest_value, r.length, r.restarts, r.checkpoints],
  }));
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
  fill(main, h("h1", {}, `Experiment ${x.name}`),
    h("div", {class: "card"}, h("dl", {class: "kv"},
      ...[["state", state(x.state)], ["searcher", x.searcher], ["metric",
        `${x.metric} (${x.smaller_is_better ? "smaller" : "larger"} is better)`],
      ["trials", `${x.num_trials} of ${fmt(x.max_trials)}`],
      ["best", x.best_trial ? `trial ${x.best_trial.trial_id}: ${fmt(x.best_trial.value)}` : "–"],
      ["start", when(x.start)], ["duration", dur(x.duration)], ["study", x.storage],
      ["directory", x.path]].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    x.error ? h("p", {class: "error"}, x.error) : null),
    ch.toolbar, h("div", {class: "charts"}, ...ch.charts,
      !imp.data ? h("div", {class: "card muted"}, "computing hyperparameter importance…")
        : Object.keys(imp.data.importance || {}).length ? bars(`hyperparameter importance (${imp.data.method})`,
        Object.entries(imp.data.importance)) : null),
    ...card("Trials", h("div", {class: "toolbar"}, compare, pause, activate, kill),
      table(cols, rows, {sortKey: `exp-${name}`, sortCol: 1, filter: true})));
}
