"""Runs in the JupyterHub process: the hub's configuration, LDAP login, the sessions' port
report and the portal's metrics. The spawners (spawner/) run here too."""
