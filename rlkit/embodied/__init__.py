"""rlkit.embodied."""
