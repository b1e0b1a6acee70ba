"""rlkit.quant."""
