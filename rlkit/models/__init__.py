"""rlkit.models."""
