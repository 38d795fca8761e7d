/* The operator's page of dicomweb-archive (dicomweb_server/ui/, docs/operator.md).
 * Plain JavaScript, no build step, no library: every read and every change goes through
 * the archive's own REST API (QIDO-RS, WADO-RS, STOW-RS, DELETE, $update, reject/restore,
 * the change feed, /admin/..., /metrics), with the credentials typed in the page. */
"use strict";

const PREFIX = document.querySelector('meta[name="dicomweb-prefix"]').content;
const view = document.getElementById("view");
const statusLine = document.getElementById("status");

/* -- credentials: an API key (Bearer), Basic, or an OIDC login; kept in sessionStorage (this tab) -- */

function authorization() {
  const scheme = sessionStorage.getItem("auth-scheme");
  if (scheme === "key") return "Bearer " + sessionStorage.getItem("auth-key");
  if (scheme === "oidc") return "Bearer " + sessionStorage.getItem("auth-token");
  if (scheme === "basic") {
    const raw = sessionStorage.getItem("auth-user") + ":" + sessionStorage.getItem("auth-password");
    return "Basic " + btoa(String.fromCharCode(...new TextEncoder().encode(raw)));
  }
  return null;
}

function showWho() {
  const scheme = sessionStorage.getItem("auth-scheme");
  document.getElementById("who").textContent =
    scheme === "key" ? "API key" : scheme === "basic" ? "Basic: " + sessionStorage.getItem("auth-user")
      : scheme === "oidc" ? "logged in as " + sessionStorage.getItem("auth-user") : "none";
}

document.getElementById("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const f = ev.target.elements;
  sessionStorage.setItem("auth-scheme", f.scheme.value);
  sessionStorage.setItem("auth-key", f.key.value);
  sessionStorage.setItem("auth-user", f.user.value);
  sessionStorage.setItem("auth-password", f.password.value);
  sessionStorage.removeItem("auth-token");
  showWho();
  document.getElementById("login").open = false;
  route();
});

/* -- OIDC login: the authorization code flow with PKCE (OpenID Connect Core 1.0 §3.1, RFC 7636
 * S256) as a public client. The page's address (/ui/) is the redirect URI; the access token
 * it gets is sent as "Authorization: Bearer" and checked by the archive like any other. */

const OIDC = JSON.parse(document.querySelector('meta[name="dicomweb-oidc"]').content || "null");
const b64url = (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes)))
  .replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
const randomText = () => b64url(crypto.getRandomValues(new Uint8Array(32)));  // 43 characters
const redirectUri = () => location.origin + "/ui/";

function claimsOf(jwt) {  // for showing who logged in only: the archive checks the access token
  try {
    const part = jwt.split(".")[1].replaceAll("-", "+").replaceAll("_", "/");
    return JSON.parse(new TextDecoder().decode(Uint8Array.from(atob(part), (c) => c.charCodeAt(0))));
  } catch (e) { return {}; }
}

async function oidcLogin() {
  if (!window.isSecureContext || !crypto.subtle) {
    throw new Error("logging in needs this page over HTTPS (or on localhost): the browser's WebCrypto is off here");
  }
  const r = await fetch(OIDC.authority.replace(/\/$/, "") + "/.well-known/openid-configuration");
  if (!r.ok) throw new Error(`the identity provider's discovery document: ${r.status}`);
  const meta = await r.json();
  const verifier = randomText(), state = randomText(), nonce = randomText();
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  sessionStorage.setItem("oidc-pending", JSON.stringify(
    { verifier, state, nonce, hash: location.hash, token_endpoint: meta.token_endpoint }));
  const query = new URLSearchParams({
    response_type: "code", client_id: OIDC.client_id, redirect_uri: redirectUri(), scope: OIDC.scope,
    state, nonce, code_challenge: challenge, code_challenge_method: "S256" });
  location.assign(meta.authorization_endpoint + "?" + query);
}

async function oidcCallback() {
  const q = new URLSearchParams(location.search);
  if (!OIDC || !(q.has("code") || q.has("error"))) return;
  const pending = JSON.parse(sessionStorage.getItem("oidc-pending") || "null");
  sessionStorage.removeItem("oidc-pending");
  history.replaceState(null, "", location.pathname + ((pending && pending.hash) || ""));
  if (!pending || q.get("state") !== pending.state) throw new Error("login refused: the answer is not for the login this page started (state)");
  if (q.has("error")) throw new Error(`login refused by the identity provider: ${q.get("error")} ${q.get("error_description") || ""}`);
  const r = await fetch(pending.token_endpoint, {
    method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ grant_type: "authorization_code", code: q.get("code"), redirect_uri: redirectUri(),
                                client_id: OIDC.client_id, code_verifier: pending.verifier }) });
  const doc = await r.json().catch(() => ({}));
  if (!r.ok || !doc.access_token) throw new Error(`login failed: no token (${doc.error || r.status}) ${doc.error_description || ""}`);
  const id = doc.id_token ? claimsOf(doc.id_token) : {};
  if (doc.id_token && id.nonce !== pending.nonce) throw new Error("login refused: the ID token is not for this login (nonce)");
  const access = claimsOf(doc.access_token);
  sessionStorage.setItem("auth-scheme", "oidc");
  sessionStorage.setItem("auth-token", doc.access_token);
  sessionStorage.setItem("auth-user", id.preferred_username || id.email || id.sub || access.sub || "?");
  say(`Logged in as ${sessionStorage.getItem("auth-user")}.`);
}

if (OIDC) {
  const button = document.getElementById("oidc-login");
  button.hidden = false;
  button.addEventListener("click", () => oidcLogin().catch((e) => say(String(e.message || e), true)));
}

/* -- the API ------------------------------------------------------------------------------- */

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const auth = authorization();
  if (auth) headers.set("Authorization", auth);
  if (!headers.has("Accept")) headers.set("Accept", "application/json, application/dicom+json");
  const r = await fetch(path, { ...options, headers });
  if (!r.ok) {
    let text = await r.text();
    try {
      const doc = JSON.parse(text);
      text = doc.detail || doc.error || doc.message || text;
      if (typeof text !== "string") text = JSON.stringify(text);
    } catch (e) { /* not JSON: the text itself */ }
    const hint = r.status === 401 ? (OIDC ? " (log in, or enter credentials above)" : " (enter credentials above)") : r.status === 403 ? " (these credentials lack the scope)" : "";
    throw new ApiError(r.status, `${r.status}: ${text}${hint}`);
  }
  return r;
}

async function json(path, options) {
  const r = await api(path, options);
  if (r.status === 204) return null;
  const text = await r.text();
  return text ? JSON.parse(text) : null;
}

const dw = (path) => PREFIX + path;  // a DICOMweb resource under --prefix

function say(text, error = false) {
  statusLine.textContent = text;
  statusLine.className = error ? "error" : "";
}

/* DICOM JSON (PS3.18 Annex F) values */
function value(obj, tag) {
  const el = obj && obj[tag];
  if (!el || !el.Value || !el.Value.length) return "";
  const v = el.Value[0];
  if (el.vr === "PN") return (v && v.Alphabetic) || "";
  return v === null ? "" : String(v);
}
function values(obj, tag) {
  const el = obj && obj[tag];
  return el && el.Value ? el.Value.map(String).join(", ") : "";
}
const fmtDate = (d) => (d && d.length === 8 ? `${d.slice(0, 4)}-${d.slice(4, 6)}-${d.slice(6)}` : d || "");
const dicomDate = (d) => d.replaceAll("-", "");

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c.nodeType ? c : String(c));
  return e;
}

function table(caption, columns, rows) {
  return el("table", {}, el("caption", { class: "muted", text: caption }),
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col", class: c.num ? "num" : null }, c.label)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, columns.map((c) => el("td", { class: c.num ? "num" : null }, c.cell(r)))))));
}

/* a confirm step for every action that changes data: a modal dialog, keyboard-operable */
function confirmAction(text, label = "Confirm") {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = label;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
    document.getElementById("confirm-cancel").focus();
  });
}

async function act(text, label, fn) {
  if (!(await confirmAction(text, label))) { say("Cancelled."); return false; }
  try {
    const out = await fn();
    say(out || "Done.");
    return true;
  } catch (e) {
    say(e.message, true);
    return false;
  }
}

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
  view.replaceChildren(
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
  );
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

/* Share links (docs/share-links.md): POST /studies/{study}/share, GET /shares, DELETE /shares/{id} */
const EXPIRIES = [[86400, "1 day"], [7 * 86400, "7 days"], [30 * 86400, "30 days"]];

async function shareBox(uid) {
  const links = ((await json("/shares")) || []).filter((s) => s.study === uid && s.active);
  const select = el("select", { id: "share-expiry" }, EXPIRIES.map(([s, l]) => el("option", { value: s, selected: s === 7 * 86400 }, l)));
  const made = el("div", { id: "share-made" });
  const button = el("button", { type: "button", onclick: async () => {
    const label = select.selectedOptions[0].textContent;
    let doc = null;
    if (await act(`Make a link that lets anyone who has it read this study (viewer and DICOMweb, no account) for ${label}?`, "Share",
      async () => { doc = await json(dw(`/studies/${uid}/share`), { method: "POST", body: JSON.stringify({ expires_in: Number(select.value) }), headers: { "Content-Type": "application/json" } });
        return `Share link made; it expires ${doc.expires}. Its token is shown this once.`; })) {
      await refreshShares(uid);
      const out = document.getElementById("share-made");
      if (out && doc) out.replaceChildren(shareMade(doc));
    }
  } }, "Share…");
  return [
    el("p", {}, el("label", { for: "share-expiry" }, "Expires after "), select, " ", button),
    made,
    links.length ? table("This study's active share links (the token is shown once, when made)", [
      { label: "Link", cell: (s) => el("code", {}, s.id) },
      { label: "Created", cell: (s) => s.created },
      { label: "Expires", cell: (s) => s.expires },
      { label: "By", cell: (s) => s.creator },
      { label: "Actions", cell: (s) => el("button", { type: "button", "aria-label": `Revoke share link ${s.id}`, onclick: async () => {
        if (await act(`Revoke the share link ${s.id}? Whoever has it gets 401 from now on.`, "Revoke",
          async () => { await json(`/shares/${encodeURIComponent(s.id)}`, { method: "DELETE" }); return `Share link ${s.id} revoked.`; }))
          refreshShares(uid);
      } }, "Revoke") },
    ], links) : el("p", { id: "share-none" }, "No active share link."),
  ];
}

function shareMade(doc) {
  const url = el("input", { id: "share-url", readonly: true, value: doc.url, size: 60 });
  return el("p", { class: "share-made" }, el("label", { for: "share-url" }, "Viewer URL "), url, " ",
    el("button", { type: "button", onclick: async () => {
      try { await navigator.clipboard.writeText(doc.url); } catch (e) { url.select(); document.execCommand("copy"); }
      say("Copied the viewer URL.");
    } }, "Copy"),
    el("span", { class: "muted" }, ` DICOMweb root ${doc.dicomweb}, with Authorization: Bearer and the token in the URL; expires ${doc.expires}.`));
}

async function refreshShares(uid) {
  const s = document.getElementById("share");
  if (!s) return;
  const made = document.getElementById("share-made");
  try {
    s.replaceChildren(s.firstChild, ...(await shareBox(uid)));
    if (made) document.getElementById("share-made").replaceChildren(...made.childNodes);
  } catch (e) { say(e.message, true); }
}

/* Labels of a study (docs/notes/access-labels.md): PUT/DELETE /studies/{study}/labels/{label} */
const LABEL_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;

async function labelBox(uid) {
  const labels = (await json(dw(`/studies/${uid}/labels`))) || [];
  const input = el("input", { id: "label-new", name: "label", placeholder: "e.g. cardio", pattern: LABEL_RE.source, list: "labels-in-use" });
  const form = el("form", { class: "labels", "aria-label": "Add a label" },
    el("label", { for: "label-new" }, "New label (a-z 0-9 . _ -) "), input, " ",
    el("button", { type: "submit" }, "Add label"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const label = input.value.trim();
    if (!LABEL_RE.test(label)) { say(`"${label}" is not a label: 1 to 64 of a-z 0-9 . _ -, first a letter or digit.`, true); return; }
    if (await act(`Put the label "${label}" on this study? Who may see the study can change with it (access rules).`, "Add",
      async () => { const r = await json(dw(`/studies/${uid}/labels/${encodeURIComponent(label)}`), { method: "PUT" });
        return `Labels now: ${r.join(", ")}.`; })) refreshLabels(uid);
  });
  return [
    labels.length ? el("ul", { id: "label-list", class: "labels" }, labels.map((l) => el("li", {},
      el("a", { href: `#/find?label=${encodeURIComponent(l)}` }, l), " ",
      el("button", { type: "button", "aria-label": `Remove label ${l}`, onclick: async () => {
        if (await act(`Take the label "${l}" off this study?`, "Remove",
          async () => { const r = await json(dw(`/studies/${uid}/labels/${encodeURIComponent(l)}`), { method: "DELETE" });
            return r.length ? `Labels now: ${r.join(", ")}.` : "No label left."; })) refreshLabels(uid);
      } }, "Remove"))))
      : el("p", { id: "label-list" }, "No label."),
    form];
}

async function refreshLabels(uid) {
  const s = document.getElementById("labels");
  if (!s) return;
  try { s.replaceChildren(s.firstChild, ...(await labelBox(uid))); } catch (e) { say(e.message, true); }
}

/* $merge (docs/updates.md): every study of this study's patient moves under another patient */
function mergeForm(study) {
  const from = value(study, "00100020");
  const form = el("form", { class: "edit", "aria-label": "Merge this patient into another" },
    el("p", {}, `Moves every study of patient ID ${from || "(none)"} (not only this one) under the patient you name; each study gets a new version.`),
    el("label", {}, "Target patient ID", el("input", { name: "target-id", required: true })),
    el("label", {}, "Target patient name", el("input", { name: "target-name", placeholder: "kept if empty" })),
    el("button", { type: "submit" }, "Merge patient"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const id = form.elements["target-id"].value.trim();
    const name = form.elements["target-name"].value.trim();
    if (!id) return;
    const doc = { "00100020": { vr: "LO", Value: [id] } };
    if (name) doc["00100010"] = { vr: "PN", Value: [{ Alphabetic: name }] };
    const others = await json(dw(`/studies?PatientID=${encodeURIComponent(from)}&limit=1000`)).catch(() => null);
    const n = others ? others.length : "all";
    if (await act(`Merge patient ${from} into ${id}${name ? ` (${name})` : ""}: ${n} stud${n === 1 ? "y" : "ies"} of ${from} move to ${id}?`, "Merge",
      async () => { const r = await json(dw(`/patients/${encodeURIComponent(from)}/$merge`), { method: "POST", body: JSON.stringify(doc), headers: { "Content-Type": "application/dicom+json" } });
        return `Merged: ${r.studies.length} stud${r.studies.length === 1 ? "y" : "ies"} now under patient ${id}.`; }))
      route();
  });
  return form;
}

async function routing(uid) {
  const doc = await json(`/admin/queue/studies/${uid}`);
  const rows = Object.entries(doc.destinations).map(([name, d]) => ({ name, ...d }));
  const state = (d) => d.failed ? el("span", { class: "bad" }, "dead letter") :
    d.pending || d.in_flight ? "pending" : d.delivered ? el("span", { class: "ok" }, "delivered") : "not sent";
  return table("Per destination: this study's instances owed, delivered and given up on", [
    { label: "Destination", cell: (d) => d.name },
    { label: "Kind", cell: (d) => d.kind || "(no longer configured)" },
    { label: "State", cell: state },
    { label: "Delivered", num: true, cell: (d) => d.delivered },
    { label: "Pending", num: true, cell: (d) => d.pending + d.in_flight },
    { label: "Dead letters", num: true, cell: (d) => d.failed },
    { label: "Last error", cell: (d) => d.last_error || "" },
    { label: "Actions", cell: (d) => [
      d.kind === "stow" || d.kind === "dimse" ? el("button", { type: "button", onclick: async () => {
        if (await act(`Send every instance of this study to ${d.name}?`, "Send",
          async () => { const r = await json(`/admin/export/${encodeURIComponent(d.name)}/studies/${uid}`, { method: "POST" });
            return `${r.enqueued} instance(s) queued for ${d.name}.`; })) refreshRouting(uid);
      } }, `Send to ${d.name}`) : null,
      d.failed ? el("button", { type: "button", onclick: async () => {
        if (await act(`Retry the dead letters of ${d.name} (all its dead letters, not only this study's)?`, "Retry",
          async () => { const r = await json(`/admin/queue/retry-failed?destination=${encodeURIComponent(d.name)}`, { method: "POST" });
            return `${r.requeued} dead letter(s) back in the queue.`; })) refreshRouting(uid);
      } }, `Retry dead letters of ${d.name}`) : null,
    ] },
  ], rows);
}

async function refreshRouting(uid, rounds = 0) {
  const s = document.getElementById("routing");
  if (!s || location.hash !== `#/study/${uid}`) return;
  try {
    const t = await routing(uid);
    s.replaceChildren(s.firstChild, t, el("p", { class: "muted" }, `updated ${new Date().toLocaleTimeString()}`));
  } catch (e) {
    say(e.message, true);
  }
  if (rounds < 30) setTimeout(() => refreshRouting(uid, rounds + 1), 1000);  // the forwarder works on
}

const REASONS = [
  ["113001^DCM", "Rejected for Quality Reasons"], ["113037^DCM", "Rejected for Patient Safety Reasons"],
  ["113039^DCM", "Data Retention Policy Expired"], ["113038^DCM", "Incorrect Modality Worklist Entry"],
];

async function rejection(uid, rows) {
  rows = rows || [];
  if (rows.length) {
    return [el("p", { id: "rejection-state" }, `${rows.length} instance(s) rejected (${[...new Set(rows.map((r) => r.Reason))].join(", ")}), since ${new Date(rows[0].Time * 1000).toLocaleString()}. Hidden from every search and retrieve.`),
      el("button", { type: "button", onclick: async () => {
        if (await act("Restore the rejected instances of this study (they show again)?", "Restore",
          async () => { const r = await json(dw(`/studies/${uid}/$restore-rejected`), { method: "POST" }); return `${r.count} instance(s) restored.`; }))
          route();
      } }, "Restore rejected instances")];
  }
  const select = el("select", { id: "reject-reason" }, REASONS.map(([code, label]) => el("option", { value: code }, `${label} (${code})`)));
  return [el("p", { id: "rejection-state" }, "Not rejected."),
    el("label", { for: "reject-reason" }, "Reason "), select, " ",
    el("button", { type: "button", onclick: async () => {
      if (await act(`Reject the whole study (${select.selectedOptions[0].textContent})? It is hidden from every search and retrieve until restored.`, "Reject",
        async () => { const r = await json(dw(`/studies/${uid}/reject/${encodeURIComponent(select.value)}`), { method: "POST" }); return `${r.count} instance(s) rejected.`; }))
        route();
    } }, "Reject study")];
}

const EDITABLE = [
  ["00100010", "PN", "Patient name"], ["00100020", "LO", "Patient ID"], ["00100030", "DA", "Birth date (YYYYMMDD)"],
  ["00100040", "CS", "Sex"], ["00080050", "SH", "Accession number"], ["00081030", "LO", "Study description"],
];

function editForm(uid, study) {
  const form = el("form", { class: "edit", "aria-label": "Edit patient and study attributes" },
    EDITABLE.map(([tag, vr, label]) => el("label", {}, label, el("input", { name: tag, value: value(study, tag), "data-was": value(study, tag) }))),
    el("button", { type: "submit", class: "primary" }, "Save changes"));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const doc = {};
    for (const [tag, vr] of EDITABLE) {
      const input = form.elements[tag];
      if (input.value === input.dataset.was) continue;
      doc[tag] = { vr, Value: input.value === "" ? undefined : [vr === "PN" ? { Alphabetic: input.value } : input.value] };
      if (!doc[tag].Value) delete doc[tag].Value;
    }
    const names = Object.keys(doc).map((t) => EDITABLE.find((e) => e[0] === t)[2]);
    if (!names.length) { say("Nothing changed."); return; }
    if (await act(`Change ${names.join(", ")} of every instance of this study ($update: each instance gets a new version)?`, "Save",
      async () => { await json(dw(`/studies/${uid}/$update`), { method: "POST", body: JSON.stringify(doc), headers: { "Content-Type": "application/dicom+json" } });
        return `Updated: ${names.join(", ")}.`; }))
      route();
  });
  return form;
}

async function versionList(uid) {
  const inst = (await json(dw(`/studies/${uid}/instances?limit=20&includefield=00200013`))) || [];
  const rows = await Promise.all(inst.map(async (i) => {
    const v = await json(dw(`/studies/${uid}/series/${value(i, "0020000E")}/instances/${value(i, "00080018")}/versions`));
    return { i, v };
  }));
  return table(`Versions of the study's first ${rows.length} instance(s)`, [
    { label: "Instance", cell: (r) => el("code", {}, value(r.i, "00080018")) },
    { label: "Versions", num: true, cell: (r) => r.v.length },
    { label: "Current size", num: true, cell: (r) => { const c = r.v.find((x) => x.current); return c ? `${c.size.toLocaleString()} B` : ""; } },
    { label: "History", cell: (r) => r.v.map((x) => `v${x.version} ${x.action} ${x.time}`).join("; ") },
  ], rows);
}

async function changeHistory(uid) {  // not "history": that would replace window.history
  const latest = await json(dw("/changefeed/latest?includemetadata=false"));
  if (!latest) return el("p", {}, "The change log is empty.");
  const last = latest.Sequence;
  const entries = [];
  for (let offset = Math.max(0, last - 300); offset < last; offset += 100) {
    entries.push(...(await json(dw(`/changefeed?offset=${offset}&limit=100&includemetadata=false`))));
  }
  const mine = entries.filter((e) => e.StudyInstanceUid === uid).reverse();
  return table(`This study's entries among the archive's last ${Math.min(last, 300)} changes, newest first`, [
    { label: "Sequence", num: true, cell: (e) => e.Sequence },
    { label: "Time", cell: (e) => e.Timestamp },
    { label: "Action", cell: (e) => e.Action },
    { label: "State", cell: (e) => e.State },
    { label: "Instance", cell: (e) => el("code", {}, e.SopInstanceUid) },
  ], mine.slice(0, 50));
}

function deleteBox(uid) {
  return el("button", { type: "button", class: "danger", onclick: async () => {
    if (await act("Delete this study and all its instances from the archive? This cannot be undone.", "Delete",
      async () => { await api(dw(`/studies/${uid}`), { method: "DELETE" }); return `Study ${uid} deleted.`; }))
      location.hash = "#/find";
  } }, "Delete study");
}

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
const bytes = (n) => { for (const u of ["B", "KB", "MB", "GB", "TB"]) { if (n < 1000 || u === "TB") return `${n.toFixed(u === "B" ? 0 : 1)} ${u}`; n /= 1000; } };

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

/* -- the router: #/find?..., #/study/UID, #/watch ------------------------------------------- */

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
  else await renderFind(params);
  document.title = `dicomweb-archive: ${path.split("/")[1] || "find"}`;
}

window.addEventListener("hashchange", () => { route(); view.focus(); });
oidcCallback().catch((e) => say(String(e.message || e), true)).finally(() => { showWho(); route(); });
