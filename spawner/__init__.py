"""JupyterHub spawners of dsportal: sessions as Slurm jobs holding a GPU slice."""

from .profiles import PartitionSpawner
from .slurm import SlurmGPUSpawner

__all__ = ["PartitionSpawner", "SlurmGPUSpawner"]
