# JupyterHub reads this file; everything comes from portal.yaml ($DSPORTAL_CONFIG).
from portal.hub.config import configure

configure(c)  # noqa: F821  (c is provided by JupyterHub)
