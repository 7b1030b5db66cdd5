"""Saving into a full home folder: refused in words, the file on disk left as it was.

jupyter_server's file manager writes a notebook to a temporary file and moves it into place
(use_atomic_writing), so a full disk or quota never truncates the copy on disk; but it says so as
"Unexpected error while saving file: work.ipynb [Errno 28] No space left on device" (or "database or
disk is full", from the notebook-signing database), a 500. Here the same refusal is a 507 that says
what happened and what to do. The session's contents manager (ServerApp.contents_manager_class, set in
the session's config by portal.session.tool.offer.write_config): jupyter_server's own, with this one change.
"""

from __future__ import annotations

import re

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web

FULL = re.compile(r"\[Errno (28|122)\]|No space left on device|Disk quota exceeded|database or disk is full")


def full_words(path: str) -> str:
    return (f"Your home folder is full: {path} was not saved, and the copy on disk is your last save, whole. Free some "
            "space (or ask your admin for more), then save again.")


class ContentsManager(AsyncLargeFileManager):
    async def save(self, model, path=""):
        try:
            return await super().save(model, path)
        except web.HTTPError as error:
            if error.status_code == 500 and FULL.search(error.log_message or ""):
                self.log.warning("dsportal: %s not saved: %s", path, error.log_message)
                raise web.HTTPError(507, full_words(path.strip("/"))) from None
            raise
