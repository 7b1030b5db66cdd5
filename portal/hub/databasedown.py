"""The hub's database not answering: its pages and API answer 503 in words, nobody is logged out.

JupyterHub's BaseHandler.prepare looks the request's user up in its database and, where that raises
(the database down or restarting), logs it and goes on as if nobody were logged in: a browser is
sent to the login page as if logged out, and an API client is told its token is invalid (403), which
a script may take as revoked. Here a database error in that look-up is remembered, and prepare,
after JupyterHub's own (which rolls the session back, so the next request after the database is
back works), answers 503 with :data:`WORDS` instead. Running sessions never ask the hub's database
on their way through the proxy: they go on meanwhile.

A patch of JupyterHub's handler (PATCHES database-down-503): where its code changed, it stands aside
and JupyterHub's own answer stays.
"""

from __future__ import annotations

from portal.hub import metrics
from portal.upstream import hub as upstream
from portal.upstream.patchcheck import stands_aside

WORDS = ("The portal's database is not answering right now (it may be restarting). Nothing of yours is lost and "
         "running sessions go on; please try again in a minute.")


def install() -> None:
    if stands_aside("database-down-503"):
        return
    upstream.answer_503_when_the_database_fails(WORDS, metrics.DATABASE_UNAVAILABLE.inc)
