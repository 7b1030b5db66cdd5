"""Talks to or sets up the cluster: the Slurm adapter (the one place that parses Slurm), the
demo cluster, the node firewall, and the admin's checks, images, usage and templates check."""
