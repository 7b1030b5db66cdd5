"""The one place that talks to Slurm: its client, its output's parsing, the root-owned mediator."""
