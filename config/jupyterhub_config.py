# JupyterHub reads this file; everything comes from portal.yaml ($DSPORTAL_CONFIG, which `dsportal hub` sets to the
# file it checked; else /etc/dsportal/portal.yaml: portal/core/settings.py, config_path).
from portal.hub.config import configure

configure(c)  # noqa: F821  (c is provided by JupyterHub)
