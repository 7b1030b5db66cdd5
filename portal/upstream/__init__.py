"""Every patch of upstream internals: its record, its check, and the patches with no feature home."""
