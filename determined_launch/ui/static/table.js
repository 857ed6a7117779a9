// det-launch ui: the table component: sortable, rendered from rows of cells.
"use strict";
// The sortable table, in pages past TABLE_PAGE rows (10,000 trials draw 100 rows, not 10,000),
// with a filter box (opts.filter): a row matches when its values contain every word typed.
const TABLE_PAGE = 100;
function table(cols, rows, opts) {
  opts = opts || {};
  const key = opts.sortKey || "tbl";
  const sort = table.sorts[key] || {col: opts.sortCol ?? 0, asc: opts.asc ?? true};
  const view = table.views[key] || (table.views[key] = {page: 0, q: ""});
  const words = view.q.toLowerCase().split(/\s+/).filter(Boolean);
  // what the row shows (numbers as formatted), so a match is visible in the row
  const text = (r) => r.text || (r.text = r.sort.map(fmt).join(" ").toLowerCase());
  const kept = words.length ? rows.filter((r) => words.every((w) => text(r).includes(w))) : rows;
  const sorted = kept.slice().sort((a, b) => {
    const x = a.sort[sort.col], y = b.sort[sort.col];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * (sort.asc ? 1 : -1);
  });
  const size = opts.limit || TABLE_PAGE;
  const pages = Math.max(1, Math.ceil(sorted.length / size));
  view.page = Math.min(view.page, pages - 1);
  const from = view.page * size;
  const head = h("tr", {}, cols.map((c, i) => h("th", {
    class: i === sort.col ? `sorted ${sort.asc ? "asc" : ""}` : null,
    onclick: () => { table.sorts[key] = {col: i, asc: i === sort.col ? !sort.asc : true}; rerender(); },
  }, c)));
  const body = sorted.slice(from, from + size).map((r) => h("tr", {class: r.cls}, (typeof r.cells === "function" ? r.cells() : r.cells).map((c) => h("td", {}, c))));
  const t = h("table", {class: "data-table"}, h("thead", {}, head), h("tbody", {}, body));
  const go = (p) => { view.page = p; rerender(); };
  const pager = pages > 1 ? h("span", {class: "pager"},
    h("button", {disabled: view.page === 0 ? "" : null, onclick: () => go(0)}, "«"),
    h("button", {disabled: view.page === 0 ? "" : null, onclick: () => go(view.page - 1)}, "‹"),
    ` page ${view.page + 1} of ${pages} `,
    h("button", {disabled: view.page >= pages - 1 ? "" : null, onclick: () => go(view.page + 1)}, "›"),
    h("button", {disabled: view.page >= pages - 1 ? "" : null, onclick: () => go(pages - 1)}, "»")) : null;
  const count = h("span", {class: "muted"}, sorted.length === rows.length ? ` ${rows.length} rows`
    : ` ${sorted.length} of ${rows.length} rows`);
  let box = null;
  if (opts.filter) {
    // The page is drawn again in place (core.js's fill): the box keeps its focus and caret.
    box = h("input", {type: "search", class: "table-filter", "data-table": key, value: view.q,
      placeholder: "filter rows", "aria-label": "filter rows",
      oninput: (ev) => { view.q = ev.target.value; view.page = 0; rerender(); }});
  }
  const bar = box || pager ? h("div", {class: "table-bar"}, box, count, pager) : null;
  return bar ? h("div", {}, bar, t) : t;
}
table.sorts = {};
table.views = {};
