"""rlkit.optim."""
