// det-launch ui page: one trial of an experiment (the run page's parts, see pages/run.js).
"use strict";
function trialPage(name, tid) { return runPage("trial", name, tid); }
