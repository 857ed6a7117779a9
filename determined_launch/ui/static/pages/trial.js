// det-launch ui page: one trial of an experiment (the run page's parts, see pages/run.js).
"use strict";
async function trialPage(name, tid) {
  await runPage("trial", name, tid);
}
