"""Sign-in through the site's OpenID Connect provider (portal.yaml's ``oidc``): JupyterHub's OAuthenticator
(GenericOAuthenticator, the authorization code flow with PKCE), with what a portal that starts Slurm jobs as the
signed-in person needs on top, each through OAuthenticator's public hooks (its handlers and methods meant to be
overridden):

- **The ID token is verified** (``get_token_info``): its signature against the provider's published keys, its
  issuer, audience, times, and a nonce bound to this browser's sign-in (``SignInHandler``). OAuthenticator reads
  the token's claims unverified (OIDC Core 3.1.3.7 lets a client rely on TLS for a token it fetched itself);
  here a token altered on its way, expired, or minted for another sign-in is refused all the same.
- **Her Unix account is the username claim, exactly** (``update_auth_model``): no lower-casing (JupyterHub's would
  make 'Kate' or the Kelvin sign's 'Kate' into kate's account); a name that is not a Unix name, no account of
  that name here, or a system account is refused in words. Sessions are Slurm jobs that run as that account.
- **Groups decide** who may log in and who is an admin, exactly as the token's groups claim names them; the
  hub's groups (for sharing) stay her Unix groups, as with LDAP.
- **The provider down or slow** is a 503 in words within ``oidc.timeout``, never a 500 quoting its answer.
- **The state cookie is host-locked** (``__Host-``) where the hub's own cookies are, so a page on a user's own
  origin cannot plant another person's sign-in in a visitor's browser; signing out also ends her session at the
  provider (its end_session_endpoint), so the next person at a shared computer must sign in again.

The provider's discovery document is fetched at the first sign-in and kept for an hour (the last good one is
used while the provider does not answer); its keys are fetched again when a token names one not yet seen (a key
rotation), at most once a minute; one fetch at a time, shared by a whole class signing in.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import time
from functools import partial

import jwt
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import STATE_COOKIE_NAME, OAuthCallbackHandler, OAuthLoginHandler, OAuthLogoutHandler
from tornado import web
from tornado.httpclient import HTTPClientError
from tornado.httputil import url_concat
from traitlets import Instance, List, Unicode

from portal.core.settings import OidcSettings
from portal.core.userjson import unix_groups
from portal.hub import metrics
from portal.hub.auth import account_refusal, people_uids_trait

UNIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # as LDAP logins: names that own Slurm jobs (ASCII only)
# Asymmetric signatures only: "none" and the HMAC family (whose key would be the client secret) never verify.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DISCOVERY_AGE = 3600  # seconds the provider's discovery document is kept
DISCOVERY_RETRY = 60  # seconds until the provider is asked again while the last good document stands in
KEYS_REFETCH = 60  # seconds between fetches of its keys for a token naming an unknown key

NOT_ANSWERING = "The sign-in service is not answering right now. Please try again in a minute."
STALE = ("This sign-in did not start in this browser, or was already used. Please go back to the portal's "
         "address and sign in again.")
CLIENT_REFUSED = ("The sign-in service refused the portal itself (its client settings), so nobody can sign in "
                  "right now. Please tell your admin.")
# The provider's errors (OAuth 2.0, OIDC Core 3.1.2.6) that are the person's own doing: anything else is the portal's
# settings at the provider (a scope its client lacks, ...) or the provider's own trouble.
HER_OWN = ("access_denied", "login_required", "consent_required", "interaction_required", "account_selection_required")


def stale() -> web.HTTPError:
    """A callback this browser did not start, or one used already: 400, in words."""
    return web.HTTPError(400, STALE, reason="Sign-in link not valid")


class ProviderUnavailable(web.HTTPError):
    """The OpenID provider did not answer in time, or answered nonsense: 503, in words."""

    def __init__(self, words: str = NOT_ANSWERING):
        super().__init__(503, words, reason="Sign-in service unavailable")


class TokenRefused(web.HTTPError):
    """An ID token that does not verify: 403. What was wrong goes to the hub's log, not to the browser."""

    def __init__(self):
        super().__init__(403, "The sign-in service's answer could not be verified, so nobody was signed in. "
                              "Please sign in again; if this repeats, tell your admin.", reason="Sign-in not verified")


def state_id(state: str) -> str:
    """The state_id inside OAuthenticator's state (base64 of JSON); '' if it has none."""
    try:
        return str(json.loads(base64.urlsafe_b64decode(state.encode("ascii")))["state_id"])
    except (ValueError, KeyError, TypeError, UnicodeError):
        return ""


def nonce_for(secret: bytes, state: str) -> str:
    """The nonce a sign-in asks for, bound to its state (which its signed cookie holds): HMAC, so nothing is
    stored, and it survives a hub restart between the redirect and the callback."""
    return hmac.new(secret, f"oidc-nonce:{state_id(state)}".encode(), hashlib.sha256).hexdigest()


def _cookie_secret(handler) -> bytes:
    secret = handler.settings["cookie_secret"]
    return secret if isinstance(secret, bytes) else str(secret).encode()


def state_cookie_name(handler) -> str:
    """OAuthenticator's state cookie, __Host- locked where the hub's login cookies are (origins.py: users' own
    origins over https), so no user's page can set one for the hub's host."""
    return f"__Host-{STATE_COOKIE_NAME}" if handler.settings.get("cookie_host_prefix_enabled") else STATE_COOKIE_NAME


def counted(status: int) -> None:
    """A sign-in's outcome in the hub's metrics (dsportal_logins_total), once, where its page is answered."""
    metrics.LOGINS.labels("ok" if status < 400 else "provider_unavailable" if status == 503 else "refused").inc()


class SignInHandler(OAuthLoginHandler):
    """OAuthenticator's redirect to the provider, once its endpoints are known, with a nonce."""

    async def get(self):
        try:
            await self.authenticator.discover()
        except ProviderUnavailable:
            counted(503)
            raise
        return super().get()

    def set_state_cookie(self, state_cookie_value):
        self._set_cookie(state_cookie_name(self), state_cookie_value, expires_days=1, httponly=True)

    def authorize_redirect(self, *args, extra_params=None, **kwargs):
        extra_params = dict(extra_params or {})
        extra_params["nonce"] = nonce_for(_cookie_secret(self), extra_params["state"])
        return super().authorize_redirect(*args, extra_params=extra_params, **kwargs)


class SignInCallbackHandler(OAuthCallbackHandler):
    """OAuthenticator's callback: the state checked first, its refusals in words a person understands."""

    async def get(self):
        try:
            await super().get()
        except web.HTTPError as error:
            counted(error.status_code)
            raise
        counted(200)

    def get_state_cookie(self):
        if self._state_cookie is None:
            name = state_cookie_name(self)
            self._state_cookie = (self.get_secure_cookie(name) or b"").decode("utf8", "replace")
            self.clear_cookie(name)
        return self._state_cookie

    def check_arguments(self):
        self.check_state()  # before anything of the URL is believed, its error text included
        self.check_error()
        self.check_code()

    def check_state(self):
        try:
            super().check_state()
        except web.HTTPError as error:
            self.log.warning("OpenID sign-in refused: %s (a stale, replayed or forged callback)", error.log_message)
            raise stale() from None

    def check_error(self):
        error = self.get_argument("error", "")
        if not error:
            return
        self.log.warning("OpenID sign-in: the provider answered %r (%r)", error[:60],
                         self.get_argument("error_description", "")[:200])
        if error in HER_OWN:  # her sign-in, cancelled or refused at the provider
            raise web.HTTPError(403, "The sign-in service did not sign you in. Please go back to the portal's "
                                "address and try again.", reason="Not signed in")
        # invalid_scope (a scope the client lacks), unauthorized_client, invalid_request, server_error, ...
        raise ProviderUnavailable(CLIENT_REFUSED)


class SignOutHandler(OAuthLogoutHandler):
    """JupyterHub's sign-out, then the provider's (its end_session_endpoint, where it has one), back to the login."""

    async def handle_logout(self):
        self.clear_cookie(state_cookie_name(self))
        await super().handle_logout()

    async def render_logout_page(self):
        try:
            endpoint = (await self.authenticator.discover()).get("end_session_endpoint")
        except ProviderUnavailable:  # signed out of the portal all the same
            endpoint = None
        if not endpoint:
            return await super().render_logout_page()
        back = f"{self.authenticator.oidc_public_url}/hub/login"
        self.redirect(url_concat(endpoint, {"client_id": self.authenticator.client_id,
                                            "post_logout_redirect_uri": back}))


class PortalOIDCAuthenticator(GenericOAuthenticator):
    """GenericOAuthenticator from portal.yaml's ``oidc``: verified ID tokens, Unix accounts, groups from claims."""

    login_handler = SignInHandler
    callback_handler = SignInCallbackHandler
    logout_handler = SignOutHandler

    oidc = Instance(OidcSettings, allow_none=True, help="portal.yaml's oidc section (the model itself).").tag(
        config=True)
    oidc_public_url = Unicode("", help="portal.yaml's hub.bind_url: where the sign-out sends people back.").tag(
        config=True)
    sharing_groups = List(Unicode(), help="portal.yaml's sharing.groups: the hub's groups, set from each "
                          "user's Unix groups at her login (Authenticator.manage_groups).").tag(config=True)
    people_uids = people_uids_trait()

    _discovered: dict | None = None
    _discovered_at = 0.0
    _keys: dict | None = None
    _keys_at = 0.0

    def normalize_username(self, username):
        """The claim as it is: sessions run as exactly this account (update_auth_model refuses any other)."""
        return username

    async def _fetch(self, url: str, what: str) -> dict:
        try:
            answer = await self.httpfetch(url, what)
        except (HTTPClientError, OSError, ValueError) as error:  # no answer, an error status, not JSON
            self.log.error("OpenID provider: %s %s failed: %s", what, url, error)
            raise ProviderUnavailable() from None
        if not isinstance(answer, dict):
            self.log.error("OpenID provider: %s %s gave no JSON object", what, url)
            raise ProviderUnavailable()
        return answer

    async def _single_flight(self, name: str, fetch):
        """``fetch()``, one at a time for ``name``: whoever asks meanwhile (a class signing in at once) shares that
        fetch's result, and nobody waits behind another's timeout."""
        flights = self.__dict__.setdefault("_flights", {})
        task = flights.get(name)
        if task is None or task.done():
            task = flights[name] = asyncio.ensure_future(fetch())
        return await asyncio.shield(task)

    async def discover(self) -> dict:
        """The provider's discovery document (kept an hour; the last good one while the provider does not answer):
        its endpoints become OAuthenticator's."""
        if self._discovered and time.monotonic() - self._discovered_at < DISCOVERY_AGE:
            return self._discovered
        document = await self._single_flight("discovery", self._fetch_discovery)
        if document is None:
            raise ProviderUnavailable()
        return document

    async def _fetch_discovery(self) -> dict | None:
        """The discovery document fetched and checked; where the provider fails, the last good one (asked again in
        DISCOVERY_RETRY seconds), else None."""
        issuer = self.oidc.issuer
        try:
            document = await self._fetch(f"{issuer.rstrip('/')}/.well-known/openid-configuration", "discovery")
            if document.get("issuer") != issuer:
                self.log.error("OpenID provider: its discovery names issuer %r, portal.yaml's oidc.issuer is %r",
                               document.get("issuer"), issuer)
                raise ProviderUnavailable()
            for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not self.oidc.endpoint_allowed(str(document.get(key, ""))):
                    self.log.error("OpenID provider: its discovery's %s %r is not https", key, document.get(key))
                    raise ProviderUnavailable()
        except ProviderUnavailable:
            if self._discovered:  # the last good one, until the provider answers again
                self._discovered_at = time.monotonic() - DISCOVERY_AGE + DISCOVERY_RETRY
            return self._discovered
        self.authorize_url, self.token_url = document["authorization_endpoint"], document["token_endpoint"]
        self._discovered, self._discovered_at = document, time.monotonic()
        return document

    async def _fetch_keys(self) -> dict | None:
        """The provider's published signing keys by kid, kept; None where it does not answer."""
        try:
            keys = await self._fetch((await self.discover())["jwks_uri"], "keys")
        except ProviderUnavailable:
            return None
        self._keys = {key.get("kid"): key for key in keys.get("keys", [])
                      if isinstance(key, dict) and key.get("use", "sig") == "sig"}
        self._keys_at = time.monotonic()
        return self._keys

    async def signing_key(self, kid: str | None, algorithm: str) -> jwt.PyJWK | None:
        """The provider's published signing key ``kid`` (its only one where the token names none), for ``algorithm``."""
        for fresh in (False, True):
            if fresh or self._keys is None:
                if self._keys is not None and time.monotonic() - self._keys_at < KEYS_REFETCH:
                    return None
                if await self._single_flight("keys", self._fetch_keys) is None:
                    raise ProviderUnavailable()
            if kid in self._keys or (kid is None and len(self._keys) == 1):
                data = self._keys[kid] if kid in self._keys else next(iter(self._keys.values()))
                if data.get("alg", algorithm) != algorithm:
                    raise jwt.InvalidTokenError(f"signed with {algorithm}, its key {kid!r} is for {data.get('alg')}")
                return jwt.PyJWK(data, algorithm=algorithm)  # a key of another type for this algorithm: refused
        return None

    async def verify_id_token(self, token: str, nonce: str | None) -> dict:
        """The ID token's claims, once its signature, issuer, audience, times and nonce all check out.
        ``nonce`` None: a token from a refresh, which carries none."""
        try:
            header = jwt.get_unverified_header(token)
            algorithm = header.get("alg")
            if algorithm not in ALGORITHMS:
                raise jwt.InvalidTokenError(f"signed with {algorithm!r}, not a public-key algorithm")
            key = await self.signing_key(header.get("kid"), algorithm)
            if key is None:
                raise jwt.InvalidTokenError(f"signed with a key the provider does not publish (kid {header.get('kid')!r})")
            claims = jwt.decode(token, key, algorithms=[algorithm], audience=self.client_id, issuer=self.oidc.issuer,
                                leeway=self.oidc.clock_skew, options={"require": ["iss", "aud", "exp", "iat", "sub"]})
            audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
            if (len(audiences) > 1 or "azp" in claims) and claims.get("azp") != self.client_id:
                raise jwt.InvalidTokenError(f"issued to {claims.get('azp')!r}, not to this portal")
            if nonce is not None and not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
                raise jwt.InvalidTokenError("its nonce is not this sign-in's (missing, or another sign-in's: replayed)")
        except (jwt.PyJWTError, ValueError) as error:  # ValueError: a key PyJWK cannot read
            self.log.warning("OpenID sign-in refused: the ID token does not verify: %s", error)
            raise TokenRefused() from None
        return claims

    async def get_token_info(self, handler, params):
        """OAuthenticator's token request, its failures in words, then the ID token verified; its claims are what
        token_to_user gives."""
        await self.discover()
        try:
            token_info = await super().get_token_info(handler, params)
        except HTTPClientError as error:
            if error.code == 400:  # invalid_grant: the code was used already (a replayed callback) or has expired
                self.log.warning("OpenID sign-in refused: the provider refused the code (%s)", error)
                raise stale() from None
            if error.code == 401:  # invalid_client: the client id or its secret
                self.log.error("OpenID provider refused the portal's client %s (oidc.client_id and its secret file?)",
                               self.client_id)
                raise ProviderUnavailable(CLIENT_REFUSED) from None
            self.log.error("OpenID provider: the token request failed: %s", error)
            raise ProviderUnavailable() from None
        except (OSError, ValueError) as error:  # no answer; an answer that is not JSON
            self.log.error("OpenID provider: the token request failed: %s", error)
            raise ProviderUnavailable() from None
        except web.HTTPError as error:  # OAuthenticator's 500 "Bad response" would quote the answer, tokens and all
            if error.status_code != 500:
                raise
            self.log.error("OpenID provider: its token answer has no access token")
            raise ProviderUnavailable() from None
        if not isinstance(token_info.get("id_token"), str):
            self.log.error("OpenID provider: its token answer has no ID token (is 'openid' in oidc.scopes?)")
            raise TokenRefused()
        nonce = None
        if params.get("grant_type") == "authorization_code":
            nonce = nonce_for(_cookie_secret(handler), handler.get_state_cookie())
        token_info["dsportal_id_claims"] = await self.verify_id_token(token_info["id_token"], nonce)
        return token_info

    async def token_to_user(self, token_info):
        """Who she is: the verified ID token's claims, taken once (never the unverified decode, never kept)."""
        try:
            return token_info.pop("dsportal_id_claims")
        except KeyError:
            raise TokenRefused() from None

    async def refresh_user(self, user, handler=None, **kwargs):
        """Nothing to refresh: the portal keeps no OAuth tokens (auth_state off); her sign-in lasts as its cookie."""
        return True

    def user_info_to_username(self, user_info):
        name = user_info.get(self.oidc.username_claim)
        if not isinstance(name, str) or not name:
            claim = self.oidc.username_claim
            self._refuse("", f"no {claim} claim (it has {sorted(user_info)[:20]})",
                         f"The sign-in service did not say who you are on this cluster (its {claim}).")
        return name

    def _groups_claim(self, claims: dict) -> set[str]:
        groups = claims.get(self.oidc.groups_claim, [])
        groups = [groups] if isinstance(groups, str) else groups
        return {group for group in groups if isinstance(group, str)} if isinstance(groups, list) else set()

    async def update_auth_model(self, auth_model):
        """Refused in words unless her name is exactly a Unix account name of a person here and she is in an
        allowed group; admin from admin_groups (and taken away when she leaves them)."""
        name, claims = auth_model["name"], auth_model["auth_state"][self.user_auth_state_key]
        who = f"You signed in as {name!r}"
        if not UNIX_NAME.fullmatch(name):
            self._refuse(name, "not a Unix account name", f"{who}, which is not an account name on this cluster.")
        groups = self._groups_claim(claims)
        if not groups & set(self.oidc.allowed_groups):
            self._refuse(name, f"in none of the allowed groups (the token's {self.oidc.groups_claim}: "
                         f"{sorted(groups)[:20]})", f"{who}, but you are not in a group that may use this portal.")
        refusal = await asyncio.get_running_loop().run_in_executor(None, partial(account_refusal, name,
                                                                                 self.people_uids, must_exist=True))
        if refusal:
            words = ("this cluster has no account of that name for your sessions to run as" if "no Unix account"
                     in refusal else "that is a system account, which no session may run as")
            self._refuse(name, refusal, f"{who}, but {words}.")
        if self.oidc.admin_groups and not auth_model["admin"]:
            auth_model["admin"] = bool(groups & set(self.oidc.admin_groups))
        return auth_model

    def _refuse(self, name: str, why: str, words: str):
        self.log.warning("OpenID sign-in of %r refused: %s", name, why)
        raise web.HTTPError(403, f"{words} Please ask your admin.", reason="Not allowed")

    async def get_user_groups(self, auth_state: dict):
        """The hub's groups, for sharing: the sharing groups of her Unix account (as with LDAP), not the token's."""
        name = self.user_info_to_username(auth_state[self.user_auth_state_key])
        mine = await asyncio.get_running_loop().run_in_executor(None, unix_groups, name)
        return mine & set(self.sharing_groups)


def configure_oidc(c, settings) -> None:
    """The hub's authenticator from portal.yaml's oidc."""
    oidc = settings.oidc
    # Where the hub's own pages are (users' servers on origins of their own: hub.subdomain_host's host), so the
    # provider sends her back to the host whose state cookie her sign-in set.
    public = (settings.hub.subdomain_host or settings.hub.bind_url).rstrip("/")
    c.JupyterHub.authenticator_class = PortalOIDCAuthenticator
    c.PortalOIDCAuthenticator.oidc = oidc
    c.PortalOIDCAuthenticator.oidc_public_url = public
    c.PortalOIDCAuthenticator.people_uids = list(settings.slurm.people_uids)
    c.GenericOAuthenticator.client_id = oidc.client_id
    c.GenericOAuthenticator.client_secret = oidc.client_secret()  # its file: the hub account's alone
    c.GenericOAuthenticator.oauth_callback_url = f"{public}/hub/oauth_callback"
    c.GenericOAuthenticator.scope = list(oidc.scopes)
    c.GenericOAuthenticator.username_claim = oidc.username_claim
    c.GenericOAuthenticator.userdata_from_id_token = True  # the claims token_to_user gives: verified above
    c.GenericOAuthenticator.login_service = oidc.login_service
    c.GenericOAuthenticator.enable_pkce = True
    c.GenericOAuthenticator.validate_server_cert = True
    c.GenericOAuthenticator.enable_auth_state = False  # no OAuth tokens kept (token_to_user, refresh_user)
    c.GenericOAuthenticator.http_request_kwargs = {
        "connect_timeout": oidc.timeout, "request_timeout": oidc.timeout, "validate_cert": True,
        **({"ca_certs": str(oidc.ca_file)} if oidc.ca_file else {})}
    c.GenericOAuthenticator.allow_all = True  # update_auth_model refuses: allowed groups, Unix account
