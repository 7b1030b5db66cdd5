"""JupyterHub spawners of dsportal, run in the hub process: sessions as Slurm jobs holding a GPU slice.

- :mod:`spawner.partitionspawner`: PartitionSpawner, the WrapSpawner whose chosen profile configures the child;
- :mod:`spawner.gpuspawner`: SlurmGPUSpawner, the session as a Slurm job;
- :mod:`spawner.form`: the spawn form's fields read into options (the rules are portal/core/rules.py's);
- :mod:`spawner.certs`: a session's TLS certificates, delivered into its user's home.
"""
