/* Credentials of the operator's page (see core.js): API key, Basic, OIDC login. */
"use strict";

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
      : scheme === "oidc" ? "logged in as " + sessionStorage.getItem("auth-user")
      : scheme === "oidc-expired" ? "none: the login expired" : "none";
  const button = document.getElementById("oidc-login");
  button.textContent = scheme === "oidc-expired" ? "Log in again" : "Log in";
  button.classList.toggle("primary", scheme === "oidc-expired");
}

document.getElementById("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const f = ev.target.elements;
  sessionStorage.setItem("auth-scheme", f.scheme.value);
  sessionStorage.setItem("auth-key", f.key.value);
  sessionStorage.setItem("auth-user", f.user.value);
  sessionStorage.setItem("auth-password", f.password.value);
  forgetOidcTokens();
  showWho();
  document.getElementById("login").open = false;
  route();
});

/* -- OIDC login: the authorization code flow with PKCE (OpenID Connect Core 1.0 §3.1, RFC 7636
 * S256) as a public client. The page's address (/ui/) is the redirect URI; the access token
 * it gets is sent as "Authorization: Bearer" and checked by the archive like any other.
 * Tokens live in this tab's sessionStorage only (auth-token, auth-refresh), never in an
 * address or a log line; the code verifier, state and nonce of a silent renewal stay in memory. */

const OIDC = JSON.parse(document.querySelector('meta[name="dicomweb-oidc"]').content || "null");
const b64url = (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes)))
  .replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
const randomText = () => b64url(crypto.getRandomValues(new Uint8Array(32)));  // 43 characters
const redirectUri = () => location.origin + "/ui/";
const silentRedirectUri = () => location.origin + "/ui/silent-callback.html";  // web_login.py
const OIDC_KEYS = ["auth-token", "auth-refresh", "auth-expires", "auth-renew-at", "auth-sub", "auth-unproven", "auth-why"];
const RENEW_AT = 0.8;  // of the token's lifetime
const SILENT_TIMEOUT_MS = 10000;  // a provider that does not come back to the hidden frame (a page shown, a blocked frame)

function claimsOf(jwt) {  // for showing who logged in and when its token ends only: the archive checks it
  try {
    const part = jwt.split(".")[1].replaceAll("-", "+").replaceAll("_", "/");
    return JSON.parse(new TextDecoder().decode(Uint8Array.from(atob(part), (c) => c.charCodeAt(0))));
  } catch (e) { return {}; }
}

let discovered = null;  // the provider's discovery document (OpenID Connect Discovery 1.0 §4), once a page load
function discovery() {
  if (!discovered) {
    discovered = fetch(OIDC.authority.replace(/\/$/, "") + "/.well-known/openid-configuration").then((r) => {
      if (!r.ok) throw new Error(`the identity provider's discovery document: ${r.status}`);
      return r.json();
    });
    discovered.catch(() => { discovered = null; });  // asked again next time
  }
  return discovered;
}

async function pkce() {  // RFC 7636 §4.1-4.2
  if (!window.isSecureContext || !crypto.subtle) {
    throw new Error("logging in needs this page over HTTPS (or on localhost): the browser's WebCrypto is off here");
  }
  const verifier = randomText();
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  return { verifier, challenge, state: randomText(), nonce: randomText() };
}

function authorizationUrl(meta, p, redirect, extra = {}) {
  return meta.authorization_endpoint + "?" + new URLSearchParams({
    response_type: "code", client_id: OIDC.client_id, redirect_uri: redirect, scope: OIDC.scope,
    state: p.state, nonce: p.nonce, code_challenge: p.challenge, code_challenge_method: "S256", ...extra });
}

class LoginError extends Error {  // code: the provider's error (login_required, invalid_grant...), if any
  constructor(message, code = "") { super(message); this.code = code; }
}

async function tokenRequest(endpoint, form) {  // RFC 6749 §4.1.3 and §6
  const r = await fetch(endpoint, {
    method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({ client_id: OIDC.client_id, ...form }) });
  const doc = await r.json().catch(() => ({}));
  if (!r.ok || !doc.access_token) {
    throw new LoginError(`no token (${doc.error || r.status}) ${doc.error_description || ""}`.trim(), doc.error || "");
  }
  return doc;
}

/* Keep a token answer: the access token, the refresh token (a new one replaces the old, RFC 6749
 * §6; an answer without one keeps the old), when it ends and when to renew it (RENEW_AT of its
 * lifetime: expires_in, else the access token's exp - iat). The ID token's nonce must be ours;
 * a renewal must be for the same user, and is dropped when the operator chose other credentials
 * while it ran. The user is the ID token's sub only: a renewal's ID token, if any, must have the
 * login's sub (OpenID Connect Core 1.0 §12.2); an answer without one is not checked, as the
 * access token's sub may differ from the ID token's (pairwise identifiers per audience, §8).
 * A renewed token is "unproven" until a call made with it is answered other than 401 (core.js). */
function keepTokens(doc, nonce, renewed = false) {
  const id = doc.id_token ? claimsOf(doc.id_token) : {};
  if (doc.id_token && nonce && id.nonce !== nonce) throw new LoginError("refused: the ID token is not for this login (nonce)", "nonce");
  const access = claimsOf(doc.access_token);
  const before = sessionStorage.getItem("auth-sub");  // null: a login of an older page
  if (renewed) {
    if (sessionStorage.getItem("auth-scheme") !== "oidc") return;
    if (doc.id_token && before !== null && (id.sub || "") !== before) throw new LoginError("refused: the token is for another user (sub)", "sub");
  }
  if (doc.id_token) sessionStorage.setItem("auth-sub", id.sub || "");
  if (renewed) sessionStorage.setItem("auth-unproven", "1"); else sessionStorage.removeItem("auth-unproven");
  sessionStorage.removeItem("auth-why");
  const now = Date.now();
  const lifetime = Number(doc.expires_in) > 0 ? Number(doc.expires_in) * 1000
    : access.exp && access.iat ? (access.exp - access.iat) * 1000 : access.exp ? access.exp * 1000 - now : NaN;
  sessionStorage.setItem("auth-scheme", "oidc");
  sessionStorage.setItem("auth-token", doc.access_token);
  if (doc.refresh_token) sessionStorage.setItem("auth-refresh", doc.refresh_token);
  for (const k of ["auth-expires", "auth-renew-at"]) sessionStorage.removeItem(k);
  if (lifetime > 0) {
    sessionStorage.setItem("auth-expires", String(now + lifetime));
    sessionStorage.setItem("auth-renew-at", String(now + RENEW_AT * lifetime));
  }
  if (doc.id_token || !sessionStorage.getItem("auth-user")) {
    sessionStorage.setItem("auth-user", id.preferred_username || id.email || id.sub || access.sub || "?");
  }
  scheduleRenewal();
}

function forgetOidcTokens() {
  for (const k of OIDC_KEYS) sessionStorage.removeItem(k);
  scheduleRenewal();
}

async function oidcLogin() {
  const p = await pkce();
  const meta = await discovery();
  sessionStorage.setItem("oidc-pending", JSON.stringify(
    { verifier: p.verifier, state: p.state, nonce: p.nonce, hash: location.hash, token_endpoint: meta.token_endpoint }));
  location.assign(authorizationUrl(meta, p, redirectUri()));
}

async function oidcCallback() {
  const q = new URLSearchParams(location.search);
  if (!OIDC || !(q.has("code") || q.has("error"))) return;
  const pending = JSON.parse(sessionStorage.getItem("oidc-pending") || "null");
  sessionStorage.removeItem("oidc-pending");
  history.replaceState(null, "", location.pathname + ((pending && pending.hash) || ""));
  if (!pending || q.get("state") !== pending.state) throw new Error("login refused: the answer is not for the login this page started (state)");
  if (q.has("error")) throw new Error(`login refused by the identity provider: ${q.get("error")} ${q.get("error_description") || ""}`);
  let doc;
  try {
    doc = await tokenRequest(pending.token_endpoint, {
      grant_type: "authorization_code", code: q.get("code"), redirect_uri: redirectUri(), code_verifier: pending.verifier });
    sessionStorage.removeItem("auth-refresh");  // a new login: no refresh token of an older one
    keepTokens(doc, pending.nonce);
  } catch (e) {
    throw new Error(`login failed: ${e.message}`);
  }
  say(`Logged in as ${sessionStorage.getItem("auth-user")}.`);
}

/* -- renewing the token before it expires, without the user: the refresh token when the provider
 * gave one (RFC 6749 §6), else a silent authorization request (prompt=none, OpenID Connect Core
 * 1.0 §3.1.2.1) in a hidden frame, with its own PKCE verifier, state and nonce, answered through
 * the provider's session and back at /ui/silent-callback.html, whose page posts its address to
 * this page (same origin only). Refused (login_required, ...): the page says the login expired
 * and offers "Log in again"; nothing is tried again until then. */

function silentCode(meta, p) {
  return new Promise((resolve, reject) => {
    const frame = document.createElement("iframe");
    frame.hidden = true;
    frame.title = "renewing the login";
    let timer = null;
    const done = () => { clearTimeout(timer); window.removeEventListener("message", onMessage); frame.remove(); };
    const onMessage = (ev) => {
      if (ev.origin !== location.origin || ev.source !== frame.contentWindow || !ev.data || ev.data.source !== "oidc-client") return;
      done();
      resolve(new URL(ev.data.url));
    };
    window.addEventListener("message", onMessage);
    timer = setTimeout(() => { done(); reject(new LoginError("no answer from the identity provider in time", "timeout")); }, SILENT_TIMEOUT_MS);
    frame.src = authorizationUrl(meta, p, silentRedirectUri(), { prompt: "none" });
    document.body.append(frame);
  });
}

async function silentRenewal(meta) {
  const p = await pkce();
  const q = (await silentCode(meta, p)).searchParams;
  if (q.get("state") !== p.state) throw new LoginError("refused: the answer is not for this renewal (state)", "state");
  if (q.has("error")) throw new LoginError(`${q.get("error")} ${q.get("error_description") || ""}`.trim(), q.get("error"));
  const doc = await tokenRequest(meta.token_endpoint, {
    grant_type: "authorization_code", code: q.get("code"), redirect_uri: silentRedirectUri(), code_verifier: p.verifier });
  keepTokens(doc, p.nonce, true);
}

async function renewal() {
  const meta = await discovery();
  const refresh = sessionStorage.getItem("auth-refresh");
  if (refresh) {
    try {
      const doc = await tokenRequest(meta.token_endpoint, { grant_type: "refresh_token", refresh_token: refresh });
      keepTokens(doc, null, true);
      return;
    } catch (e) {
      if (!refusal(e)) throw e;  // no answer (network, 5xx): the refresh token is kept for the next try
      sessionStorage.removeItem("auth-refresh");  // refused (revoked, expired): the provider's session may still do
    }
  }
  await silentRenewal(meta);
}

/* an answer of the provider that says no (login_required, invalid_grant...), or one this page
 * refuses (state, nonce); not: no answer at all (network, a 5xx without an error, a frame
 * that never came back) */
const refusal = (e) => e instanceof LoginError && Boolean(e.code) && e.code !== "timeout";

let renewing = null;  // one renewal at a time: every caller waits for the same one
function renewToken() {
  if (!renewing) {
    renewing = renewal().catch((e) => { renewalFailed(e); throw e; }).finally(() => { renewing = null; });
  }
  return renewing;
}

/* Refused, or the token ended: logged out. No answer while the token still lasts: tried again
 * halfway to its end. */
function renewalFailed(e) {
  const left = Number(sessionStorage.getItem("auth-expires")) - Date.now();
  if (!refusal(e) && left > 2000 && sessionStorage.getItem("auth-scheme") === "oidc") {
    clearTimeout(renewTimer);
    renewTimer = setTimeout(() => renewToken().catch(() => {}), left / 2);
    return;
  }
  loginExpired(e);
}

function loginExpired(e, text = `The login expired and could not be renewed (${e.message}): log in again.`) {
  if (sessionStorage.getItem("auth-scheme") !== "oidc") return;  // the user chose other credentials meanwhile
  forgetOidcTokens();
  sessionStorage.setItem("auth-scheme", "oidc-expired");
  sessionStorage.setItem("auth-why", e.message);  // core.js: the hint of every 401 until the next login
  showWho();
  say(text, true);
}

/* A 401 to a renewed token no call has yet been answered with (or to the retry after a renewal):
 * the provider issues tokens the archive refuses (another audience, its clock ahead so iat or nbf
 * lie in the future...). Renewing again would get one more such token every poll (Jobs, Watch),
 * rotating the refresh token forever: at most one 401-triggered renewal per token, then logged out. */
function renewedTokenRefused() {
  const why = "the archive refused the renewed token (401): it does not take this identity provider's tokens (audience, issuer, clock?)";
  loginExpired(new LoginError(why, "refused"), `Logged out: ${why}. Log in again, or ask the archive's administrator.`);
}

let renewTimer = null;
function scheduleRenewal() {
  clearTimeout(renewTimer);
  renewTimer = null;
  const at = Number(sessionStorage.getItem("auth-renew-at"));
  if (sessionStorage.getItem("auth-scheme") !== "oidc" || !at) return;  // no lifetime known: renewed on a 401 only
  renewTimer = setTimeout(() => renewToken().catch(() => {}), Math.min(Math.max(0, at - Date.now()), 2 ** 31 - 1));
}

/* a tab in the background gets its timers late (Chromium: once a minute or less): renew on its return */
document.addEventListener("visibilitychange", () => {
  const at = Number(sessionStorage.getItem("auth-renew-at"));
  if (document.visibilityState === "visible" && sessionStorage.getItem("auth-scheme") === "oidc" && at && Date.now() >= at) {
    renewToken().catch(() => {});
  }
});

/* A 401 with the OIDC token (core.js's api()): one renewal, then the call once more; a 401 to a
 * renewed token not yet accepted: renewedTokenRefused(). */
const canRenew = () => OIDC && sessionStorage.getItem("auth-scheme") === "oidc";

if (OIDC) {
  const button = document.getElementById("oidc-login");
  button.hidden = false;
  button.addEventListener("click", () => oidcLogin().catch((e) => say(String(e.message || e), true)));
}
