/* The study page: facts, series, arrivals, downloads (see core.js; its actions: actions.js). */
"use strict";

/* -- Study ----------------------------------------------------------------------------------- */

async function thumbnail(img, path) {
  try {
    const r = await api(path, { headers: { Accept: "image/jpeg" } });
    img.src = URL.createObjectURL(await r.blob());
  } catch (e) {
    img.alt = "no thumbnail (" + e.status + ")";
  }
}

async function section(id, title, load) {
  const s = el("section", { id, "aria-labelledby": id + "-h" }, el("h2", { id: id + "-h" }, title), el("p", { class: "muted" }, "Loading…"));
  (async () => {
    try {
      s.replaceChildren(s.firstChild, ...[await load()].flat());
    } catch (e) {
      s.replaceChildren(s.firstChild, el("p", { class: e.status === 404 ? "muted" : "bad" }, e.message));
    }
  })();
  return s;
}

async function renderStudy(uid) {
  let study;
  try {
    study = await json(dw(`/studies?StudyInstanceUID=${uid}&${STUDY_FIELDS}&includefield=00101010&includefield=00100030&includefield=00100040`));
  } catch (e) {
    view.replaceChildren(el("h1", {}, "Study"), el("p", { class: "bad" }, e.message));
    return;
  }
  study = study && study[0];
  const rejected = await json(`/admin/rejected?study=${uid}`).catch(() => null);
  if (!study && !(rejected && rejected.length)) {
    view.replaceChildren(el("h1", {}, "Study"), el("p", {}, `No study ${uid} (deleted, or never stored).`),
      el("p", {}, el("a", { href: "#/find" }, "Find studies")));
    return;
  }
  const name = study ? value(study, "00100010") : "(rejected)";
  view.replaceChildren(...[  // (replaceChildren writes a null as the text "null": the parts a rejected study has not are left out)
    el("h1", {}, `Study of ${name}`),
    study ? el("dl", { class: "facts" },
      el("dt", {}, "Patient ID"), el("dd", { id: "fact-patient-id" }, value(study, "00100020")),
      el("dt", {}, "Study date"), el("dd", {}, fmtDate(value(study, "00080020"))),
      el("dt", {}, "Accession"), el("dd", {}, value(study, "00080050")),
      el("dt", {}, "Description"), el("dd", {}, value(study, "00081030")),
      el("dt", {}, "Series / instances"), el("dd", {}, `${value(study, "00201206")} / ${value(study, "00201208")}`),
      el("dt", {}, "Study UID"), el("dd", {}, el("code", {}, uid))) : null,
    el("p", { id: "viewer-link" }, el("a", { href: `/viewer/viewer?StudyInstanceUIDs=${uid}` }, "Open in the viewer"), " (when the archive runs with --viewer)",
      OIDC ? el("span", { class: "note", id: "viewer-note" }, " The viewer asks you to log in with the same identity provider.")
        : authorization() ? el("span", { class: "note", id: "viewer-note" },
        " Note: the viewer sends no credentials, so with the archive's authentication on it shows nothing (its requests get 401); use the download below, or a viewer on a network the archive trusts.") : null),
    study ? el("p", { class: "downloads" }, downloadButton(dw(`/studies/${uid}/archive`), `study-${uid}.zip`, "Download study (ZIP with DICOMDIR)")) : null,
    study ? deidForm(uid) : null,
    study ? deidStudyBox(uid) : null,
    await section("series", "Series", () => seriesList(uid)),
    study ? await section("arrivals", "What arrived, from where", () => arrivals(uid)) : null,
    study ? await section("labels", "Labels", () => labelBox(uid)) : null,  // a rejected study: hidden, 404
    study ? await section("share", "Share link", () => shareBox(uid)) : null,
    await section("routing", "Routing: sent to destinations", () => routing(uid)),
    await section("rejection", "Rejection", () => rejection(uid, rejected)),
    study ? await section("edit", "Edit patient and study attributes ($update)", () => editForm(uid, study)) : null,
    study ? await section("merge", "Merge this patient into another ($merge)", () => mergeForm(study)) : null,
    await section("versions", "Versions", () => versionList(uid)),
    await section("history", "Change history (change feed)", () => changeHistory(uid)),
    await section("delete", "Delete", () => deleteBox(uid)),
  ].filter(Boolean));
  say("");
}

async function seriesList(uid) {
  const [found, arrived] = await Promise.all([
    json(dw(`/studies/${uid}/series?includefield=0008103E&includefield=00201209&includefield=00200011&includefield=00080021&includefield=00080031`)),
    studyArrivals(uid)]);
  const series = found || [];
  const of = (s) => (arrived ? arrived.series.find((a) => a.series === value(s, "0020000E")) : null);
  series.sort((a, b) => Number(value(a, "00200011")) - Number(value(b, "00200011")));
  return table(`${series.length} series`, [
    { label: "Thumbnail", cell: (s) => { const img = el("img", { class: "thumb", alt: `series ${value(s, "00200011")}` }); thumbnail(img, dw(`/studies/${uid}/series/${value(s, "0020000E")}/thumbnail`)); return img; } },
    { label: "Number", num: true, cell: (s) => value(s, "00200011") },
    { label: "Modality", cell: (s) => value(s, "00080060") },
    { label: "Description", cell: (s) => value(s, "0008103E") },
    { label: "Instances", num: true, cell: (s) => (of(s) ? arrivedOf(of(s).instances, of(s).declared) : value(s, "00201209")) },
    { label: "Size", num: true, cell: (s) => (of(s) ? size(of(s).bytes) : "") },
    { label: "Source", cell: (s) => (of(s) ? sources(of(s).sources) : "") },
    { label: "Series date", cell: (s) => fmtDate(value(s, "00080021")) },
    { label: "Series UID", cell: (s) => el("code", {}, value(s, "0020000E")) },
    { label: "Download", cell: (s) => downloadButton(dw(`/studies/${uid}/series/${value(s, "0020000E")}/archive`),
      `series-${value(s, "0020000E")}.zip`, "ZIP", `Download series ${value(s, "00200011")} (ZIP with DICOMDIR)`) },
  ], series);
}

/* what arrived of the study, from where, against what its senders declared (docs/notes/sources.md):
 * GET /admin/studies/{study}/arrivals, once per page (the series table and the section share it) */
const arrivalsOf = new Map();
function studyArrivals(uid) {
  if (!arrivalsOf.has(uid)) arrivalsOf.set(uid, json(`/admin/studies/${uid}/arrivals`));
  const p = arrivalsOf.get(uid);
  p.catch(() => arrivalsOf.delete(uid));
  return p.catch(() => null);  // (the series table without them: another scope, or no such study)
}
const size = (n) => el("span", { title: `${n} bytes`, "data-bytes": n }, bytes(n));
function sourceName(src) {
  if (src.startsWith("dimse:")) return `C-STORE from ${src.slice(6)}`;
  if (src.startsWith("stow:")) return `STOW-RS by ${src.slice(5)}`;
  return src === "import" ? "import (command line)" : src || "not known";
}
const sources = (m) => Object.entries(m).map(([src, n]) => `${sourceName(src)} (${n})`).join(", ");
function arrivedOf(n, declared) {
  if (declared === null || declared === undefined) return String(n);
  return el("span", { class: n < declared ? "bad" : "ok" }, `${n} of declared ${declared}`);
}

async function arrivals(uid) {
  arrivalsOf.delete(uid);  // (fresh: the series table asked a moment ago)
  const doc = await json(`/admin/studies/${uid}/arrivals`);
  arrivalsOf.set(uid, Promise.resolve(doc));
  const facts = el("dl", { class: "facts", id: "arrival-facts" },
    el("dt", {}, "Received"), el("dd", {}, doc.received ? `${doc.received.first} to ${doc.received.latest}` : "not known"),
    el("dt", {}, "Instances"), el("dd", { id: "arrival-count" }, arrivedOf(doc.instances, doc.declared),
      doc.declared === null ? " (no instance declares Number of Study Related Instances)" : " (Number of Study Related Instances its instances declare)"),
    el("dt", {}, "Size"), el("dd", { id: "arrival-size" }, size(doc.bytes)),
    el("dt", {}, "Sources"), el("dd", { id: "arrival-sources" }, sources(doc.sources)));
  if (!doc.commitments.length) return [facts, el("p", { class: "muted" }, "No storage commitment request or completed procedure step named its instances.")];
  return [facts, table("Storage commitment requests and completed procedure steps (MPPS) that named its instances (what the sender declared it sent)", [
    { label: "Declared", cell: (c) => c.time },
    { label: "Kind", cell: (c) => (c.kind === "mpps" ? "MPPS" : "Storage commitment") },
    { label: "By (AE title)", cell: (c) => c.requester },
    { label: "Arrived", cell: (c) => [arrivedOf(c.arrived, c.declared), c.in_study !== c.arrived ? ` (${c.in_study} in this study)` : ""] },
    { label: "Missing", cell: (c) => (c.missing_count ? el("ul", { class: "missing" }, c.missing.slice(0, 20).map((m) => el("li", {}, el("code", {}, m.sop))),
      c.missing_count > 20 ? el("li", {}, `and ${c.missing_count - 20} more`) : null) : "none") },
    { label: "Transaction UID (MPPS: its SOP Instance UID)", cell: (c) => el("code", {}, c.transaction) },
  ], doc.commitments)];
}

/* ZIP downloads (docs/downloads.md): fetched with the page's credentials (a plain link cannot send
 * the Authorization header), then handed to the browser as a file */
function downloadButton(path, filename, text, label) {
  return el("button", { type: "button", "aria-label": label || null, onclick: async (ev) => {
    const b = ev.currentTarget;
    b.disabled = true;
    try { say(await saveZip(path, filename, true)); } catch (e) { say(e.message, true); } finally { b.disabled = false; }
  } }, text);
}

/* GET a ZIP with the page's credentials and hand it to the browser as a file; named as the
 * archive names it (Content-Disposition) when serverName, else as `filename` */
async function saveZip(path, filename, serverName) {
  say(`Downloading ${filename}…`);
  const r = await api(path, { headers: { Accept: "application/zip" } });
  const m = serverName && (r.headers.get("Content-Disposition") || "").match(/filename="([^"]+)"/);
  const name = m ? m[1] : filename;
  const url = URL.createObjectURL(await r.blob());
  const a = el("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
  return `Downloaded ${name}.`;
}

/* De-identified ZIP (docs/research-export.md): PS3.15 Annex E Basic Profile, with the pseudonyms,
 * UIDs and date shift of an existing project (an admin makes it: POST /admin/deid/{project}/pseudonyms) */
function deidForm(uid) {
  const input = el("input", { id: "deid-project", name: "project", required: true, placeholder: "e.g. lung-ai" });
  const form = el("form", { class: "labels", "aria-label": "Download de-identified" },
    el("label", { for: "deid-project" }, "Research project "), input, " ",
    el("button", { type: "submit" }, "Download de-identified (ZIP)"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const project = input.value.trim();
    if (!project) return;
    const q = new URLSearchParams({ deidentify: "basic", project });
    await act(`Download this study de-identified (PS3.15 Basic Profile) with the pseudonyms and UIDs of project "${project}"? The project's table records this patient's pseudonym.`, "Download",
      () => saveZip(dw(`/studies/${uid}/archive?${q}`), `deidentified-${project}.zip`, false));
  });
  return form;
}
