"""rlkit.train."""
