"""rlkit.sync."""
