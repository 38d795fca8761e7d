/* The router of the operator's page (see core.js); loaded last: it starts the page. */
"use strict";

/* -- the router: #/find?..., #/study/UID, #/jobs, #/jobs/ID, #/watch ---------------------------- */

async function route() {
  const hash = location.hash || "#/find";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  for (const a of document.querySelectorAll("header nav a")) {
    if (a.getAttribute("href") === "#" + path.split("/").slice(0, 2).join("/")) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (path.startsWith("/study/")) await renderStudy(decodeURIComponent(path.slice(7)));
  else if (path === "/watch") renderWatch();
  else if (path === "/jobs") await renderJobs();
  else if (path.startsWith("/jobs/")) await renderJob(decodeURIComponent(path.slice(6)));
  else await renderFind(params);
  document.title = `dicomweb-archive: ${path.split("/")[1] || "find"}`;
}

window.addEventListener("hashchange", () => { route(); view.focus(); });
oidcCallback().catch((e) => say(String(e.message || e), true)).finally(() => { showWho(); scheduleRenewal(); route(); });
