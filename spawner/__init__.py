"""JupyterHub spawners of dsportal: sessions as Slurm jobs holding a GPU slice."""

from .slurm import SlurmGPUSpawner

__all__ = ["SlurmGPUSpawner"]
