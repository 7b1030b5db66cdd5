"""The Jupyter server extension of every session: the one place that adds dsportal's routes.

Loaded by the session's Jupyter server (jupyter-config/dsportal-jobs.json). Each feature keeps
its handlers in its own module; this puts them under the session's base URL:
  dsportal/api/jobs, jobs/<id>[/stream, /results, /files/<nb>], schedules[/<id>], policy, slice
                                                                  the job launcher (jobs_api.py)
  dsportal/api/idle                                               idle state, "Keep my session" (activity.py)
  dsportal/api/usage                                              use against the slice's limits (gauges.py)
  dsportal/api/templates, templates/open                          template copies (nbtemplates.py)
  dsportal/tensorboard/...                                        TensorBoard (tensorboards.py)
  dsportal/api/walltime/saved                                     what JupyterLab saved as the walltime ended (walltime.py)
  dsportal/api/sharing                                            the session's shares (sharing.py)
All of them answer the session's owner only, never a guest of a shared session (sharing.GuestGate).
and guards jupyter-server-proxy's /proxy/ routes (portguard.py). Once the server listens, a session
job's server reports its port to the hub (portreport.py).
"""

from __future__ import annotations

from jupyter_server.utils import url_path_join

from portal.session import nbtemplates, portreport, sharing, singleuser
from portal.session.job import api as jobs_api
from portal.session.tool import portguard, tensorboards
from portal.session.usage import activity, gauges, walltime


def _load_jupyter_server_extension(server_app):
    sharing.install_gate(server_app)  # first: whatever fails below, no guest passes unjudged
    activity.start_reports(server_app)  # then: whatever fails below, the hub hears of the session's use
    web_app = server_app.web_app
    base = web_app.settings["base_url"]
    routes = [
        ("dsportal/api/jobs", jobs_api.JobsHandler),
        # A Slurm job id: 32 bits (int() of a path of thousands of digits would be an error, not a 404).
        (r"dsportal/api/jobs/(\d{1,10})", jobs_api.JobHandler),
        (r"dsportal/api/jobs/(\d{1,10})/stream", jobs_api.JobStreamHandler),
        (r"dsportal/api/jobs/(\d{1,10})/results", jobs_api.ResultsHandler),
        (r"dsportal/api/jobs/(\d{1,10})/files/([A-Za-z0-9_.-]{1,40})", jobs_api.JobNotebookHandler),
        ("dsportal/api/schedules", jobs_api.SchedulesHandler),
        (r"dsportal/api/schedules/([0-9a-f]{8})", jobs_api.ScheduleHandler),
        ("dsportal/api/policy", jobs_api.PolicyHandler),
        ("dsportal/api/slice", jobs_api.SliceHandler),
        ("dsportal/api/extend", jobs_api.ExtendHandler),
        ("dsportal/api/idle", activity.IdleHandler),
    ]
    portreport.allow_port_retries(server_app)
    activity.setup(server_app)
    routes += tensorboards.setup(server_app)
    routes += nbtemplates.setup(server_app)
    routes += walltime.setup(server_app)
    routes += gauges.setup(server_app)
    routes += sharing.routes()
    web_app.add_handlers(".*$", [(url_path_join(base, pattern), *rest) for pattern, *rest in routes])
    portguard.install(web_app, base, server_app.log)
    server_app.log.info("dsportal: job launcher at %s", url_path_join(base, "dsportal/api"))


async def _start_jupyter_server_extension(server_app):
    # Runs once the event loop runs, after the server bound its port (queued before this hook).
    singleuser.started()
    walltime.listen(server_app)
    await portreport.report(server_app)


def _jupyter_server_extension_points():
    return [{"module": "portal.session.extension"}]
