// configurable-http-proxy (CHP) for dsportal: a user's route reaches that user's session only.
//
//   node proxy.js <CHP's bin/configurable-http-proxy> <CHP's own options...>
//
// With hub.internal_ssl, CHP trusts every certificate signed by the sessions' CA, and every
// session's certificate names every node. When bob's session ends, alice may bind his port on
// that node before the hub drops his route; with her own session certificate, CHP would hand her
// bob's next requests, his cookies included. Here each request to a user's route goes through an
// https.Agent of that user's whose checkServerIdentity also asks that the certificate name the
// user (DNS:<user>.users.dsportal.invalid, spawner/certs.py user_host_name). A session of anybody
// else fails the TLS handshake, before a byte of the request is written, and the browser gets 502.
// A route that is no user's (the hub, services) refuses a certificate that names a user.
//
// CHP's installed files are left as they are (this file is dsportal's, so `npm install` does not
// undo it): CHP's bin script runs unchanged, with ConfigurableProxy replaced by a subclass.
"use strict";

const crypto = require("crypto");
const https = require("https");
const path = require("path");
const tls = require("tls");

const USERS_DOMAIN = "users.dsportal.invalid";
const PLAIN_LABEL = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/;
const NOT_THE_ROUTES_USER = "ERR_DSPORTAL_NOT_THE_ROUTES_USER";

// The same as spawner/certs.py user_host_name (tests/test_certs.py checks that they agree).
function userHostName(user) {
  if (PLAIN_LABEL.test(user) && user.slice(2, 4) !== "--") {
    return `${user}.${USERS_DOMAIN}`;
  }
  const digest = crypto.createHash("sha256").update(user, "utf8").digest("hex");
  return `xx--${digest.slice(0, 56)}.${USERS_DOMAIN}`;
}

function namedUsers(cert) {
  // Node writes each alt name as "DNS:name"; one with a comma or quote in it comes quoted, so it
  // can never pose as a name of ours.
  return (cert.subjectaltname || "")
    .split(", ")
    .filter((name) => name.startsWith("DNS:") && name.endsWith(`.${USERS_DOMAIN}`))
    .map((name) => name.slice(4));
}

function refusal(message) {
  const error = new Error(message);
  error.code = NOT_THE_ROUTES_USER;
  return error;
}

// checkServerIdentity for a route of `user` (null: a route that is no user's) to `targetHost`:
// whose certificate it is first (so that another user's session always gets the 502 that says so),
// then the usual check of the host name, against the route's target: Node checks the name it sent
// in SNI, which is the browser's Host (alice.localhost with subdomain_host), not the host we dial.
function identityCheck(user, targetHost) {
  return (sniHost, cert) => {
    const host = targetHost || sniHost;
    const named = namedUsers(cert);
    if (user === null && named.length) {
      return refusal(`a session's certificate (${named.join(", ")}) on a route that is no user's`);
    }
    if (user !== null && !named.includes(userHostName(user))) {
      return refusal(`the certificate at ${host} is not ${user}'s (it names ${named.join(", ") || "no user"})`);
    }
    return tls.checkServerIdentity(host, cert);
  };
}

const TEXT_502 =
  "502 Bad Gateway: the server at this address is not the one this route belongs to (its TLS " +
  "certificate names another user, or none), so nothing was sent to it. If this is your session, " +
  "it has probably ended: start it again from the hub's home page (a session started before the " +
  "portal checked this must be started again once).\n";

function answer502(kind, res) {
  if (kind === "web") {
    if (res.writableEnded) return;
    if (!res.headersSent) res.writeHead(502, { "Content-Type": "text/plain; charset=utf-8" });
    res.end(TEXT_502);
  } else if (res.writable) {
    // a websocket upgrade: res is the browser's socket, not yet answered
    res.end(
      "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n" +
        `Content-Length: ${Buffer.byteLength(TEXT_502)}\r\nConnection: close\r\n\r\n${TEXT_502}`
    );
  }
}

function routeOwnerCheckingProxy(ConfigurableProxy) {
  const routeOf = new WeakMap(); // the request -> the data of the route it was matched to

  return class RouteOwnerCheckingProxy extends ConfigurableProxy {
    constructor(options) {
      super(options);
      this.agentsByUser = new Map(); // user and target host -> its agent
      for (const kind of ["web", "ws"]) this.sendThroughOwnersAgent(kind);
    }

    newAgent(user, targetHost) {
      // Keep-alive as CHP's own agent. A resumed TLS session skips checkServerIdentity, but only
      // the server that took part in it can resume it: another process on the port cannot.
      return new https.Agent({ keepAlive: true, checkServerIdentity: identityCheck(user, targetHost) });
    }

    agentFor(req) {
      const route = routeOf.get(req);
      const user = route && typeof route.user === "string" ? route.user : null;
      let targetHost = null;
      try {
        targetHost = route ? new URL(route.target).hostname : null;
      } catch (error) {
        targetHost = null;
      }
      const key = `${user === null ? "" : user}\0${targetHost || ""}`;
      if (!this.agentsByUser.has(key)) this.agentsByUser.set(key, this.newAgent(user, targetHost));
      return this.agentsByUser.get(key);
    }

    async targetForReq(req) {
      const match = await super.targetForReq(req);
      if (!match) return match;
      // CHP hands on only prefix and target; the route's data (JupyterHub's {user, server_name})
      // is looked up again, and must be the same route (same target) to count.
      const route = await this._routes.get(match.prefix);
      if (!route || route.target !== match.target) return undefined; // removed meanwhile: 404
      routeOf.set(req, route);
      return match;
    }

    // CHP calls this.proxy.web(req, res, options, onError) / this.proxy.ws(req, socket, head,
    // options, onError), options.agent being its one https agent for every target.
    sendThroughOwnersAgent(kind) {
      const send = this.proxy[kind];
      const proxy = this.proxy;
      this.proxy[kind] = (...args) => {
        const [req, res] = args;
        const options = args[args.length - 2];
        const onError = args[args.length - 1];
        if (options && options.agent === this.httpsAgent) {
          options.agent = this.agentFor(req);
          args[args.length - 1] = (error, ...rest) => {
            if (error && error.code === NOT_THE_ROUTES_USER) {
              this.log.error("502 %s %s refused: %s", req.method, (req.url || "").split("?")[0], error.message);
              answer502(kind, res);
            } else {
              onError(error, ...rest);
            }
          };
        }
        return send.apply(proxy, args);
      };
    }
  };
}

function main() {
  const chpBin = process.argv[2];
  if (!chpBin) {
    console.error("usage: proxy.js <path of configurable-http-proxy's bin script> [its options]");
    process.exit(2);
  }
  process.argv.splice(2, 1); // CHP's bin script reads its own options from process.argv
  const configproxy = require(path.join(path.dirname(path.dirname(chpBin)), "lib", "configproxy.js"));
  configproxy.ConfigurableProxy = routeOwnerCheckingProxy(configproxy.ConfigurableProxy);
  require(chpBin); // the same lib/configproxy.js module, now with the subclass
}

module.exports = { userHostName, identityCheck, routeOwnerCheckingProxy };

if (require.main === module) main();
