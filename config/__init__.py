"""Package data of dsportal (installed so sessions and the hub find it without a checkout)."""
