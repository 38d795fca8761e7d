/* The Jobs view (docs/jobs.md): GET /jobs (newest first), GET /jobs/{id}, DELETE /jobs/{id}
 * (cancel: a queued job at once, a running one at its next checkpoint). Every /jobs route needs
 * the write scope: without it the view says so and offers nothing to do. Refreshed every second
 * while a job it shows is queued or running. */
"use strict";

const LIVE = new Set(["queued", "running"]);
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "");

function jobProgress(job) {
  const p = job.progress || {};
  const total = p.total === null || p.total === undefined ? null : p.total;
  const bar = el("progress", { max: total || 1, "aria-label": `Progress of job ${job.id}` });
  if (total !== null) bar.value = Math.min(p.done || 0, total); else if (!LIVE.has(job.state)) bar.value = 1;  // (no value: indeterminate)
  const extra = [p.failed ? `${p.failed} failed` : "", p.skipped ? `${p.skipped} skipped` : ""].filter(Boolean).join(", ");
  return el("span", { class: "progress" }, bar, ` ${p.done || 0} of ${total === null ? "?" : total}${extra ? ` (${extra})` : ""}`);
}

const jobState = (job) => el("span", { class: `state ${job.state === "done" ? "ok" : job.state === "failed" ? "bad" : ""}`, "data-state": job.state },
  job.state + (job.cancel && LIVE.has(job.state) ? " (cancelling)" : ""));

function cancelButton(job, after) {
  if (!LIVE.has(job.state) || job.cancel) return null;
  return el("button", { type: "button", class: "danger", "aria-label": `Cancel job ${job.id}`, onclick: async () => {
    if (await act(`Cancel job ${job.id} (${job.kind})? A running job stops at its next checkpoint; what it has written stays.`, "Cancel job",
      async () => { const j = await json(`/jobs/${job.id}`, { method: "DELETE" }); return `Job ${j.id}: ${j.cancel ? "cancelling" : j.state}.`; }))
      after();
  } }, "Cancel");
}

const jobsDenied = (e) => (e.status === 403
  ? el("p", { class: "bad", id: "jobs-denied" }, "Background jobs need the write scope: these credentials lack it, so this page shows no job and starts none. ", el("span", { class: "muted" }, e.message))
  : el("p", { class: "bad" }, e.message));

/* a refresh replaces the rows: the focus (a Cancel button, a job's link) stays on the same control */
function keepFocus(box, render) {
  const was = box.contains(document.activeElement) ? document.activeElement.getAttribute("aria-label") || document.activeElement.getAttribute("href") : null;
  render();
  if (!was) return;
  const again = [...box.querySelectorAll("button, a")].find((e) => (e.getAttribute("aria-label") || e.getAttribute("href")) === was);
  if (again) again.focus();
}

let jobsTimer = null;
function jobsAgain(fn, hash) {  // again in 1 s while this page is shown and a job lives
  clearTimeout(jobsTimer);
  jobsTimer = setTimeout(() => { if (location.hash === hash) fn(); }, 1000);
}

async function renderJobs() {
  const hash = location.hash;
  const list = el("div", { id: "jobs-list" }, "Loading…");
  view.replaceChildren(el("h1", {}, "Background jobs"),
    el("p", { class: "muted" }, "De-identification, recompression and pulls run in the archive's workers; newest first. Refreshed every second while one runs."), list);
  let first = true;
  const tick = async () => {
    let jobs;
    try {
      jobs = (await json("/jobs?limit=100")).jobs;
    } catch (e) {
      list.replaceChildren(jobsDenied(e));
      say(e.message, true);
      return;
    }
    keepFocus(list, () => list.replaceChildren(jobs.length ? table(`${jobs.length} job(s)`, [
      { label: "Job", cell: (j) => el("a", { href: `#/jobs/${j.id}` }, el("code", {}, j.id)) },
      { label: "Kind", cell: (j) => j.kind },
      { label: "State", cell: jobState },
      { label: "Progress", cell: jobProgress },
      { label: "Owner", cell: (j) => j.owner || "" },
      { label: "Created", cell: (j) => when(j.created) },
      { label: "Started", cell: (j) => when(j.started) },
      { label: "Finished", cell: (j) => when(j.finished) },
      { label: "Actions", cell: (j) => cancelButton(j, tick) },
    ], jobs) : el("p", {}, "No job yet.")));
    if (first) say(`${jobs.length} job(s), ${jobs.filter((j) => LIVE.has(j.state)).length} queued or running.`);  // (read out: once)
    first = false;
    if (jobs.some((j) => LIVE.has(j.state))) jobsAgain(tick, hash);
  };
  await tick();
}

/* where a finished job's output can be seen in this page */
function jobOutput(job) {
  const target = (job.params && job.params.target) || {};
  if (job.kind === "deidentify" && job.state === "done" && target.label) {
    return el("p", {}, el("a", { href: `#/find?label=${encodeURIComponent(target.label)}`, id: "job-output" }, `Find the de-identified studies (label ${target.label})`));
  }
  return null;
}

async function renderJob(id) {
  const hash = location.hash;
  const box = el("div", { id: "job" }, "Loading…");
  view.replaceChildren(el("h1", {}, `Job ${id}`), el("p", {}, el("a", { href: "#/jobs" }, "All jobs")), box);
  let shown = null;
  const tick = async () => {
    let job;
    try {
      job = await json(`/jobs/${encodeURIComponent(id)}`);
    } catch (e) {
      box.replaceChildren(jobsDenied(e));
      say(e.message, true);
      return;
    }
    keepFocus(box, () => box.replaceChildren(...[
      el("dl", { class: "facts", id: "job-facts" },
        el("dt", {}, "Kind"), el("dd", {}, job.kind),
        el("dt", {}, "State"), el("dd", { id: "job-state" }, jobState(job)),
        el("dt", {}, "Progress"), el("dd", { id: "job-progress" }, jobProgress(job)),
        el("dt", {}, "Owner"), el("dd", {}, job.owner || ""),
        el("dt", {}, "Created"), el("dd", {}, when(job.created)),
        el("dt", {}, "Started"), el("dd", {}, when(job.started)),
        el("dt", {}, "Finished"), el("dd", {}, when(job.finished)),
        el("dt", {}, "Attempts"), el("dd", {}, job.attempts)),
      cancelButton(job, tick),
      job.error ? el("p", { class: "bad", id: "job-error" }, `Error: ${job.error}`) : null,
      jobOutput(job),
      el("h2", {}, "Parameters"), el("pre", { id: "job-params" }, JSON.stringify(job.params, null, 2)),
      job.result ? [el("h2", {}, "Result"), el("pre", { id: "job-result" }, JSON.stringify(job.result, null, 2))] : null,
    ].flat().filter(Boolean)));
    if (job.state !== shown) say(`Job ${job.id}: ${job.state}.`);  // (the status line is read out: once per state)
    shown = job.state;
    if (LIVE.has(job.state)) jobsAgain(tick, hash);
  };
  await tick();
}
