"""Rewards: verifiers, rubric aggregation, reward models (registry `REWARDS`)."""
from rlkit.rewards.verifier import REWARDS
