# dsportal: every Python kernel of a session gets the %%horovod magic and launch_job().
c.InteractiveShellApp.extensions.append("portal.session.magics")  # noqa: F821
