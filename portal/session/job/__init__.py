"""Jobs launched from a session: multi-node MPI jobs, the %%horovod magic, schedules."""
