"""``det-launch ui`` on a 10,000-trial experiment, measured in the browser (issue 36 §3).

    python benchmarks/bench_ui_browser.py [--trials 10000] [--tabs 5] [--tree CHECKOUT]
                                          [--fixture DIR]

Debian's chromium driven by Playwright, against a real ``det-launch ui``
subprocess on loopback, on the experiment ``bench_ui.py`` builds:

* **first visit after start**: the server is started and the experiment page
  opened at once (the server is still reading the study and computing
  importance). From the navigation's start: when the trials answer and the
  importance answer came (the browser's resource timings), when the trial
  table's first row was drawn (the first meaningful paint) and when the
  importance chart was; and the server's CPU time (user + system, all its
  threads) from the URL's announcement to the first paint, sampled every
  20 ms. On a 2-core machine shared with other work the wall times follow
  the load; the server's CPU is what its one interpreter must do before the
  table can be drawn, so it is the figure that predicts a quiet machine
  (there, wall ~ that CPU + the browser's own work).
* **unchanged polls**: once everything is read, ``--tabs`` tabs stay open on
  the page for 10 s; the server's CPU time per API request the pages made
  (each page polls its answers every second with If-None-Match), and per
  second of all tabs together.
* **the trial table**: the rows in the DOM (a page of them, not 10,000), and
  the time from typing in its filter box to the filtered rows drawn.

``--tree`` runs another checkout's server and pages (an old commit, unpacked
with ``git archive``) on the same fixture, for before/after pairs; with
``--pairs N`` one run makes N interleaved first visits of each (old, this
checkout, old, ...: each a fresh server), and only those.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

import bench_ui  # noqa: E402 (the fixture and the server, shared)

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ROW = "main table:not(.u-legend) tbody tr"  # not a chart legend (uPlot's)
#: in the page from its first script: when a trial row and the importance chart first appear
WATCH = """
(() => {
  const seen = {};
  window.__paint = seen;
  const look = () => {
    if (!seen.table && document.querySelector("main table:not(.u-legend) tbody tr"))
      seen.table = performance.now();
    if (!seen.importance && [...document.querySelectorAll("main svg, main .chart")]
        .some((e) => /importance/.test(e.getAttribute("aria-label") || e.textContent || "")
              && !/computing|loading/i.test(e.textContent || "")))
      seen.importance = performance.now();
    if (!seen.table || !seen.importance) requestAnimationFrame(look);
  };
  requestAnimationFrame(look);
})();
"""


def resource_end(page: Any, suffix: str) -> Any:
    return page.evaluate(
        """(s) => { const r = performance.getEntriesByType("resource")
              .filter((e) => e.name.split("?")[0].endsWith(s));
            return r.length ? r[0].responseEnd : null; }""", suffix)


class CpuTrace:
    """The server's CPU seconds (user + system) since its URL was announced,
    sampled every ``every`` s, read back at any wall time (epoch seconds)."""

    def __init__(self, server: bench_ui.Server, every: float = 0.02) -> None:
        self.ps, self.every = server.ps, every
        self.at_start = sum(self.ps.cpu_times()[:2])  # imports, before the announcement
        self.samples: list[tuple[float, float]] = [(time.time(), 0.0)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append((time.time(), sum(self.ps.cpu_times()[:2]) - self.at_start))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, when: float) -> float:
        """CPU seconds by ``when``: the first sample at or after it (an upper bound by <= 20 ms)."""
        for t, cpu in self.samples:
            if t >= when:
                return round(cpu, 2)
        return round(self.samples[-1][1], 2)


def first_visit(browser: Any, server: bench_ui.Server, out: dict[str, Any]) -> None:
    trace = CpuTrace(server)
    page = browser.new_page()
    page.add_init_script(WATCH)
    page.goto(server.url + "experiments/big", wait_until="commit")
    page.wait_for_function("window.__paint && window.__paint.table", timeout=120_000)
    try:
        page.wait_for_function("window.__paint.importance", timeout=120_000)
    except Exception:  # noqa: BLE001 (an old page may draw no importance chart at all)
        pass
    seen = page.evaluate("window.__paint")
    trace.stop()
    origin = page.evaluate("performance.timeOrigin") / 1000  # the navigation's start, epoch s
    ms = lambda v: None if v is None else round(v / 1000, 2)  # noqa: E731
    trials_at = resource_end(page, "/experiments/big/trials")
    out["first visit (s from navigation)"] = {
        "trials answered": ms(resource_end(page, "/experiments/big/trials")),
        "trial table drawn (first meaningful paint)": ms(seen.get("table")),
        "importance answered": ms(resource_end(page, "/experiments/big/importance")),
        "importance chart drawn": ms(seen.get("importance")),
    }
    out["server CPU (s from its URL's announcement)"] = {
        "to the trials answer": trace.at(origin + trials_at / 1000) if trials_at else None,
        "to the first meaningful paint": trace.at(origin + seen["table"] / 1000),
        "before the announcement (start, imports)": round(trace.at_start, 2),
    }
    out["load average (1 min) at the first visit"] = round(os.getloadavg()[0], 1)
    out["trial rows in the DOM"] = page.locator(ROW).count()
    page.close()


def table_filter(browser: Any, server: bench_ui.Server, out: dict[str, Any]) -> None:
    page = browser.new_page()
    page.goto(server.url + "experiments/big")
    page.wait_for_selector(ROW, timeout=120_000)
    box = page.locator("input.table-filter")
    if not box.count():
        out["filter"] = "no filter box"
        page.close()
        return
    t = time.perf_counter()
    box.first.fill("9999")
    page.wait_for_function(
        f"[...document.querySelectorAll('{ROW}')].every((r) => r.textContent.includes('9999'))",
        timeout=60_000)
    out["filter typed -> rows drawn (s)"] = round(time.perf_counter() - t, 3)
    out["rows after filter"] = page.locator(ROW).count()
    page.close()


def polls(browser: Any, server: bench_ui.Server, tabs: int, out: dict[str, Any]) -> None:
    pages, requests = [], [0]
    for _ in range(tabs):
        p = browser.new_page()
        p.on("request", lambda r: requests.__setitem__(0, requests[0] + (
            "/api/v1/" in r.url)))
        p.goto(server.url + "experiments/big")
        p.wait_for_selector(ROW, timeout=120_000)
        pages.append(p)
    # Playwright's events come while it is called: wait through it, not time.sleep
    pages[0].wait_for_timeout(3000)  # every tab's first answers taken; then unchanged polls
    n0, c0, t0 = requests[0], sum(server.ps.cpu_times()[:2]), time.perf_counter()
    pages[0].wait_for_timeout(10_000)
    n, cpu, wall = requests[0] - n0, sum(server.ps.cpu_times()[:2]) - c0, time.perf_counter() - t0
    out[f"unchanged polls, {tabs} tabs"] = {
        "API requests": n, "server CPU ms per request": round(1000 * cpu / max(n, 1), 2),
        "server CPU % of a core": round(100 * cpu / wall, 1)}
    for p in pages:
        p.close()


def pairs(browser: Any, root: pathlib.Path, old: str, n: int) -> list[dict[str, Any]]:
    """n first visits of each tree, interleaved: old, new, old, new, ..."""
    runs = []
    for i in range(n):
        for label, tree in (("old", os.path.abspath(old)), ("new", str(REPO))):
            os.environ["PYTHONPATH"] = tree
            server = bench_ui.Server(root)
            got: dict[str, Any] = {"pair": i + 1, "tree": label}
            try:
                first_visit(browser, server, got)
            finally:
                server.stop()
            print(json.dumps(got), file=sys.stderr, flush=True)
            runs.append(got)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--tabs", type=int, default=5)
    ap.add_argument("--tree", help="another checkout's server and pages")
    ap.add_argument("--fixture", help="a directory bench_ui built before (kept between runs)")
    ap.add_argument("--first-visit-only", action="store_true",
                    help="only the first visit after start (no filter, no tabs)")
    ap.add_argument("--pairs", type=int, default=0,
                    help="with --tree: N interleaved first visits, old tree then this one")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    if args.tree and not args.pairs:
        os.environ["PYTHONPATH"] = os.path.abspath(args.tree)
    root = pathlib.Path(args.fixture or tempfile.mkdtemp(prefix="bench-ui-browser-"))
    if not (root / "det_experiments" / "big").exists():
        t = time.perf_counter()
        bench_ui.build_experiment(root, args.trials)
        print(f"fixture: {args.trials} trials in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    out: dict[str, Any] = {"trials": args.trials, "tree": args.tree or "this checkout"}
    with sync_playwright() as p:
        # the pages' CSP forbids eval, which Playwright's waits use
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS).new_context(
            bypass_csp=True)
        if args.pairs and args.tree:
            out["pairs"] = pairs(browser, root, args.tree, args.pairs)
            browser.close()
            print(json.dumps(out, indent=1))
            return
        server = bench_ui.Server(root)  # the page is opened as soon as the URL is announced
        try:
            first_visit(browser, server, out)
            if not args.first_visit_only:
                bench_ui.settle(server)
                table_filter(browser, server, out)
                polls(browser, server, args.tabs, out)
        finally:
            server.stop()
            browser.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
