/* The operator's page of dicomweb-archive (dicomweb_server/ui/, docs/operator.md).
 * Plain JavaScript, no build step, no library: every read and every change goes through
 * the archive's own REST API (QIDO-RS, WADO-RS, STOW-RS, DELETE, $update, reject/restore,
 * the change feed, /admin/..., /jobs, /metrics), with the credentials typed in the page.
 *
 * Several classic scripts (index.html loads them in order, deferred) share the page's global
 * scope: core.js (this file: the API, DICOM JSON values, DOM helpers, the confirm step),
 * auth.js (credentials, OIDC login and its renewal), find.js (Find, upload), study.js (the study page),
 * actions.js (the study's actions), deidentify.js (de-identification jobs), jobs.js (the
 * Jobs view), watch.js (Watch), app.js (the router, started last). */
"use strict";

const PREFIX = document.querySelector('meta[name="dicomweb-prefix"]').content;
const view = document.getElementById("view");
const statusLine = document.getElementById("status");

/* -- the API ------------------------------------------------------------------------------- */

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

/* A 401 to a call made with an OIDC token: the token is renewed once (auth.js; a renewal
 * already made since the call went out counts) and the call is made once more. A 401 to that
 * retry, or to any call made with a renewed token no call has yet been answered with, logs out
 * (auth.js's renewedTokenRefused: the archive refuses this provider's tokens): at most one
 * 401-triggered renewal per token, never a renewal per poll. Bodies the page sends (text, Blob)
 * can be sent again. */
async function api(path, options = {}, retried = false) {
  const headers = new Headers(options.headers || {});
  const auth = authorization();
  if (auth) headers.set("Authorization", auth);
  if (!headers.has("Accept")) headers.set("Accept", "application/json, application/dicom+json");
  const r = await fetch(path, { ...options, headers });
  if (r.status !== 401 && auth && authorization() === auth) sessionStorage.removeItem("auth-unproven");  // accepted
  if (r.status === 401 && auth && canRenew()) {
    r.body && r.body.cancel().catch(() => {});
    if (retried || (authorization() === auth && sessionStorage.getItem("auth-unproven"))) {
      renewedTokenRefused();
      throw new ApiError(401, `401: ${sessionStorage.getItem("auth-why")}: log in again`);
    }
    const failed = authorization() !== auth ? null : await renewToken().then(() => null, (e) => e);
    if (!failed) return api(path, options, true);
    throw new ApiError(401, `401: the token was refused and could not be renewed (${failed.message})`);
  }
  if (!r.ok) {
    let text = await r.text();
    try {
      const doc = JSON.parse(text);
      text = doc.detail || doc.error || doc.message || text;
      if (typeof text !== "string") text = JSON.stringify(text);
    } catch (e) { /* not JSON: the text itself */ }
    const why = sessionStorage.getItem("auth-scheme") === "oidc-expired" && sessionStorage.getItem("auth-why");
    const hint = r.status === 401 ? (why ? ` (the login expired: ${why}; log in again)` : OIDC ? " (log in, or enter credentials above)" : " (enter credentials above)") : r.status === 403 ? " (these credentials lack the scope)" : "";
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

/* a size in bytes, as people read it (1000-based, as disks are sold) */
const bytes = (n) => { for (const u of ["B", "KB", "MB", "GB", "TB"]) { if (n < 1000 || u === "TB") return `${n.toFixed(u === "B" ? 0 : 1)} ${u}`; n /= 1000; } };
