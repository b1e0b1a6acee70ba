"""Test-wide setup: 8 simulated CPU devices (for mesh tests) and float32 matmuls at full precision."""
import os

# Must be set before jax initialises its backend; harmless for single-device tests.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
