// det-launch ui: the house. Plain <script> files sharing one global scope, loaded by app.html
// in order (core, charts, table, pages/*); data only from /api/v1/. Every page re-renders from
// the API once a second; unchanged answers are 304s.
"use strict";
const API = "/api/v1";
const cache = new Map(); // url -> {etag, data}
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
    if (k.startsWith("on")) { el.addEventListener(k.slice(2), v); (el._on ||= {})[k.slice(2)] = v; }
    else el.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    el.append(!(kid instanceof Node) ? document.createTextNode(String(kid))
      : kid.isConnected && keeps(kid) ? standIn(kid) : kid);
  }
  return el;
}
// A kept node (data-keep: a chart) already on the page is not taken out of it while a redraw is
// built (that would reset its scroll): the new tree holds a stand-in that patch() resolves.
const keeps = (n) => n.nodeType === Node.ELEMENT_NODE && n.hasAttribute("data-keep");
const standIn = (n) => Object.assign(document.createComment("kept"), {kept: n});
function place(n) { // a node going onto the page: its stand-ins become their kept nodes
  if (n.kept) return n.kept;
  const w = document.createTreeWalker(n, NodeFilter.SHOW_COMMENT), found = [];
  while (w.nextNode()) if (w.currentNode.kept) found.push(w.currentNode);
  for (const c of found) c.replaceWith(c.kept);
  return n;
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

// -- pages: the frame every page draws into -------------------------------------------------
const main = document.getElementById("main");
let page = null;

// A new frame (a page's shell, "not found"): the nodes replace what main shows.
function show(...nodes) { main.replaceChildren(...nodes.map(place)); }
// Redraw in place: only the nodes that differ change, so a page redrawn every second keeps the
// user's text selection, focus, typed filters and the scroll of its boxes (replacing the nodes
// drops them). A kept node (a chart: uPlot's canvas, zoom, legend) is never patched, only placed.
// What the user is doing (a brush being dragged) is state the render draws, never a node to spare.
// The page's nodes are the first ones drawn: a listener reaches them through its event, not its
// closure.
function patch(old, next) {
  if (old === next || old === next.kept) return;
  if (old.nodeName !== next.nodeName || keeps(old) || keeps(next) || next.kept) { old.replaceWith(place(next)); return; }
  if (old.nodeType === Node.TEXT_NODE) { if (old.data !== next.data) old.data = next.data; return; }
  if (old.nodeType !== Node.ELEMENT_NODE) return;
  for (const a of [...old.attributes]) if (!next.hasAttribute(a.name)) old.removeAttribute(a.name);
  for (const a of next.attributes) if (old.getAttribute(a.name) !== a.value) old.setAttribute(a.name, a.value);
  for (const [t, f] of Object.entries(old._on || {})) old.removeEventListener(t, f);
  for (const [t, f] of Object.entries(next._on || {})) old.addEventListener(t, f);
  old._on = next._on;
  fill(old, ...next.childNodes);
  // what the user changed lives in properties, not attributes: the redraw says what they are
  for (const k of ["checked", "value", "selected"]) if (k in old && old[k] !== next[k]) old[k] = next[k];
}
// Redraw el's children in place (patch) to kids, given as h() takes them.
function fill(el, ...kids) {
  kids = [...h("div", {}, ...kids).childNodes];
  kids.forEach((kid, i) => {
    const at = el.childNodes[i];
    if (!at) el.append(place(kid));
    else if (kid.kept && at !== kid.kept) el.insertBefore(kid.kept, at); // moved: placed here
    else patch(at, kid);
  });
  while (el.childNodes.length > kids.length) el.lastChild.remove();
}
function card(title, ...body) { return [h("h2", {}, title), h("div", {class: "card"}, ...body)]; }

// The front-end's routes, one row a page: [path pattern, the page's render function given the
// pattern's :names]. The server's table (ui/routes.py) serves app.html for the same paths
// (tests/test_ui_routes.py checks the two agree).
const ROUTES = [
  ["/", () => home],
  ["/experiments", () => home],
  ["/runs", () => home],
  ["/experiments/:name", (p) => () => experiment(p.name)],
  ["/experiments/:name/trials/:tid", (p) => () => trialPage(p.name, p.tid)],
  ["/runs/:name", (p) => () => runPage("run", p.name)],
  ["/compare", () => compare],
];

// {name: value} of a pattern's :names in a path, or null; empty segments ("a//b/") are ignored.
function matchPath(pattern, path) {
  const want = pattern.split("/").filter(Boolean);
  const got = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (want.length !== got.length) return null;
  const params = {};
  for (let i = 0; i < want.length; i++) {
    if (want[i].startsWith(":")) params[want[i].slice(1)] = got[i];
    else if (want[i] !== got[i]) return null;
  }
  return params;
}

function route() {
  for (const [pattern, render] of ROUTES) {
    const p = matchPath(pattern, location.pathname);
    if (p) return render(p);
  }
  return home;
}

// A page that ended "not found" is not drawn again (a late answer asking for a redraw).
function rerender() { if (page.gone) return; page.dirty = true; page.render().then(() => { page.dirty = false; }).catch(() => {}); }

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
        page.gone = true;
        notFound();
        live.className = "stale"; live.textContent = "not found";
        return;
      }
      live.className = "stale"; live.textContent = `offline (${err.message})`;
    }
    await new Promise((ok) => setTimeout(ok, 1000));
  }
}
// app.html loads every page file before the document is parsed to its end
document.addEventListener("DOMContentLoaded", loop);
