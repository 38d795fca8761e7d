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
