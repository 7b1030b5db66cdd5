"""JupyterHub spawners of dsportal, run in the hub process: sessions as Slurm jobs holding a GPU slice.

- :mod:`spawner.partitionspawner`: PartitionSpawner, the WrapSpawner whose chosen profile configures the child (it
  reads the spawn form's fields into options; the rules are portal/core/rules.py's);
- :mod:`spawner.gpuspawner`: SlurmGPUSpawner, the session as a Slurm job;
- :mod:`spawner.certs`: a session's TLS certificates, delivered into its user's home.
"""
