"""A request's user_options, judged before JupyterHub stores them.

JupyterHub keeps a start's options in its database (the defaults of the next start) before the spawner
sees them, and the REST API's PUT and PATCH keep them with no start at all: a field of 1 MB was an error
of the database on MariaDB (HTTP 500, "Data too long") and a megabyte kept on PostgreSQL and SQLite.
The spawn form's options are judged by the spawner's options_from_form, before JupyterHub has them; the
REST API's here, as the request's body is read (upstream.judge_server_requests), by the same rules
(PartitionSpawner.judged, portal/core/rules.py): refused with HTTP 400 and the reason, nothing stored.
"""

from __future__ import annotations

from tornado import web

from portal.upstream.hub import judge_server_requests
from spawner.gpuspawner import RequestRefused


def _judge(handler, user_name: str, options: dict) -> None:
    user = handler.find_user(user_name)
    if user is None:  # the handler found her before it read the body
        raise web.HTTPError(404)
    # Her default session's spawner judges for any of her sessions: the rules are the user's and the
    # portal's, not a session's (a named session may not exist yet). The start that follows takes this
    # judgement (PartitionSpawner.judged). Only POST starts one: its refusal counts as a refused start.
    try:
        user.spawner.judged(options)
    except RequestRefused:
        if handler.request.method == "POST":
            user.spawner.count_refusal(options)
        raise


def judge_before_storing() -> None:
    """Installed by portal/hub/config.py; idempotent."""
    judge_server_requests(_judge)
