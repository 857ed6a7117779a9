// det-launch ui: the table component: sortable, rendered from rows of cells.
"use strict";
function table(cols, rows, opts) {
  opts = opts || {};
  const key = opts.sortKey || "tbl";
  const sort = table.sorts[key] || {col: opts.sortCol ?? 0, asc: opts.asc ?? true};
  const sorted = rows.slice().sort((a, b) => {
    const x = a.sort[sort.col], y = b.sort[sort.col];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * (sort.asc ? 1 : -1);
  });
  const limit = opts.limit || 1000;
  const head = h("tr", {}, cols.map((c, i) => h("th", {
    class: i === sort.col ? `sorted ${sort.asc ? "asc" : ""}` : null,
    onclick: () => { table.sorts[key] = {col: i, asc: i === sort.col ? !sort.asc : true}; rerender(); },
  }, c)));
  const body = sorted.slice(0, limit).map((r) => h("tr", {class: r.cls}, r.cells.map((c) => h("td", {}, c))));
  const t = h("table", {}, h("thead", {}, head), h("tbody", {}, body));
  return rows.length > limit
    ? h("div", {}, t, h("p", {class: "muted"}, `showing ${limit} of ${rows.length} (sort to see others)`))
    : t;
}
table.sorts = {};
