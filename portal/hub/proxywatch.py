"""Every session's route back within seconds when configurable-http-proxy restarted.

dsportal runs the proxy as a service of its own (proxyservice.py): systemd starts it again within
seconds when it dies (the unit's Restart=on-failure), but a new proxy holds no route, and JupyterHub
checks the proxy's routes only at its own start and every last_activity_interval, which the portal
turns off where profiles have idle limits (config.py). Until the hub restarted, every session was
unreachable.

So the hub keeps one route of its own in the proxy, a sentinel (JupyterHub's Proxy.extra_routes, which
its check_routes maintains beside the users' routes), asks the proxy for that one route every
CHECK_SECONDS (a request of a few bytes, whatever the number of sessions), and where it is gone runs
JupyterHub's check_routes: each running session's route is put back, and the sentinel with it. A proxy
that does not answer is asked again at the next turn.
"""

from __future__ import annotations

import asyncio
import time

from jupyterhub.utils import url_path_join

from portal.upstream import hub as upstream
from portal.upstream.patchcheck import stands_aside

CHECK_SECONDS = 3
SENTINEL = "dsportal-proxy-sentinel/"  # below the hub's own route: a request there reaches the hub's 404


def chp_path(routespec: str) -> str:
    """configurable-http-proxy's API path of a route (as JupyterHub's ConfigurableHTTPProxy makes it)."""
    path = routespec if routespec.startswith("/") else "/" + routespec
    return path.rstrip("/") if path != "/" else path


class ProxyWatch:
    """Puts the routes back where the sentinel is gone from the proxy."""

    def __init__(self, hub, routespec: str):
        self.hub, self.routespec, self.busy = hub, routespec, False
        self.restored = 0  # how often the routes were put back (the log says each time)

    async def tick(self) -> bool:
        """One look at the proxy; True where the routes were put back."""
        if self.busy:
            return False
        self.busy = True
        try:
            if await self._sentinel_present():
                return False
            started = time.monotonic()
            await upstream.check_proxy_routes(self.hub)
            self.restored += 1
            self.hub.log.warning("dsportal: the proxy had lost its routes (it restarted): every running session's "
                                 "route put back in %.2f s", time.monotonic() - started)
            return True
        except Exception:
            self.hub.log.exception("dsportal: putting the proxy's routes back failed; trying again in %d s",
                                   CHECK_SECONDS)
            return False
        finally:
            self.busy = False

    async def _sentinel_present(self) -> bool:
        """Whether the proxy has the sentinel; True also where it does not answer (nothing to put back into)."""
        from aiohttp import ClientResponseError

        try:
            await asyncio.wait_for(self.hub.proxy.api_request(chp_path(self.routespec), method="GET"), CHECK_SECONDS)
        except ClientResponseError as error:
            return error.status != 404
        except (TimeoutError, OSError):
            return True
        return True


def watch(hub) -> ProxyWatch | None:
    """The sentinel among the proxy's extra routes, and its watch every CHECK_SECONDS (after JupyterHub
    built its application, on its event loop)."""
    if stands_aside("proxy-restart-routes"):  # JupyterHub's code it rests on changed: routes at the hub's start only
        return None
    from tornado.ioloop import PeriodicCallback

    # With subdomain_host JupyterHub wants a host in an extra route's spec: the hub's own domain.
    routespec = f"{hub.domain}/{SENTINEL}" if hub.subdomain_host else url_path_join(hub.hub.routespec, SENTINEL)
    try:
        hub.proxy.extra_routes = {**hub.proxy.extra_routes, routespec: hub.hub.url}
    except ValueError as error:  # JupyterHub refused the route: routes at the hub's start only, as before
        hub.log.error("dsportal: no watch of the proxy's routes: %s", error)
        return None
    watcher = ProxyWatch(hub, routespec)
    PeriodicCallback(watcher.tick, CHECK_SECONDS * 1000).start()
    hub.log.info("dsportal: the proxy's routes are put back within %d s of its restart (sentinel %s)", CHECK_SECONDS,
                 routespec)
    return watcher


def install() -> None:
    upstream.after_init_tornado_application(watch)


watch.watches_proxy = True  # PATCHES: proxy-restart-routes is applied
