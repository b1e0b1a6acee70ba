"""Optax transforms and schedules."""
from rlkit.optim.optimizers import OPTIMIZERS, SCHEDULES, make_optimizer, optimizer_defaults
