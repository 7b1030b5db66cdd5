"""The base of every JSON API the session's server extension adds (jobs, templates, ...)."""

from __future__ import annotations

import json

from jupyter_server.base.handlers import APIHandler


class MessageAPIHandler(APIHandler):
    """An API whose errors are ``{"message": <the reason, for a person>}``."""

    def write_error(self, status_code, **kwargs):
        self.set_header("Content-Type", "application/json")
        reason = kwargs.get("exc_info", (None, None))[1]
        message = getattr(reason, "log_message", None) or self._reason
        self.finish(json.dumps({"message": message}))
