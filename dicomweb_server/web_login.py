"""The OpenID Connect login of the archive's web pages, the viewer (viewer.py) and the
operator's page (ui/): what they are told about the provider. The archive itself checks
the access tokens they then send (api/auth.py) and never sees a password or a code.

Both pages use the authorization code flow with PKCE (OpenID Connect Core 1.0 §3.1,
RFC 7636 with S256) as a public client (no secret in a browser page); docs/notes/oidc.md
lists the redirect URIs to register.
"""

from __future__ import annotations

from typing import NamedTuple


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
