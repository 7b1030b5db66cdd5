"""dsportal: a Jupyter data-science portal for Slurm GPU clusters."""

__version__ = "0.1.0"
