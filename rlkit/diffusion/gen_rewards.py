"""Rewards for a conditional generator (registry GEN_REWARDS, `<gen_rl stage>.reward`): pure jnp functions
(x [N, D], cond [N] int) -> [N] float32 of final samples, which the RL stage scores (and DRaFT differentiates).

An entry is a `RewardSpec`: the datasets it scores (GEN_DATA names), whether it is differentiable (DRaFT needs
a gradient; an entry that is not says why), and `build(reward section, stage section) -> GenReward`:
  score        the reward the methods optimise
  reports      {name: fn} more rewards logged beside it (toy2d: true_reward, the reward without its hack)
  optimum      [C, S, D] draws of each condition's KL-regularised optimum p* ∝ p exp(r_true / beta), when it is
               known exactly (toy2d), else None: the stage reports the MMD of its samples to them (opt_mmd)

  toy2d             rlkit/diffusion/toy2d.py's reward r(x, c) = -||x - g_c||^2 + gamma x[0]: g_c the rare mode's
                    mean, gamma x[0] the optional hackable term off the data (`reward.gamma`); true_reward is r
                    with gamma = 0, and p* is `tilted(mixture_c, the true reward, beta)` (`reward.beta`), exactly
  digit_confidence  log p(c | clip(x, -1, 1)) under the digit classifier (rlkit/diffusion/digits.py): the
                    generator is asked for class c; clipping to the pixel range keeps the gradient from rewarding
                    values no image has
  ink               the share of inked pixels (value > 0, i.e. at least half intensity): a stroke-thickness
                    reward, piecewise constant in x, so it has no gradient (DRaFT refuses it)
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry
from rlkit.diffusion import digits
from rlkit.diffusion.gen_data import toy2d_task
from rlkit.diffusion.toy2d import tilted

Array = jax.Array
OPTIMUM_DRAWS = 512             # draws of p* per condition (fixed numpy seed: the same target in every run)


class GenReward(NamedTuple):
  score: Callable[[Array, Array], Array]
  reports: dict
  optimum: Optional[np.ndarray]


class RewardSpec(NamedTuple):
  build: Callable[..., GenReward]
  data: tuple                   # the GEN_DATA datasets it scores
  differentiable: bool
  why_not: str = ""             # why it has no gradient (DRaFT's error message)


GEN_REWARDS: Registry[RewardSpec] = Registry("generative reward")


def _toy2d(reward, section) -> GenReward:
  task = toy2d_task(section, reward.gamma)
  goals = jnp.asarray(task.goals, jnp.float32)

  def true_reward(x, cond):
    return -jnp.sum((x - goals[cond]) ** 2, axis=-1)

  def score(x, cond):
    return true_reward(x, cond) + reward.gamma * x[:, 0]

  rng = np.random.default_rng(0)
  optimum = np.stack([tilted(m, task.reward_of(c, hackable=False), reward.beta)[0].sample(rng, OPTIMUM_DRAWS)
                      for c, m in enumerate(task.mixtures)]).astype(np.float32)
  return GenReward(score, {"true_reward": true_reward}, optimum)


def _digit_confidence(reward, section) -> GenReward:
  del reward, section
  params = jax.tree.map(jnp.asarray, digits.classifier()[0])

  def score(x, cond):
    logp = jax.nn.log_softmax(digits.classifier_logits(params, jnp.clip(x, -1.0, 1.0)), axis=-1)
    return jnp.take_along_axis(logp, cond[:, None], axis=-1)[:, 0]
  return GenReward(score, {}, None)


def _ink(reward, section) -> GenReward:
  del reward, section
  return GenReward(lambda x, cond: jnp.mean((x > 0).astype(jnp.float32), axis=-1), {}, None)


GEN_REWARDS.add("toy2d", RewardSpec(_toy2d, ("toy2d",), True))
GEN_REWARDS.add("digit_confidence", RewardSpec(_digit_confidence, ("digits",), True))
GEN_REWARDS.add("ink", RewardSpec(_ink, ("digits",), False,
                                  "it counts inked pixels, a step function of x whose gradient is 0 almost everywhere"))
