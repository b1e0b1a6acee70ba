"""rlkit.diffusion."""
