"""Sign-in through the site's OpenID Connect provider (portal.yaml's ``oidc``): JupyterHub's OAuthenticator
(GenericOAuthenticator, the authorization code flow with PKCE), with what a portal that starts Slurm jobs as the
signed-in person needs on top, each through OAuthenticator's public hooks:

- **The ID token is verified** (``get_token_info``): its signature against the provider's published keys, its
  issuer, audience, times, and a nonce bound to this browser's login (``SignInHandler``). OAuthenticator reads
  the token's claims unverified (OIDC Core 3.1.3.7 lets a client rely on TLS for a token it fetched itself);
  here a token altered on its way, expired, or minted for another login is refused all the same.
- **The person must have a Unix account here** (``update_auth_model``): the username claim is her account name,
  which owns her Slurm jobs; a name that is not one, or no account of that name, is refused in words.
- **Groups decide** who may log in and who is an admin, from the token's groups claim; the hub's groups (for
  sharing) stay her Unix groups, as with LDAP.
- **The provider down or slow** is a 503 in words within ``oidc.timeout``, not a 500.

The provider's endpoints come from its discovery document, fetched at the first login and kept for an hour; its
keys are fetched again when a token names one not yet seen (a key rotation), at most once a minute.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import pwd
import re
import time

import jwt
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthCallbackHandler, OAuthLoginHandler
from tornado import web
from tornado.httpclient import HTTPClientError
from traitlets import Instance, List, Unicode

from portal.core.settings import OidcSettings
from portal.core.userjson import unix_groups
from portal.hub import metrics

UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")  # as LDAP logins: names that own Slurm jobs
# Asymmetric signatures only: "none" and the HMAC family (whose key would be the client secret) never verify.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DISCOVERY_AGE = 3600  # seconds the provider's discovery document is kept
KEYS_REFETCH = 60  # seconds between fetches of its keys for a token naming an unknown key

NOT_ANSWERING = "The sign-in service is not answering right now. Please try again in a minute."
STALE = ("This sign-in did not start in this browser, or was already used. Please go back to the portal's "
         "address and sign in again.")


def stale() -> web.HTTPError:
    """A callback this browser did not start, or one used already: 400, in words."""
    return web.HTTPError(400, STALE, reason="Sign-in link not valid")


class ProviderUnavailable(web.HTTPError):
    """The OpenID provider did not answer in time, or answered nonsense: 503, in words."""

    def __init__(self):
        super().__init__(503, NOT_ANSWERING, reason="Sign-in service unavailable")


class TokenRefused(web.HTTPError):
    """An ID token that does not verify: 403. What was wrong goes to the hub's log, not to the browser."""

    def __init__(self):
        super().__init__(403, "The sign-in service's answer could not be verified, so nobody was signed in. "
                              "Please sign in again; if this repeats, tell your admin.", reason="Sign-in not verified")


def state_id(state: str) -> str:
    """The state_id inside OAuthenticator's state parameter (base64 of JSON); '' if it has none."""
    try:
        return str(json.loads(base64.urlsafe_b64decode(state.encode("ascii")))["state_id"])
    except (ValueError, KeyError, TypeError, UnicodeError):
        return ""


def nonce_for(secret: bytes, state: str) -> str:
    """The nonce a login asks for, bound to its state (which its signed cookie holds): HMAC, so nothing is
    stored, and it survives a hub restart between the redirect and the callback."""
    return hmac.new(secret, f"oidc-nonce:{state_id(state)}".encode(), hashlib.sha256).hexdigest()


def _cookie_secret(handler) -> bytes:
    secret = handler.settings["cookie_secret"]
    return secret if isinstance(secret, bytes) else str(secret).encode()


class SignInHandler(OAuthLoginHandler):
    """OAuthenticator's redirect to the provider, once its endpoints are known, with a nonce."""

    async def get(self):
        await self.authenticator.discover()
        return super().get()

    def authorize_redirect(self, *args, extra_params=None, **kwargs):
        extra_params = dict(extra_params or {})
        extra_params["nonce"] = nonce_for(_cookie_secret(self), extra_params["state"])
        return super().authorize_redirect(*args, extra_params=extra_params, **kwargs)


class SignInCallbackHandler(OAuthCallbackHandler):
    """OAuthenticator's callback, its refusals in words a person understands."""

    def check_state(self):
        try:
            super().check_state()
        except web.HTTPError as error:
            self.log.warning("OpenID sign-in refused: %s (a stale, replayed or forged callback)", error.log_message)
            metrics.LOGINS.labels("refused").inc()
            raise stale() from None

    def check_error(self):
        error = self.get_argument("error", "")
        if error:
            description = self.get_argument("error_description", "")[:200]
            self.log.warning("OpenID sign-in: the provider answered %s (%s)", error[:60], description)
            metrics.LOGINS.labels("refused").inc()
            raise web.HTTPError(403, "The sign-in service did not sign you in"
                                + (f": {description}" if description else f" ({error[:60]})")
                                + ". Please go back to the portal's address and try again.", reason="Not signed in")


class PortalOIDCAuthenticator(GenericOAuthenticator):
    """GenericOAuthenticator from portal.yaml's ``oidc``: verified ID tokens, Unix accounts, groups from claims."""

    login_handler = SignInHandler
    callback_handler = SignInCallbackHandler

    oidc = Instance(OidcSettings, allow_none=True, help="portal.yaml's oidc section (the model itself).").tag(
        config=True)
    sharing_groups = List(Unicode(), help="portal.yaml's sharing.groups: the hub's groups, set from each "
                          "user's Unix groups at her login (Authenticator.manage_groups).").tag(config=True)

    _discovered: dict | None = None
    _discovered_at = 0.0
    _keys: dict | None = None
    _keys_at = 0.0

    async def _fetch(self, url: str, what: str, **kwargs) -> dict:
        try:
            answer = await self.httpfetch(url, what, **kwargs)
        except HTTPClientError as error:
            if error.code == 599 or error.code >= 500:  # 599: no answer (refused, timed out, TLS)
                self.log.error("OpenID provider: %s %s failed: %s", what, url, error)
                metrics.LOGINS.labels("provider_unavailable").inc()
                raise ProviderUnavailable() from None
            raise
        except OSError as error:
            self.log.error("OpenID provider: %s %s failed: %s", what, url, error)
            metrics.LOGINS.labels("provider_unavailable").inc()
            raise ProviderUnavailable() from None
        if not isinstance(answer, dict):
            self.log.error("OpenID provider: %s %s gave no JSON object", what, url)
            raise ProviderUnavailable()
        return answer

    async def discover(self) -> dict:
        """The provider's discovery document (kept an hour): its endpoints become OAuthenticator's."""
        if self._discovered and time.monotonic() - self._discovered_at < DISCOVERY_AGE:
            return self._discovered
        issuer = self.oidc.issuer
        document = await self._fetch(f"{issuer}/.well-known/openid-configuration", "discovery")
        if document.get("issuer", "").rstrip("/") != issuer:
            self.log.error("OpenID provider: its discovery names issuer %r, portal.yaml's oidc.issuer is %r",
                           document.get("issuer"), issuer)
            raise ProviderUnavailable()
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not str(document.get(key, "")).startswith(("https://", "http://")):
                self.log.error("OpenID provider: its discovery has no %s", key)
                raise ProviderUnavailable()
        self.authorize_url, self.token_url = document["authorization_endpoint"], document["token_endpoint"]
        self._discovered, self._discovered_at = document, time.monotonic()
        return document

    async def signing_key(self, kid: str | None) -> jwt.PyJWK | None:
        """The provider's published key ``kid`` (its only key where the token names none)."""
        for fresh in (False, True):
            if fresh or self._keys is None:
                if self._keys is not None and time.monotonic() - self._keys_at < KEYS_REFETCH:
                    return None
                document = await self.discover()
                keys = await self._fetch(document["jwks_uri"], "keys")
                self._keys = {key.get("kid"): key for key in keys.get("keys", []) if key.get("use", "sig") == "sig"}
                self._keys_at = time.monotonic()
            if kid in self._keys or (kid is None and len(self._keys) == 1):
                return jwt.PyJWK(self._keys[kid] if kid in self._keys else next(iter(self._keys.values())))
        return None

    async def verify_id_token(self, token: str, nonce: str | None) -> dict:
        """The ID token's claims, once its signature, issuer, audience, times and nonce all check out.
        ``nonce`` None: a token from a refresh, which carries none."""
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") not in ALGORITHMS:
                raise jwt.InvalidTokenError(f"signed with {header.get('alg')!r}, not a public-key algorithm")
            key = await self.signing_key(header.get("kid"))
            if key is None:
                raise jwt.InvalidTokenError(f"signed with a key the provider does not publish (kid {header.get('kid')!r})")
            claims = jwt.decode(token, key, algorithms=[header["alg"]], audience=self.client_id,
                                issuer=self.oidc.issuer, leeway=self.oidc.clock_skew,
                                options={"require": ["iss", "aud", "exp", "iat", "sub"]})
            audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
            if (len(audiences) > 1 or "azp" in claims) and claims.get("azp") != self.client_id:
                raise jwt.InvalidTokenError(f"issued to {claims.get('azp')!r}, not to this portal")
            if nonce is not None and not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
                raise jwt.InvalidTokenError("its nonce is not this login's (a token of another login, replayed)")
        except jwt.PyJWTError as error:
            self.log.warning("OpenID sign-in refused: the ID token does not verify: %s", error)
            metrics.LOGINS.labels("refused").inc()
            raise TokenRefused() from None
        return claims

    async def get_token_info(self, handler, params):
        """OAuthenticator's token request, then the ID token verified; its claims are what token_to_user gives."""
        await self.discover()
        try:
            token_info = await super().get_token_info(handler, params)
        except HTTPClientError as error:
            if error.code == 599 or error.code >= 500:
                self.log.error("OpenID provider: the token request failed: %s", error)
                metrics.LOGINS.labels("provider_unavailable").inc()
                raise ProviderUnavailable() from None
            # 400 invalid_grant: the code was used already (a replayed callback) or has expired
            self.log.warning("OpenID sign-in refused: the provider refused the code (%s)", error)
            metrics.LOGINS.labels("refused").inc()
            raise stale() from None
        except OSError as error:
            self.log.error("OpenID provider: the token request failed: %s", error)
            raise ProviderUnavailable() from None
        if not token_info.get("id_token"):
            self.log.error("OpenID provider: its token answer has no ID token (is 'openid' in oidc.scopes?)")
            raise TokenRefused()
        nonce = None
        if params.get("grant_type") == "authorization_code":
            nonce = nonce_for(_cookie_secret(handler), handler.get_state_cookie())
        token_info["dsportal_id_claims"] = await self.verify_id_token(token_info["id_token"], nonce)
        return token_info

    async def token_to_user(self, token_info):
        """Who she is: the verified ID token's claims (never the unverified decode)."""
        try:
            return token_info["dsportal_id_claims"]
        except KeyError:
            raise TokenRefused() from None

    def _groups_claim(self, claims: dict) -> set[str]:
        groups = claims.get(self.oidc.groups_claim, [])
        if isinstance(groups, str):
            groups = [groups]
        return {str(group).strip("/") for group in groups} if isinstance(groups, list) else set()  # Keycloak: /name

    async def update_auth_model(self, auth_model):
        """Refused in words unless her name is a Unix account name, she is in an allowed group, and the account
        exists here; admin from admin_groups."""
        name, claims = auth_model["name"], auth_model["auth_state"][self.user_auth_state_key]
        who = f"You signed in as {name!r}"
        if not UNIX_NAME.match(name):
            self._refuse(name, "not a Unix account name", f"{who}, which is not an account name on this cluster.")
        groups = self._groups_claim(claims)
        allowed = set(self.oidc.allowed_groups)
        if allowed and not groups & allowed:
            self._refuse(name, f"in none of the allowed groups (the token's {self.oidc.groups_claim}: "
                         f"{sorted(groups)})", f"{who}, but you are not in a group that may use this portal.")
        try:
            await asyncio.get_running_loop().run_in_executor(None, pwd.getpwnam, name)  # NSS may be LDAP/sssd: slow
        except KeyError:
            self._refuse(name, "no Unix account of that name here", f"{who}, but this cluster has no account of "
                         "that name for your sessions to run as.")
        if self.oidc.admin_groups and not auth_model["admin"]:
            auth_model["admin"] = bool(groups & set(self.oidc.admin_groups))
        metrics.LOGINS.labels("ok").inc()
        return auth_model

    def _refuse(self, name: str, why: str, words: str):
        self.log.warning("OpenID sign-in of %r refused: %s", name, why)
        metrics.LOGINS.labels("refused").inc()
        raise web.HTTPError(403, f"{words} Please ask your admin.", reason="Not allowed")

    async def get_user_groups(self, auth_state: dict):
        """The hub's groups, for sharing: the sharing groups of her Unix account (as with LDAP), not the token's."""
        name = self.normalize_username(self.user_info_to_username(auth_state[self.user_auth_state_key]))
        mine = await asyncio.get_running_loop().run_in_executor(None, unix_groups, name)
        return mine & set(self.sharing_groups)


def configure_oidc(c, settings) -> None:
    """The hub's authenticator from portal.yaml's oidc."""
    oidc = settings.oidc
    c.JupyterHub.authenticator_class = PortalOIDCAuthenticator
    c.PortalOIDCAuthenticator.oidc = oidc
    c.GenericOAuthenticator.client_id = oidc.client_id
    c.GenericOAuthenticator.client_secret = oidc.client_secret()  # its file: the hub account's alone
    c.GenericOAuthenticator.oauth_callback_url = f"{settings.hub.bind_url.rstrip('/')}/hub/oauth_callback"
    c.GenericOAuthenticator.scope = list(oidc.scopes)
    c.GenericOAuthenticator.username_claim = oidc.username_claim
    c.GenericOAuthenticator.userdata_from_id_token = True  # the claims token_to_user gives: verified above
    c.GenericOAuthenticator.login_service = oidc.login_service
    c.GenericOAuthenticator.enable_pkce = True
    c.GenericOAuthenticator.validate_server_cert = True
    c.GenericOAuthenticator.http_request_kwargs = {
        "connect_timeout": oidc.timeout, "request_timeout": oidc.timeout, "validate_cert": True,
        **({"ca_certs": str(oidc.ca_file)} if oidc.ca_file else {})}
    c.GenericOAuthenticator.allow_all = True  # update_auth_model refuses: Unix account, allowed groups
