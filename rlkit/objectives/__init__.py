"""rlkit.objectives."""
