"""A session's use of its slice: gauges, activity for idle culling, the walltime's end."""
