"""rlkit.parallel."""
