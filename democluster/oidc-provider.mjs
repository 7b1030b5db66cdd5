// An OpenID Connect provider for dsportal's demo and tests: oidc-provider (panva, config/oidc/package.json)
// with fixed clients and users from a JSON file, and a sign-in page of its own that checks passwords
// (oidc-provider's devInteractions would accept any). Consent is granted without asking: every client is
// one the configuration names.
//
//   node democluster/oidc-provider.mjs CONFIG.json
//
// CONFIG.json: {"issuer", "listen": {"host", "port"}, "tls": {"cert", "key"} or null (plain http, loopback
// only), "clients": [{"client_id", "client_secret", "redirect_uris"}], "users": [{"sub", "username",
// "password", "email", "groups"}], and optionally "jwks" (private signing keys; an RS256 key is made when
// absent), "ttl" (seconds by kind, e.g. {"IdToken": 3600}: see below), "cookie_keys" (random when absent)}.
// Sessions, grants and codes live in memory (oidc-provider's own adapter): a restart forgets them.
// oidc-provider is imported from $DSPORTAL_OIDC_MODULES (default /opt/dsportal/oidc/node_modules, where
// scripts/install-deps.sh installs it). Logs one line per event on stdout and "ready ISSUER" once listening.
import { createHash, generateKeyPairSync, randomBytes, randomUUID, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import path from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.DSPORTAL_OIDC_MODULES || "/opt/dsportal/oidc/node_modules";
// lib/index.js: the package's "main" (it has no "exports").
const { default: Provider, errors } = await import(pathToFileURL(path.join(modules, "oidc-provider", "lib", "index.js")).href);

const log = (message) => console.log(`[oidc] ${message}`);
if (process.argv.length !== 3) {
  console.error("usage: node oidc-provider.mjs CONFIG.json");
  process.exit(2);
}
const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
if (!config.tls && !["127.0.0.1", "::1"].includes(config.listen.host)) {
  console.error("oidc-provider.mjs: plain http only on the loopback (listen.host 127.0.0.1 or ::1); give tls");
  process.exit(2);
}
const usersBySub = new Map(config.users.map((user) => [user.sub, user]));
const usersByName = new Map(config.users.map((user) => [user.username, user]));

// The pages: plain HTML, everything echoed escaped.
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const page = (body) => `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>dsportal demo sign-in</title></head>
<body><h1>dsportal demo sign-in</h1>
${body}
</body></html>
`;
const loginForm = (uid, username = "", message = "") => page(`${message && `<p>${escapeHtml(message)}</p>\n`}\
<form method="post" action="/interaction/${escapeHtml(uid)}/login">
<label>User name <input name="username" value="${escapeHtml(username)}" autocomplete="username" autofocus required></label>
<label>Password <input name="password" type="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button>
</form>`);

function send(res, status, html) {
  res.writeHead(status, { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" });
  res.end(html);
}

// The ID tokens' signing keys: config.jwks, else a fresh RS256 key (its tokens then die with the process).
function signingKeys() {
  if (config.jwks) return config.jwks;
  const key = generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey.export({ format: "jwk" });
  return { keys: [{ ...key, kid: randomUUID(), alg: "RS256", use: "sig" }] };
}

const provider = new Provider(config.issuer, {
  clients: config.clients,
  // The hub authenticates with client_secret_post; oidc-provider accepts client_secret_basic from the
  // same client too (both present the secret itself).
  clientDefaults: { token_endpoint_auth_method: "client_secret_post" },
  // PKCE (S256, the only method oidc-provider 9 knows) on every authorization request, not only public
  // clients': a hub that stopped sending it fails here rather than in production.
  pkce: { required: () => true },
  // Scope -> claims. "groups" is a scope of its own; every claim also goes into the ID token
  // (conformIdTokenClaims: false), for clients that read the user from it rather than from userinfo.
  claims: {
    openid: ["sub"],
    profile: ["preferred_username"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  conformIdTokenClaims: false,
  async findAccount(ctx, sub) {
    const user = usersBySub.get(sub);
    return user && {
      accountId: sub,
      async claims() {
        return {
          sub, preferred_username: user.username, email: user.email, email_verified: true, groups: user.groups,
        };
      },
    };
  },
  features: { devInteractions: { enabled: false } }, // the sign-in page is ours (below)
  jwks: signingKeys(),
  // oidc-provider marks its cookies Secure by itself when the request came over TLS (no `proxy`: nothing
  // stands in front); over plain http they go without, which browsers accept from http://127.0.0.1.
  cookies: { keys: config.cookie_keys || [randomBytes(32).toString("base64url")] },
  // Lifetimes in seconds: tokens an hour, a sign-in 10 minutes to complete, the session with the provider
  // (the user signed in here) and the grant to a client 8 hours; config.ttl overrides any of them.
  ttl: {
    AccessToken: 3600, IdToken: 3600, Interaction: 600, Session: 8 * 3600, Grant: 8 * 3600, ...config.ttl,
  },
  async renderError(ctx, { error, error_description: description }) {
    ctx.type = "html";
    ctx.body = page(`<p>${escapeHtml(error)}: ${escapeHtml(description || "")}</p>`);
  },
});

provider.on("grant.success", (ctx) => {
  log(`token issued to client ${ctx.oidc.client.clientId} for ${usersBySub.get(ctx.oidc.account?.accountId)?.username}`);
});
// Refusals, with oidc-provider's error_detail: the actual reason (a wrong code_verifier, say), which the
// error_description sent to the client leaves out.
for (const event of ["authorization.error", "grant.error", "server_error"]) {
  provider.on(event, (ctx, error) => {
    log(`${event}: ${[error.message, error.error_description, error.error_detail].filter(Boolean).join(": ")}`);
  });
}

// The form's fields, from an application/x-www-form-urlencoded body of at most 16 KiB.
async function formBody(req) {
  let body = "";
  for await (const chunk of req.setEncoding("utf8")) {
    body += chunk;
    if (body.length > 16384) throw Object.assign(new Error("form too large"), { status: 413 });
  }
  return new URLSearchParams(body);
}

// A password check in constant time, whether or not the user exists.
function checkPassword(username, password) {
  const user = usersByName.get(username);
  const digest = (text) => createHash("sha256").update(text).digest();
  const equal = timingSafeEqual(digest(password), digest(user ? user.password : randomUUID()));
  return equal ? user : undefined;
}

// GET /interaction/UID: the sign-in form (prompt "login"), or consent granted at once (prompt "consent":
// a Grant of what the client asked for). POST /interaction/UID/login: the form's answer.
async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params, session } = details;
  if (req.method === "GET" && !action && prompt.name === "login") {
    return send(res, 200, loginForm(uid));
  }
  if (req.method === "GET" && !action && prompt.name === "consent") {
    const grant = details.grantId ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(" "));
    if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(prompt.details.missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(" "));
    }
    const grantId = await grant.save();
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  if (req.method === "POST" && action === "login" && prompt.name === "login") {
    const form = await formBody(req);
    const username = form.get("username") || "";
    const user = checkPassword(username, form.get("password") || "");
    if (!user) {
      log(`login refused for ${JSON.stringify(username)} (client ${params.client_id})`);
      return send(res, 200, loginForm(uid, username, "Wrong user name or password."));
    }
    log(`login ok for ${user.username} (client ${params.client_id})`);
    return provider.interactionFinished(req, res, { login: { accountId: user.sub } }, { mergeWithLastSubmission: false });
  }
  return send(res, 400, page("<p>This sign-in step does not fit the request; please start again.</p>"));
}

const oidc = provider.callback();
async function handle(req, res) {
  const match = /^\/interaction\/([\w-]+)(?:\/(login))?$/.exec(req.url.split("?")[0]);
  if (!match) return oidc(req, res);
  try {
    await interaction(req, res, match[1], match[2]);
  } catch (error) {
    // SessionNotFound: the interaction expired or its cookie did not come (cookies blocked, another host name).
    const expired = error instanceof errors.SessionNotFound;
    log(`interaction failed: ${[error.message, error.error_description].filter(Boolean).join(": ")}`);
    if (!res.headersSent) {
      send(res, error.status || 500,
        page(`<p>${expired ? "This sign-in has expired; please start again from the portal." : "Sign-in failed."}</p>`));
    }
  }
}

const server = config.tls
  ? https.createServer({ cert: readFileSync(config.tls.cert), key: readFileSync(config.tls.key) }, handle)
  : http.createServer(handle);
server.listen(config.listen.port, config.listen.host, () => {
  log(`started: issuer ${config.issuer}, listening on ${config.listen.host}:${server.address().port} (${config.tls ? "https" : "plain http"})`);
  console.log(`ready ${config.issuer}`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    log(`stopping (${signal})`);
    server.close(() => process.exit(0));
    server.closeAllConnections();
  });
}
