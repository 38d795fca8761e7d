/* Watch the archive (see core.js). */
"use strict";

/* -- Watch: the numbers /metrics serves, every 2 s ----------------------------------------- */

function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}
const sum = (ms, name, pred = () => true) => ms.filter((m) => m.name === name && pred(m.labels)).reduce((a, m) => a + m.value, 0);

let watching = null;
function renderWatch() {
  const grid = el("div", { class: "watch", id: "watch-numbers" }, "Loading…");
  const dests = el("div", { id: "watch-queue" });
  view.replaceChildren(el("h1", {}, "Watch the archive"),
    el("p", { class: "muted" }, "From /metrics and the archive's summary (GET /), refreshed every 2 seconds."), grid, el("h2", {}, "Routing queue per destination"), dests);
  let before = null;
  const tick = async () => {
    if (!location.hash.startsWith("#/watch")) { clearInterval(watching); watching = null; return; }
    try {
      const [text, summary] = await Promise.all([api("/metrics", { headers: { Accept: "text/plain" } }).then((r) => r.text()), json("/")]);
      const ms = parseMetrics(text);
      const now = { t: performance.now() / 1000, in: sum(ms, "dicomweb_instances_stored_total"), out: sum(ms, "dicomweb_forwarded_total") };
      const rate = (k) => (before && now.t > before.t ? ((now[k] - before[k]) / (now.t - before.t)).toFixed(1) : "…");
      const cards = [
        ["Instances in", `${rate("in")}/s`, `${now.in.toLocaleString()} stored since start`],
        ["Instances out", `${rate("out")}/s`, `${now.out.toLocaleString()} delivered since start`],
        ["Queue: pending", sum(ms, "dicomweb_outbox_rows", (l) => l.state === "pending" || l.state === "in_flight").toLocaleString(), "owed to destinations"],
        ["Dead letters", sum(ms, "dicomweb_outbox_rows", (l) => l.state === "failed").toLocaleString(), `${sum(ms, "dicomweb_forward_failed_total").toLocaleString()} given up on since start`],
        ["Disk free", bytes(summary.disk.free_bytes), `of ${bytes(summary.disk.total_bytes)}; the archive holds ${bytes(summary.stored_bytes)}`],
        ["Studies", summary.studies.toLocaleString(), `${summary.series.toLocaleString()} series, ${summary.instances.toLocaleString()} instances`],
        ["Errors: data missing", sum(ms, "dicomweb_instance_data_missing_total").toLocaleString(), "reads that found a stored file gone"],
        ["DIMSE", summary.dimse_port ? `port ${summary.dimse_port}` : "off", "associations: not in /metrics yet"],
      ];
      grid.replaceChildren(...cards.map(([label, big, small]) => el("div", {}, el("span", {}, label), el("strong", {}, big), el("span", { class: "muted" }, small))));
      const names = [...new Set(ms.filter((m) => m.name === "dicomweb_outbox_rows").map((m) => m.labels.destination))];
      dests.replaceChildren(names.length ? table("Outbox rows per destination", [
        { label: "Destination", cell: (d) => d },
        ...["pending", "in_flight", "delivered", "failed"].map((s) => ({ label: s.replace("_", " "), num: true, cell: (d) => sum(ms, "dicomweb_outbox_rows", (l) => l.destination === d && l.state === s) })),
        { label: "Oldest pending", num: true, cell: (d) => `${sum(ms, "dicomweb_outbox_oldest_pending_seconds", (l) => l.destination === d).toFixed(1)} s` },
      ], names) : el("p", { class: "muted" }, "No routing (start the archive with --routes FILE), or nothing owed yet."));
      before = now;
      say(`Updated ${new Date().toLocaleTimeString()}.`);
    } catch (e) {
      say(e.message, true);
    }
  };
  if (watching) clearInterval(watching);
  watching = setInterval(tick, 2000);
  tick();
}

