"""SLCA-GRPO's segment-level advantages (methods/llm.md §10): each segment kind of a response gets its own reward,
normalised within the group separately, and each token receives its own segment's advantage.

A tool-calling response interleaves tool calls and a user-facing summary; GRPO broadcasts one advantage, from
their summed reward, to every token, so a noisy judgment of the summary moves the tool-call tokens too. SLCA
routes an execution reward only to the tool-call tokens and a preference reward only to the summary tokens.

For credited kinds k_1..k_S with per-row rewards r_k [N] (`RewardOutput.segment_rewards[:, k]`) and weights w_k:

  gate (optional, hierarchical)  r_k <- r_k * 1[r_{k_1} >= theta]  for every k after the first: no credit for a
                                 good summary of a failed call (k_1 is the execution kind)
  A_k     = group advantage of r_k, per group separately   z-score (GRPO: (r - mean) / (std + eps), std with
                                                          ddof=1) or centring only (scale=False, Dr. GRPO)
  A[i, t] = w_k A_k[i]  where token t of row i is of kind k, else 0

The group statistics are `rlkit.objectives.advantages`' (groups of one valid row and flat groups get exactly 0;
padding rows are skipped), so one credited kind with weight 1 over the summed reward is GRPO exactly. The weights
apply after normalisation (as in the released implementation), so a weight rescales a kind's advantage and
never its statistics. Tokens of kinds not credited (prompt, observations, padding) get 0; the loss mask keeps
observations out of the loss anyway.

Where a rule of the reward routes a penalty (a call that should not have been made, a malformed call), the
released implementation puts it on the summary segment: the reward adds it to the summary's column.
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from rlkit.objectives.advantages import group_advantages


def gate_rewards(segment_rewards: jax.Array, kinds: Sequence[int], threshold: float) -> jax.Array:
  """The hierarchical gate: columns `kinds[1:]` of `segment_rewards` [N, S] zeroed on rows whose column
  `kinds[0]` (the execution reward) is below `threshold`; other columns unchanged."""
  passed = segment_rewards[:, kinds[0]] >= threshold
  gated = jnp.zeros(segment_rewards.shape[1], bool).at[jnp.asarray(kinds[1:], jnp.int32)].set(True)
  return jnp.where(gated[None, :] & ~passed[:, None], 0.0, segment_rewards)


def segment_advantages(segment_rewards: jax.Array, segment_ids: jax.Array, kinds: Sequence[int],
                       weights: Sequence[float], group_size: int, *, eps: float = 1e-6, scale: bool = True,
                       valid: Optional[jax.Array] = None) -> jax.Array:
  """[N, R] float32 token advantages: each token of a credited kind `kinds[j]` gets weights[j] times its row's
  group advantage of column kinds[j] of `segment_rewards` [N, S]; every other token 0. `segment_ids` [N, R] holds
  each token's kind; `group_size` rows per group, contiguous; `valid` [N] bool marks real rows."""
  if len(kinds) != len(weights) or not kinds:
    raise ValueError(f"segment_advantages: {len(kinds)} kinds and {len(weights)} weights; give one weight per kind.")
  estimator = "group" if scale else "none"
  adv = jnp.zeros(segment_ids.shape, jnp.float32)
  for kind, weight in zip(kinds, weights):
    a = group_advantages(estimator, jnp.asarray(segment_rewards[:, kind], jnp.float32), group_size, eps,
                         valid=valid)
    adv = jnp.where(segment_ids == kind, weight * a[:, None], adv)
  return adv
