"""JupyterHub spawners of dsportal, run in the hub process: sessions as Slurm jobs holding a GPU slice.

- :mod:`spawner.profiles`: PartitionSpawner, the WrapSpawner whose chosen profile configures the child;
- :mod:`spawner.slurm`: SlurmGPUSpawner, the session as a Slurm job;
- :mod:`spawner.form`: the request (form or REST) checked against the profile, shared with the
  session's job launcher, which imports it alone (this package's __init__ imports nothing).
"""
