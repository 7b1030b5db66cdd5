from portal.session.kernels.kernelpipe import private_iopub_pipe

# dsportal: every Python kernel of a session gets the %%horovod magic and launch_job().
c.InteractiveShellApp.extensions.append("portal.session.jobs.magics")  # noqa: F821  (c is provided by IPython)
# ... and listens on no TCP port: its channels are private unix sockets (portal.session.kernels.kernelsockets),
# and so is ipykernel's pipe for the output of processes it forks (portal.session.kernels.kernelpipe).
private_iopub_pipe()
