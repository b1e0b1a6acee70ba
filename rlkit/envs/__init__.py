"""rlkit.envs."""
