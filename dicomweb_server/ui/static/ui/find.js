/* Find studies (QIDO-RS) and upload files (STOW-RS) (see core.js). */
"use strict";

/* -- Find ------------------------------------------------------------------------------------ */

const FIELDS = [
  ["PatientName", "Patient name", "text"], ["PatientID", "Patient ID", "text"],
  ["AccessionNumber", "Accession number", "text"], ["ModalitiesInStudy", "Modality", "text"],
  ["from", "Study date from", "date"], ["to", "Study date to", "date"], ["label", "Label", "text"],
];
const STUDY_FIELDS = "includefield=00081030&includefield=00201206&includefield=00201208&includefield=00080061";

function wild(v) { return /[*?]/.test(v) ? v : `*${v}*`; }

async function renderFind(params) {
  const limit = Math.max(1, Math.min(200, parseInt(params.get("limit") || "25", 10)));
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10));
  const form = el("form", { class: "search", role: "search", "aria-label": "Find studies" },
    FIELDS.map(([name, label, type]) => el("label", {}, label,
      el("input", { name, type, value: params.get(name) || "", list: name === "label" ? "labels-in-use" : null,
        placeholder: type === "text" ? (name === "ModalitiesInStudy" ? "CT" : "any") : null }))),
    el("datalist", { id: "labels-in-use" }),
    el("label", {}, "Per page", el("select", { name: "limit" },
      [10, 25, 50, 100].map((n) => el("option", { value: n, selected: n === limit }, n)))),
    el("button", { type: "submit", class: "primary" }, "Search"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
    location.hash = "#/find?" + q.toString();
  });

  const q = new URLSearchParams();
  for (const key of ["PatientName", "PatientID", "AccessionNumber"]) {
    const v = params.get(key);
    if (v) q.set(key, key === "PatientName" ? wild(v) : v);
  }
  if (params.get("ModalitiesInStudy")) q.set("ModalitiesInStudy", params.get("ModalitiesInStudy").toUpperCase());
  if (params.get("from") || params.get("to")) q.set("StudyDate", `${dicomDate(params.get("from") || "")}-${dicomDate(params.get("to") || "")}`);
  if (params.get("label")) q.set("label", params.get("label").trim());  // any of label=a,b (docs/notes/access-labels.md)
  if (q.has("PatientName")) q.set("fuzzymatching", "true");
  q.set("limit", limit + 1);  // one more than shown: is there a next page?
  q.set("offset", offset);

  const results = el("div", { id: "results" }, "Searching…");
  view.replaceChildren(el("h1", {}, "Find studies"), form, results, uploadBox());
  json(dw("/labels")).then((used) => {  // the labels in use, as suggestions for the Label field
    form.querySelector("#labels-in-use").replaceChildren(...Object.keys(used || {}).map((l) => el("option", { value: l })));
  }).catch(() => {});
  let found;
  try {
    found = await json(dw("/studies?" + q.toString() + "&" + STUDY_FIELDS));
  } catch (e) {
    results.replaceChildren(el("p", { class: "bad" }, e.message));
    return;
  }
  found = found || [];
  const more = found.length > limit;
  let rows = found.slice(0, limit);
  const sort = params.get("sort") || "";
  const columns = [
    { key: "00100010", label: "Patient name", cell: (r) => el("a", { href: `#/study/${value(r, "0020000D")}` }, value(r, "00100010") || "(no name)") },
    { key: "00100020", label: "Patient ID", cell: (r) => value(r, "00100020") },
    { key: "00080020", label: "Date", cell: (r) => fmtDate(value(r, "00080020")) },
    { key: "00080050", label: "Accession", cell: (r) => value(r, "00080050") },
    { key: "00080061", label: "Modalities", cell: (r) => values(r, "00080061") },
    { key: "00081030", label: "Description", cell: (r) => value(r, "00081030") },
    { key: "00201206", label: "Series", num: true, cell: (r) => value(r, "00201206") },
    { key: "00201208", label: "Instances", num: true, cell: (r) => value(r, "00201208") },
  ];
  if (sort) {
    const [key, dir] = sort.split(":");
    const col = columns.find((c) => c.key === key);
    if (col) rows = [...rows].sort((a, b) => {
      const x = col.num ? Number(value(a, key)) - Number(value(b, key)) : value(a, key).localeCompare(value(b, key));
      return dir === "desc" ? -x : x;
    });
  }
  const link = (changes) => {
    const p = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) p.set(k, v);
    return "#/find?" + p.toString();
  };
  const [sortKey, sortDir] = sort.split(":");
  const t = el("table", {}, el("caption", { class: "muted" },
      `Studies ${rows.length ? offset + 1 : 0}–${offset + rows.length} (sorted within the page by a column's button)`),
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", {
        scope: "col", class: c.num ? "num" : null,
        "aria-sort": sortKey === c.key ? (sortDir === "desc" ? "descending" : "ascending") : null },
      el("button", { type: "button", onclick: () => { location.hash = link({ sort: `${c.key}:${sortKey === c.key && sortDir !== "desc" ? "desc" : "asc"}` }); } }, c.label))))),
    el("tbody", {}, rows.map((r) => el("tr", {}, columns.map((c) => el("td", { class: c.num ? "num" : null }, c.cell(r)))))));
  const pager = el("nav", { class: "pager", "aria-label": "Pages of results" },
    offset > 0 ? el("a", { href: link({ offset: Math.max(0, offset - limit) }) }, "← Previous") : null,
    more ? el("a", { href: link({ offset: offset + limit }) }, "Next →") : null);
  results.replaceChildren(rows.length ? t : el("p", {}, "No study matches."), pager);
  if (rows.length) results.append(deidResultsBox(q, value(rows[0], "0020000D")));
  say(`${rows.length}${more ? "+" : ""} ${rows.length === 1 && !more ? "study" : "studies"} found.`);
}

/* -- Upload: drag and drop or choose files -> STOW-RS (PS3.18 §10.5) ------------------------ */

function uploadBox() {
  const input = el("input", { type: "file", id: "upload-files", multiple: true });
  const box = el("section", { class: "drop", id: "upload" },
    el("h2", {}, "Upload DICOM files (STOW-RS)"),
    el("p", {}, "Drop files here, or ", el("label", { for: "upload-files" }, "choose files: "), input));
  const send = async (files) => {
    files = [...files];
    if (!files.length) return;
    await act(`Store ${files.length} file(s) in the archive (STOW-RS)?`, "Upload", () => stow(files));
  };
  input.addEventListener("change", () => send(input.files));
  box.addEventListener("dragover", (ev) => { ev.preventDefault(); box.classList.add("over"); });
  box.addEventListener("dragleave", () => box.classList.remove("over"));
  box.addEventListener("drop", (ev) => { ev.preventDefault(); box.classList.remove("over"); send(ev.dataTransfer.files); });
  return box;
}

async function stow(files) {
  const boundary = "dicomweb-ui-" + Math.random().toString(16).slice(2);
  const parts = [];
  for (const f of files) {
    parts.push(`--${boundary}\r\nContent-Type: application/dicom\r\n\r\n`, f, "\r\n");
  }
  parts.push(`--${boundary}--\r\n`);
  const r = await api(dw("/studies"), {
    method: "POST", body: new Blob(parts),
    headers: { "Content-Type": `multipart/related; type="application/dicom"; boundary=${boundary}`, Accept: "application/dicom+json" },
  });
  const doc = await r.json();
  const stored = (doc["00081199"] && doc["00081199"].Value) || [];
  const failed = (doc["00081198"] && doc["00081198"].Value) || [];
  const studies = new Set();
  for (const s of stored) {
    const url = value(s, "00081190");
    const m = url.match(/\/studies\/([0-9.]+)/);
    if (m) studies.add(m[1]);
  }
  const box = document.getElementById("upload");
  if (box) box.append(el("p", { class: "upload-result" }, `Stored ${stored.length}, failed ${failed.length}. `,
    [...studies].map((s) => el("a", { href: `#/study/${s}` }, `Open study ${s}`))));
  return `Stored ${stored.length} instance(s), ${failed.length} failed.`;
}
