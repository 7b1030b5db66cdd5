# dsportal: every Python kernel of a session gets the %%horovod magic and launch_job().
c.InteractiveShellApp.extensions = list(c.InteractiveShellApp.extensions or []) + ["portal.magics"]  # noqa: F821
