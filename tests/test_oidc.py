"""Sign-in through an OpenID Connect provider (portal.yaml's oidc; docs/how-to/sign-in-with-openid-connect.md).

The provider is a real one: panva's `oidc-provider` from the npm registry (config/oidc, installed by make deps),
run by democluster/oidc-provider.mjs over TLS with a CA of this test's, with its own sign-in pages. A second
dsportal hub on the demo's cluster (conftest's second_hub) signs people in through it with OAuthenticator:
- in a real browser through the provider's pages, a wrong password first (the provider says so);
- refused in words: outside the allowed groups, no Unix account here, a name that is not a Unix name, a
  forged or stale state, a replayed callback, the provider down or hung (503 within oidc.timeout);
- admin from admin_groups;
- the ID token verified: tokens the real provider issued, then altered, expired, signed with another key,
  of another login (nonce), for another client, or unsigned, are refused.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlencode, urljoin, urlparse

import jwt
import pytest
import requests
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from playwright.sync_api import sync_playwright
from tornado import web

from conftest import PASSWORDS, REPO
from hubclient import free_port
from portal.admin import check
from portal.core.settings import OidcSettings
from portal.hub import oidc

MODULES = Path(os.environ.get("DSPORTAL_OIDC_MODULES", "/opt/dsportal/oidc/node_modules"))
pytestmark = pytest.mark.skipif(not shutil.which("node") or not (MODULES / "oidc-provider").is_dir(),
                                reason="needs node and oidc-provider (make deps)")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
SECOND_HUB = "http://127.0.0.1:8010"  # conftest's second_hub
# Where its pages are: localhost:8010 where the demo's portal.yaml gives users origins of their own (subdomain_host).
SECOND_HUB_PAGES = ("http://localhost:8010", SECOND_HUB)
HUB_PAGE = re.compile(r"http://(localhost|127\.0\.0\.1):8010/hub/")
CLIENT = "dsportal-test"
# People the provider knows: alice and dave have Unix accounts here (the demo's), ghost has none, mallory is in
# no allowed group, Eve.Smith's name is no Unix name.
USERS = [
    {"sub": "u-alice", "username": "alice", "password": "alice-sso-1", "email": "alice@dsportal.test",
     "groups": ["datascience"]},
    {"sub": "u-dave", "username": "dave", "password": "dave-sso-1", "email": "dave@dsportal.test",
     "groups": ["datascience", "portaladmins"]},
    {"sub": "u-mallory", "username": "mallory", "password": "mallory-sso-1", "email": "m@dsportal.test",
     "groups": ["outsiders"]},
    {"sub": "u-ghost", "username": "ghost", "password": "ghost-sso-1", "email": "g@dsportal.test",
     "groups": ["datascience"]},
    {"sub": "u-eve", "username": "Eve.Smith", "password": "eve-sso-1", "email": "e@dsportal.test",
     "groups": ["datascience"]},
    # Names JupyterHub would have lower-cased into the demo's bob and carol; root, a system account.
    {"sub": "u-bob2", "username": "BOB", "password": "bob-sso-1", "email": "b@dsportal.test", "groups": ["datascience"]},
    {"sub": "u-kelvin", "username": "\u212aarol", "password": "kelvin-sso-1", "email": "k@dsportal.test",
     "groups": ["datascience"]},
    {"sub": "u-root", "username": "root", "password": "root-sso-1", "email": "r@dsportal.test",
     "groups": ["datascience", "portaladmins"]},
]
PASSWORD = {user["username"]: user["password"] for user in USERS}


def make_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A CA of this test's and the provider's certificate for 127.0.0.1 (key usages as Python 3.13 wants them)."""
    def run(*argv):
        subprocess.run(argv, check=True, capture_output=True, cwd=folder)
    (folder / "ca.ext").write_text("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
                                   "subjectKeyIdentifier=hash\n")
    (folder / "server.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                                       "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"
                                       "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dsportal test OIDC CA",
        "-keyout", "ca.key", "-out", "ca.pem", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "key.pem", "-out", "csr")
    run("openssl", "x509", "-req", "-in", "csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "server.ext", "-out", "cert.pem")
    return folder / "ca.pem", folder / "cert.pem", folder / "key.pem"


def private_jwk(kid: str) -> tuple[dict, object]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}, key


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    folder = tmp_path_factory.mktemp("oidc")
    ca, cert, key = make_ca(folder)
    port = free_port()
    issuer = f"https://127.0.0.1:{port}"
    jwk, signing_key = private_jwk("test-1")
    secret = secrets.token_urlsafe(24)
    config = {"issuer": issuer, "listen": {"host": "127.0.0.1", "port": port},
              "tls": {"cert": str(cert), "key": str(key)},
              "clients": [{"client_id": CLIENT, "client_secret": secret,
                           "redirect_uris": [f"{hub}/hub/oauth_callback" for hub in SECOND_HUB_PAGES],
                           "post_logout_redirect_uris": [f"{hub}/hub/login" for hub in SECOND_HUB_PAGES]}],
              "users": USERS, "jwks": {"keys": [jwk]}}
    (folder / "provider.json").write_text(json.dumps(config))
    secret_file = folder / "client-secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    log = open(folder / "provider.log", "w")
    process = subprocess.Popen(["node", str(REPO / "democluster/oidc-provider.mjs"), str(folder / "provider.json")],
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DSPORTAL_OIDC_MODULES": str(MODULES)})
    deadline = time.monotonic() + 30
    while not any(line.startswith("ready ") for line in (folder / "provider.log").read_text().splitlines()):
        assert process.poll() is None and time.monotonic() < deadline, (folder / "provider.log").read_text()
        time.sleep(0.2)
    yield SimpleNamespace(issuer=issuer, ca=ca, secret=secret, secret_file=secret_file, process=process,
                          signing_key=signing_key, kid=jwk["kid"], log=folder / "provider.log")
    process.terminate()
    process.wait(timeout=10)


def oidc_section(provider, **extra) -> dict:
    return {"issuer": provider.issuer, "client_id": CLIENT, "client_secret_file": str(provider.secret_file),
            "ca_file": str(provider.ca), "allowed_groups": ["datascience"], "admin_groups": ["portaladmins"],
            "login_service": "dsportal test SSO", "timeout": 3, **extra}


@pytest.fixture
def sso_hub(second_hub, provider):
    def edit(config):
        config.pop("ldap")
        config["oidc"] = oidc_section(provider)
    return second_hub(edit)


def trusting(provider) -> requests.Session:
    """A session that trusts the test's CA alone (trust_env off: a REQUESTS_CA_BUNDLE would override verify)."""
    session = requests.Session()
    session.trust_env = False
    if provider.ca:
        session.verify = str(provider.ca)
    return session


def to_callback(hub: str, provider, name: str, password: str | None = None) -> tuple[requests.Session, str]:
    """A sign-in through the provider's form, stopped at the redirect back to the hub: the session, the callback URL."""
    session = trusting(provider)
    page = session.get(f"{hub}/hub/oauth_login", timeout=20)
    assert page.url.startswith(f"{provider.issuer}/interaction/"), (page.status_code, page.url, page.text[-300:])
    answer = session.post(f"{page.url}/login", data={"username": name, "password": password or PASSWORD[name]},
                          allow_redirects=False, timeout=20)
    while urlparse(urljoin(answer.url, answer.headers["Location"])).path != "/hub/oauth_callback":
        answer = session.get(urljoin(answer.url, answer.headers["Location"]), allow_redirects=False, timeout=20)
    return session, urljoin(answer.url, answer.headers["Location"])


def sign_in(hub: str, provider, name: str, password: str | None = None) -> requests.Response:
    """Through the hub's sign-in and the provider's own form, as a browser would; the answer's .session signed in."""
    session, callback = to_callback(hub, provider, name, password)
    answer = session.get(callback, timeout=20)
    answer.session = session
    return answer


def test_sign_in_through_the_providers_own_pages_in_a_browser(sso_hub, provider):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        # The browser trusts no test CA: the hub, which does the checking that matters, trusts only this one.
        page = browser.new_context(ignore_https_errors=True).new_page()
        page.goto(f"{sso_hub}/hub/login")
        page.get_by_text("Sign in with dsportal test SSO").click()
        page.wait_for_url(f"{provider.issuer}/interaction/**")
        assert "dsportal demo sign-in" in page.title()
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", "not-her-password")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_text("Wrong user name or password.").wait_for()
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", PASSWORD["alice"])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(HUB_PAGE)
        assert "/hub/oauth_callback" not in page.url
        hub = f"{urlparse(page.url).scheme}://{urlparse(page.url).netloc}"  # where the hub's pages are
        cookies = {cookie["name"] for cookie in page.context.cookies(hub)}
        assert "jupyterhub-session-id" in cookies
        me = page.request.get(f"{hub}/hub/api/user", headers={"Referer": f"{hub}/hub/home"})
        assert me.ok and me.json()["name"] == "alice" and not me.json()["admin"], me.text()
        # Signing out of the portal signs her out at the provider too: the next sign-in asks for a password again.
        page.goto(f"{hub}/hub/logout")
        page.wait_for_url(f"{provider.issuer}/session/end**")
        page.get_by_role("button", name="Yes, sign me out").click()
        page.wait_for_url(f"{hub}/hub/login**")
        assert page.request.get(f"{hub}/hub/api/user").status in (401, 403)
        page.get_by_text("Sign in with dsportal test SSO").click()
        page.wait_for_url(f"{provider.issuer}/interaction/**")
        assert page.locator("input[name=password]").is_visible()
        browser.close()


def test_refusals_in_words_and_admins_from_groups(sso_hub, provider):
    dave = sign_in(sso_hub, provider, "dave")
    assert dave.status_code == 200 and HUB_PAGE.match(dave.url), (dave.status_code, dave.url)
    assert dave.session.get(f"{sso_hub}/hub/admin", timeout=10).status_code == 200  # portaladmins: admin

    refused = {
        "mallory": "not in a group that may use this portal",
        "ghost": "this cluster has no account of that name",
        "Eve.Smith": "which is not an account name on this cluster",
        "BOB": "which is not an account name on this cluster",  # not bob's account
        "\u212aarol": "which is not an account name on this cluster",  # the Kelvin sign: not carol's
        "root": "that is a system account, which no session may run as",
    }
    for name, words in refused.items():
        answer = sign_in(sso_hub, provider, name)
        assert answer.status_code == 403 and words in html.unescape(answer.text), (name, answer.status_code, answer.text[-600:])
        assert answer.session.get(f"{sso_hub}/hub/api/user", timeout=10).status_code in (401, 403)

    # A callback whose state is not the one this browser started with (a forged link): refused in words.
    session, callback = to_callback(sso_hub, provider, "alice")
    query = parse_qs(urlparse(callback).query)
    forged_state = base64.urlsafe_b64encode(json.dumps({"state_id": "f" * 32}).encode()).decode()
    forged = session.get(callback.split("?")[0] + "?" + urlencode({"code": query["code"][0], "state": forged_state}),
                         timeout=20)
    assert forged.status_code == 400 and oidc.STALE in html.unescape(forged.text), forged.text[-400:]
    # The state cookie went with that refusal: the genuine callback, now, and replayed later, is refused too.
    for _ in range(2):
        again = session.get(callback, timeout=20)
        assert again.status_code == 400 and oidc.STALE in html.unescape(again.text), again.text[-400:]
    # A stranger replaying alice's callback link in a browser of his own (no state cookie): refused.
    assert requests.get(callback, timeout=20).status_code == 400
    # Used once as it should be, her callback signs her in; the same link again signs nobody in.
    session, callback = to_callback(sso_hub, provider, "alice")
    first = session.get(callback, timeout=20)
    assert first.status_code == 200 and HUB_PAGE.match(first.url), (first.status_code, first.url)
    replayed = requests.get(callback, timeout=20)
    assert replayed.status_code == 400 and oidc.STALE in html.unescape(replayed.text)
    # Replayed with her signed state cookie too (copied from her browser): the provider refuses the used code.
    session, callback = to_callback(sso_hub, provider, "alice")
    cookie = next(c for c in session.cookies if c.name.endswith("oauthenticator-state"))
    assert session.get(callback, timeout=20).status_code == 200
    thief = requests.Session()
    thief.cookies.set(cookie.name, cookie.value, domain=cookie.domain, path=cookie.path)
    copied = thief.get(callback, timeout=20)
    assert copied.status_code == 400 and oidc.STALE in html.unescape(copied.text), copied.text[-400:]
    assert thief.get(f"{sso_hub}/hub/api/user", timeout=10).status_code in (401, 403)

    # The provider's own refusals, after a genuine start in this browser: hers (cancelled) in words; one that is
    # the portal's settings at the provider (a scope its client lacks) told as the portal's fault.
    for error, status, words in [("access_denied", 403, "The sign-in service did not sign you in."),
                                 ("invalid_scope", 503, oidc.CLIENT_REFUSED)]:
        session, callback = to_callback(sso_hub, provider, "alice")
        state = parse_qs(urlparse(callback).query)["state"][0]
        told = session.get(callback.split("?")[0] + "?" + urlencode(
            {"error": error, "error_description": "Your account is locked, call +1 555 0100", "state": state}),
            timeout=20)
        assert told.status_code == status and words in html.unescape(told.text), (error, told.text[-400:])
        assert "call +1 555" not in told.text  # the provider's text is not the portal's to show

    # The provider hung (stopped) as the hub asks it for her tokens: 503 in words, within oidc.timeout (3 s).
    session, callback = to_callback(sso_hub, provider, "alice")
    provider.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        hung = session.get(callback, timeout=30)
        took = time.monotonic() - started
    finally:
        provider.process.send_signal(signal.SIGCONT)
    assert hung.status_code == 503 and oidc.NOT_ANSWERING in html.unescape(hung.text), (hung.status_code, hung.text[-400:])
    print(f"the provider hung: the hub answered 503 in {took:.1f} s (oidc.timeout 3 s a request)")
    assert session.get(f"{sso_hub}/hub/api/user", timeout=10).status_code in (401, 403)


def test_the_demos_provider_signs_in_the_demos_people_with_the_guides_settings(second_hub):
    guide = (REPO / "docs/how-to/sign-in-with-openid-connect.md").read_text()
    block = guide[guide.index("```yaml", guide.index("## On the demo")) + len("```yaml"):]
    section = yaml.safe_load(block[:block.index("```")])

    def edit(config):
        config.pop("ldap")
        config.update(section)
    hub = second_hub(edit)
    demo = SimpleNamespace(issuer=section["oidc"]["issuer"], ca=None)
    alice = sign_in(hub, demo, "alice", PASSWORDS["alice"])
    assert alice.status_code == 200 and HUB_PAGE.match(alice.url), (alice.status_code, alice.url)
    dave = sign_in(hub, demo, "dave", PASSWORDS["dave"])
    assert dave.session.get(f"{hub}/hub/admin", timeout=10).status_code == 200  # portaladmins
    mallory = sign_in(hub, demo, "mallory", PASSWORDS["mallory"])  # not in datascience
    assert mallory.status_code == 403 and "not in a group that may use this portal" in html.unescape(mallory.text)


def test_the_provider_down_is_a_503_in_words(second_hub, provider, tmp_path):
    def edit(config):
        config.pop("ldap")
        config["oidc"] = oidc_section(provider, issuer=f"https://127.0.0.1:{free_port()}")  # nothing listens
    hub = second_hub(edit)
    down = requests.get(f"{hub}/hub/oauth_login", timeout=30)
    assert down.status_code == 503 and oidc.NOT_ANSWERING in html.unescape(down.text), (down.status_code, down.text[-400:])


def test_a_wrong_client_secret_is_told_as_the_portals_fault(second_hub, provider, tmp_path):
    wrong = tmp_path / "wrong-secret"
    wrong.write_text("not-the-secret")
    wrong.chmod(0o600)

    def edit(config):
        config.pop("ldap")
        config["oidc"] = oidc_section(provider, client_secret_file=str(wrong))
    hub = second_hub(edit)
    answer = sign_in(hub, provider, "alice")
    assert answer.status_code == 503 and oidc.CLIENT_REFUSED in html.unescape(answer.text), answer.text[-400:]


# ---------------------------------------------------------------- the ID token's checks, on the real provider's tokens
def code_flow(provider, name: str, nonce: str | None) -> dict:
    """The token answer for ``name``'s sign-in, driven as the portal's client would (PKCE, a nonce)."""
    session = trusting(provider)
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    redirect = f"{SECOND_HUB}/hub/oauth_callback"
    page = session.get(f"{provider.issuer}/auth", params={
        "client_id": CLIENT, "response_type": "code", "scope": "openid profile email groups", "redirect_uri": redirect,
        "state": "s", **({"nonce": nonce} if nonce else {}), "code_challenge": challenge, "code_challenge_method": "S256"}, timeout=20)
    answer = session.post(f"{page.url}/login", data={"username": name, "password": PASSWORD[name]},
                          allow_redirects=False, timeout=20)
    while not answer.headers["Location"].startswith(redirect):
        answer = session.get(urljoin(answer.url, answer.headers["Location"]), allow_redirects=False, timeout=20)
    code = parse_qs(urlparse(answer.headers["Location"]).query)["code"][0]
    tokens = session.post(f"{provider.issuer}/token", data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": redirect, "code_verifier": verifier,
        "client_id": CLIENT, "client_secret": provider.secret}, timeout=20)
    assert tokens.status_code == 200, tokens.text
    return tokens.json()


def authenticator(provider) -> oidc.PortalOIDCAuthenticator:
    settings = OidcSettings(**oidc_section(provider))
    return oidc.PortalOIDCAuthenticator(
        oidc=settings, client_id=CLIENT, client_secret=provider.secret,
        http_request_kwargs={"ca_certs": str(provider.ca), "request_timeout": 5, "connect_timeout": 5})


def resign(token: str, key, kid: str | None, **changes) -> str:
    claims = {**jwt.decode(token, options={"verify_signature": False}), **changes}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid} if kid else None)


def test_dsportal_check_reaches_the_provider(provider, tmp_path):
    good = check.check_oidc(SimpleNamespace(oidc=OidcSettings(**oidc_section(provider))))
    assert good.ok and "1 signing key(s)" in good.detail, good
    other_ca = make_ca(tmp_path)[0]  # a CA that did not sign the provider's certificate
    refused = check.check_oidc(SimpleNamespace(oidc=OidcSettings(**oidc_section(provider, ca_file=str(other_ca)))))
    assert not refused.ok and "CERTIFICATE_VERIFY_FAILED" in refused.detail, refused
    renamed = check.check_oidc(SimpleNamespace(oidc=OidcSettings(**oidc_section(provider, issuer=provider.issuer + "/x"))))
    assert not renamed.ok


def test_a_class_signing_in_while_the_provider_hangs_shares_one_discovery(provider):
    """Twenty sign-ins at once share one discovery fetch: with the provider hung, all are told after that one
    request's timeout, not after each other's; with a document fetched before, all go on with it, and the next
    ones do not ask the hung provider again for a while (DISCOVERY_RETRY)."""
    auth = authenticator(provider)
    fetches = []
    fetch = auth._fetch

    async def counted_fetch(url, what):
        fetches.append(what)
        return await fetch(url, what)

    auth._fetch = counted_fetch

    async def twenty():
        return await asyncio.gather(*(auth.discover() for _ in range(20)), return_exceptions=True)

    def hung(run):
        fetches.clear()
        provider.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            answers = asyncio.run(run())
            print(f"20 sign-ins with the provider hung: {len(fetches)} fetch(es), all answered in "
                  f"{time.monotonic() - started:.1f} s")
            return answers
        finally:
            provider.process.send_signal(signal.SIGCONT)

    answers = hung(twenty)
    assert all(isinstance(answer, oidc.ProviderUnavailable) for answer in answers), answers
    assert fetches == ["discovery"], fetches
    document = asyncio.run(auth.discover())
    auth._discovered_at -= oidc.DISCOVERY_AGE  # an hour old: asked again at the next sign-in
    answers = hung(twenty)
    assert all(answer is document for answer in answers) and fetches == ["discovery"], (fetches, answers)
    answers = hung(twenty)  # within DISCOVERY_RETRY: the last good one, the provider not asked
    assert all(answer is document for answer in answers) and fetches == [], fetches


def test_id_tokens_that_do_not_verify_are_refused(provider, caplog):
    nonce = secrets.token_hex(16)
    token = code_flow(provider, "alice", nonce)["id_token"]

    async def check(candidate: str, expected_nonce: str = nonce):
        return await authenticator(provider).verify_id_token(candidate, expected_nonce)

    claims = asyncio.run(check(token))
    assert claims["preferred_username"] == "alice" and claims["groups"] == ["datascience"]
    assert claims["iss"] == provider.issuer and claims["aud"] == CLIENT
    assert asyncio.run(check(resign(token, provider.signing_key, None)))["sub"] == "u-alice"  # no kid: its one key

    header, payload, signature = token.split(".")
    altered = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    altered["preferred_username"] = "dave"
    tampered = ".".join([header, base64.urlsafe_b64encode(json.dumps(altered).encode()).decode().rstrip("="),
                         signature])
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    bad = {  # what, the token, why the hub's log says it was refused
        "tampered (her name changed, the signature kept)": (tampered, "Signature verification failed"),
        "expired an hour ago": (resign(token, provider.signing_key, provider.kid, iat=now - 7200, exp=now - 3600),
                                "expired"),
        "signed with a key the provider does not publish": (resign(token, other_key, provider.kid),
                                                            "Signature verification failed"),
        "naming a key the provider does not publish": (resign(token, other_key, "other"), "does not publish"),
        "issued to another client": (resign(token, provider.signing_key, provider.kid, aud="another-client"),
                                     "Audience"),
        "from another issuer": (resign(token, provider.signing_key, provider.kid, iss="https://evil.example.org"),
                                "issuer"),
        "unsigned (alg none)": (jwt.encode(altered, None, algorithm="none"), "not a public-key algorithm"),
        "signed with the client secret (HS256)": (jwt.encode(altered, provider.secret, algorithm="HS256"),
                                                  "not a public-key algorithm"),
        "another sign-in's (its nonce is not this one's: a replay)": (token, "nonce"),
        "without a nonce": (code_flow(provider, "alice", None)["id_token"], "nonce"),
    }
    for what, (candidate, why) in bad.items():
        caplog.clear()
        expected = secrets.token_hex(16) if what.startswith("another sign-in") else nonce
        with pytest.raises(web.HTTPError) as refused:
            asyncio.run(check(candidate, expected))
        assert refused.value.status_code == 403, what
        assert why.lower() in caplog.text.lower(), (what, caplog.text)
