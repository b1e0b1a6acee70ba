"""Shared vocabulary of rlkit: pytree types, registries and config validation."""
from rlkit.core.registry import Registry
from rlkit.core.types import Rollout
