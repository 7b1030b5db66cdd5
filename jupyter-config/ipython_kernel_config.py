from portal.session.kernel.kernelpipe import private_iopub_pipe

# dsportal: every Python kernel of a session gets the %%horovod magic and launch_job().
c.InteractiveShellApp.extensions.append("portal.session.job.magics")  # noqa: F821  (c is provided by IPython)
# ... and listens on no TCP port: its channels are private unix sockets (portal.session.kernel.kernelsockets),
# and so is ipykernel's pipe for the output of processes it forks (portal.session.kernel.kernelpipe).
private_iopub_pipe()
