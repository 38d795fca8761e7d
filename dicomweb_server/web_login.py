"""The OpenID Connect login of the archive's web pages, the viewer (viewer.py) and the
operator's page (ui/): what they are told about the provider. The archive itself checks
the access tokens they then send (api/auth.py) and never sees a password or a code.

Both pages use the authorization code flow with PKCE (OpenID Connect Core 1.0 §3.1,
RFC 7636 with S256) as a public client (no secret in a browser page); docs/notes/oidc.md
lists the redirect URIs to register.

Both renew an expiring access token without the user: with a refresh token when the provider
gave one (RFC 6749 §6), else by a silent authorization request (``prompt=none``, OpenID
Connect Core 1.0 §3.1.2.1) in a hidden frame that the provider sends back to
``SILENT_CALLBACK`` under the page (``/viewer/silent-callback.html``,
``/ui/silent-callback.html``): one page, ``SILENT_CALLBACK_PAGE``, for both.
"""

from __future__ import annotations

from typing import NamedTuple

SILENT_CALLBACK = "silent-callback.html"

# the page the provider sends the hidden frame of a silent renewal back to: hands its URL
# (the code and state, or the error) to the page that made the frame, and to no other origin.
# Its message is oidc-client-ts's (the viewer's library); /ui/'s auth.js reads the same one.
# (OHIF's own silent-refresh.html loads the older oidc-client library, and a script from a
# CDN, and does not answer oidc-client-ts.)
SILENT_CALLBACK_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>signing in</title></head><body>
<script>window.parent.postMessage({source: "oidc-client", url: window.location.href, keepOpen: false},
                                  window.location.origin);</script>
</body></html>
"""
# sent with it: never cached, and the address (it holds the code) not passed on as a Referer
SILENT_CALLBACK_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


class OidcLogin(NamedTuple):
    """The login of the archive's web pages at an OpenID Provider: authorization code flow
    with PKCE (RFC 7636, S256) as a public client (OpenID Connect Core 1.0 §3.1)."""

    authority: str  # the issuer (its /.well-known/openid-configuration)
    client_id: str
    scope: str

    @classmethod
    def of(cls, settings) -> "OidcLogin | None":
        if not (settings.oidc_client_id and settings.oidc_issuer):
            return None
        return cls(settings.oidc_issuer, settings.oidc_client_id, settings.oidc_scope)
