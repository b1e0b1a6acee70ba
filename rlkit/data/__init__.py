"""rlkit.data."""
