"""A session's entry point leaves hub-only code out of its start, and that code still works when used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What portal.session.singleuser does before it runs jupyterhub-singleuser, then: what was left out
# is not loaded, and each piece, used, is the real one.
SESSION_START = """
import sys
from portal.session import singleuser
singleuser.resolve_names_in_threads()
singleuser.leave_out_the_hubs_database()
singleuser.skip_yarn_config()
import jupyterhub.singleuser, jupyterlab.labapp, portal.session.extension
loaded = sorted(m for m in ("sqlalchemy", "alembic", "pydantic", "aiodns") if sys.modules.get(m) is not None)
print("loaded at start:", loaded)
import jupyterhub.orm, jupyterhub.roles, jupyterhub.scopes, requests
from portal.session import jobs_api
print(jupyterhub.orm.User.__tablename__, jupyterhub.scopes.sa.inspect.__name__,
      type(jupyterhub.roles.func.count).__name__, requests.Session.__name__, jobs_api.jobs.LaunchPolicy.__name__)
"""


def test_hub_only_code_is_left_out_of_a_session_start_and_works_when_used():
    out = subprocess.run([sys.executable, "-c", SESSION_START], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "loaded at start: []", out.stdout
    assert lines[1] == "users inspect _FunctionGenerator Session LaunchPolicy", out.stdout
