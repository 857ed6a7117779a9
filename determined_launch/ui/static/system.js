// det-launch ui: the System section of a trial's (or run's) page (issue 36 §4): GET {base}/system
// (ui/system.py: core_context.profiler's samples), per node a table of each metric's latest and
// mean value and charts of CPU, memory and GPU over the run's time.
"use strict";
const SYSTEM_NAMES = {cpu_util_simple: "CPU %", memory_percent: "memory used %",
  free_memory: "memory free (GiB)", disk_iops: "disk IOPS", disk_throughput_read: "disk read (B/s)",
  disk_throughput_write: "disk write (B/s)", net_throughput_sent: "network sent (B/s)",
  net_throughput_recv: "network received (B/s)"};
const SYSTEM_GPU = {util: "util %", memory_used: "memory used (GiB)", memory_percent: "memory used %"};

function systemLabel(key) {
  const m = /^gpu_(util|memory_used|memory_percent)_(\d+)$/.exec(key);
  return m ? `GPU ${m[2]} ${SYSTEM_GPU[m[1]]}` : SYSTEM_NAMES[key] || key;
}

// One chart per kind: CPU and memory %, GPU util % (every GPU), GPU memory % (every GPU).
function systemCharts(n) {
  if (typeof lineChart !== "function" || n.time.length < 2) return [];
  const t0 = n.time[0];
  const line = (key, i) => ({name: systemLabel(key), color: COLORS[i % COLORS.length],
    points: n.time.map((t, j) => [t - t0, n.series[key][j]])});
  const kinds = [["CPU and memory %", (k) => k === "cpu_util_simple" || k === "memory_percent"],
    ["GPU utilisation %", (k) => /^gpu_util_/.test(k)], ["GPU memory %", (k) => /^gpu_memory_percent_/.test(k)]];
  return kinds.map(([title, pick]) => [title, n.names.filter(pick)]).filter(([, keys]) => keys.length)
    .map(([title, keys]) => lineChart(`node ${n.node}: ${title}`, keys.map(line), "seconds since the first sample"));
}

function systemNode(n) {
  const rows = n.names.map((k) => h("tr", {}, h("td", {}, systemLabel(k)), h("td", {class: "num"}, fmt(n.latest[k])),
    h("td", {class: "num"}, fmt(n.mean[k]))));
  return h("div", {class: "system-node"},
    h("h3", {}, `node ${n.node}` + (n.host ? ` (${n.host})` : "") + `, ${n.samples} report${n.samples === 1 ? "" : "s"}`),
    h("table", {class: "system"}, h("thead", {}, h("tr", {}, h("th", {}, "metric"), h("th", {}, "latest"),
      h("th", {}, "mean"))), h("tbody", {}, ...rows)),
    h("div", {class: "charts"}, ...systemCharts(n)));
}

// Called after the page's own render; builds its card below the metrics once, then refreshes it.
async function systemSection(base) {
  if (!page || !page.parts || !page.parts.charts) return;
  let s;
  try { s = await get(`${base}/system`); } catch (e) { return; } // an older server: no section
  let box = page.parts.system;
  if (!box) {
    box = page.parts.system = h("div", {class: "card", id: "system"});
    page.parts.charts.after(h("h2", {}, "System"), box);
  } else if (!s.changed) return;
  const nodes = s.data.nodes || [];
  fill(box, ...(nodes.length ? nodes.map(systemNode) : [h("p", {class: "muted"},
    "no system metrics yet (the Trainer samples once a second and writes them every 10 s)")]));
}
