/* De-identification jobs (docs/deidentify-jobs.md): POST /studies/{study}/$deidentify (one study)
 * and POST /$deidentify with the Find view's QIDO-RS query; the PS3.15 Annex E Basic Profile
 * with the options of deid/profile.py, into a label, a routing destination or an S3 prefix.
 * The 202 answer is the job: the page opens it in the Jobs view (jobs.js). */
"use strict";

/* the profile's options (deid/profile.py OPTION_CODES; PS3.15 Table E.1-1 columns, CID 7050 codes) */
const DEID_OPTIONS = [
  ["retain_modified_dates", "Retain modified dates (shifted)", "113107"],
  ["retain_full_dates", "Retain full dates", "113106"],
  ["retain_patient_characteristics", "Retain patient characteristics", "113108"],
  ["retain_device_identity", "Retain device identity", "113109"],
  ["retain_institution_identity", "Retain institution identity", "113112"],
  ["retain_uids", "Retain UIDs", "113110"],
  ["retain_safe_private", "Retain safe private attributes", "113111"],
  ["clean_descriptors", "Clean descriptors", "113105"],
  ["clean_structured_content", "Clean structured content", "113104"],
  ["clean_graphics", "Clean graphics", "113103"],
];

/* the routing destinations that take instances (STOW-RS or C-STORE), as the study's routing
 * table knows them (GET /admin/queue/studies/{study}: every destination of the routes file) */
async function instanceDestinations(uid) {
  if (!uid) return [];
  const doc = await json(`/admin/queue/studies/${uid}`).catch(() => null);
  return doc ? Object.entries(doc.destinations).filter(([, d]) => d.kind === "stow" || d.kind === "dimse").map(([n]) => n) : [];
}

/* the form: project, options, target; `what` says what is de-identified (the confirm text),
 * `post` sends the body and answers the job */
function deidJobForm(id, what, destinations, post) {
  const f = (name) => `${id}-${name}`;
  const targetText = el("input", { id: f("target-label"), name: "label", "aria-label": "Name of the label", placeholder: "e.g. lung-ai", pattern: LABEL_RE.source });
  const s3Text = el("input", { id: f("target-s3"), name: "s3", "aria-label": "S3 prefix", placeholder: "s3://bucket/prefix", size: 30 });
  const destSelect = el("select", { id: f("target-destination"), name: "destination", "aria-label": "Destination" },
    destinations.map((n) => el("option", { value: n }, n)));
  const radio = (value, label, control, disabled) => el("div", { class: "target" },
    el("input", { type: "radio", name: "target", value, id: f(`to-${value}`), checked: value === "label", disabled }),
    el("label", { for: f(`to-${value}`) }, label), " ", control);
  const form = el("form", { class: "deid-job", "aria-label": `De-identify ${what}` },
    el("p", {}, el("label", { for: f("project") }, "Project (its pseudonyms, UIDs and date shift) "),
      el("input", { id: f("project"), name: "project", required: true, placeholder: "e.g. lung-ai" }),
      el("span", { class: "muted" }, " an admin makes it first: POST /admin/deid/{project}/pseudonyms")),
    el("fieldset", {}, el("legend", {}, "Options of the Basic Profile (PS3.15 Annex E)"),
      DEID_OPTIONS.map(([name, label, code]) => el("label", { class: "check" },
        el("input", { type: "checkbox", name: "option", value: name }), ` ${label} (${code})`))),
    el("fieldset", {}, el("legend", {}, "Into"),
      radio("label", "a label of this archive", targetText),
      radio("destination", destinations.length ? "a routing destination" : "a routing destination (none configured)", destSelect, !destinations.length),
      radio("s3", "an S3 prefix (admin scope)", s3Text)),
    el("button", { type: "submit", class: "primary" }, "Start de-identification"));
  for (const c of [targetText, s3Text, destSelect]) {
    c.addEventListener("focus", () => { form.querySelector(`#${f("to-" + c.name)}`).checked = true; });
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const project = form.elements.project.value.trim();
    const kind = form.querySelector('input[name="target"]:checked').value;
    const to = { label: targetText, destination: destSelect, s3: s3Text }[kind].value.trim();
    if (!project || !to) { say(`Name the project and the ${kind === "s3" ? "S3 prefix" : kind}.`, true); return; }
    const options = [...form.querySelectorAll('input[name="option"]:checked')].map((c) => c.value);
    if (kind === "label" && options.includes("retain_uids")) {  /* refused by the server too (400) */
      say("Retain UIDs cannot go into a label: the copies would keep the original UIDs and land on the identified originals. Leave the option out or choose another target.", true);
      return;
    }
    const body = { project, options, target: { [kind]: to } };
    let job = null;
    if (await act(`De-identify ${what} (PS3.15 Basic Profile${options.length ? ", " + options.join(", ") : ""}) with the pseudonyms of project "${project}" into ${kind === "s3" ? "the S3 prefix" : `the ${kind}`} "${to}", as a background job?`, "De-identify",
      async () => { job = await post(body); return `Job ${job.id} queued.`; })) {
      location.hash = `#/jobs/${job.id}`;
    }
  });
  return form;
}

const postJson = (path, body) => json(path, { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });

/* the study page's "De-identify…" */
function deidStudyBox(uid) {
  const box = el("details", { id: "deid-job" }, el("summary", {}, "De-identify…"), el("p", { class: "muted" }, "Loading…"));
  box.addEventListener("toggle", async () => {
    if (!box.open || box.dataset.ready) return;
    box.dataset.ready = "1";
    box.replaceChildren(box.firstChild, deidJobForm("deid-study", "this study", await instanceDestinations(uid),
      (body) => postJson(dw(`/studies/${uid}/$deidentify`), body)));
  });
  return box;
}

/* the Find view's "De-identify the results…": the same QIDO-RS keys, every matching study
 * (not only this page), POST /$deidentify {"query": ...} */
function deidResultsBox(q, anyStudy) {
  const query = {};
  for (const [k, v] of q) if (!["limit", "offset", "includefield"].includes(k.toLowerCase())) query[k] = v;
  const box = el("details", { id: "deid-results" }, el("summary", {}, "De-identify the results…"),
    el("p", { class: "muted" }, "Loading…"));
  box.addEventListener("toggle", async () => {
    if (!box.open || box.dataset.ready) return;
    box.dataset.ready = "1";
    box.replaceChildren(box.firstChild,
      el("p", { class: "muted" }, `Every study matching ${Object.keys(query).length ? Object.entries(query).map(([k, v]) => `${k}=${v}`).join(" ") : "(no key: every study you may see)"}, on every page.`),
      deidJobForm("deid-query", "every study of these results", await instanceDestinations(anyStudy),
        (body) => postJson(dw("/$deidentify"), { ...body, query })));
  });
  return box;
}
