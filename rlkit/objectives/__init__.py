"""rlkit.objectives: advantages, policy losses, KL penalties, loss aggregation and DAPO helpers.

A train step composes them by config name (methods/llm.md §12):

  adv  = group_advantages(cfg.advantage, rewards, G)                       [N]
  loss, metrics = POLICY_LOSSES.get(cfg.policy_loss)(logp, old_logp, adv, mask, eps_low=..., eps_high=...)
  loss += beta * kl_penalty(cfg.kl, logp, ref_logp)                        [N, T]
  scalar = aggregate(loss, mask, cfg.aggregation, **loss_normalizers(full_batch_mask), max_len=...)

Critic-based and REINFORCE++ advantages are per token (`returns.py`):

  r = outcome_token_rewards(rewards, mask)                                  [N, T]
  adv, ret = gae(r, values, mask, gamma, lam); adv = masked_whiten(adv, mask)
  v_loss, v_metrics = clipped_value_loss(new_values, values, ret, mask, clip)
"""
from rlkit.objectives.advantages import ADVANTAGES
from rlkit.objectives.advantages import group_advantages
from rlkit.objectives.advantages import informative_groups
from rlkit.objectives.aggregation import AGGREGATIONS
from rlkit.objectives.aggregation import aggregate
from rlkit.objectives.aggregation import loss_normalizers
from rlkit.objectives.dapo import DynamicSampleSelection
from rlkit.objectives.dapo import dynamic_sampling_select
from rlkit.objectives.dapo import overlong_penalty
from rlkit.objectives.entropy import mean_token_entropy
from rlkit.objectives.entropy import token_entropy
from rlkit.objectives.kl import KL_ESTIMATORS
from rlkit.objectives.kl import kl_penalty
from rlkit.objectives.logprobs import token_logprobs
from rlkit.objectives.policy_losses import POLICY_LOSSES
from rlkit.objectives.policy_losses import gmpo_loss
from rlkit.objectives.policy_losses import gspo_loss
from rlkit.objectives.policy_losses import gspo_token_loss
from rlkit.objectives.policy_losses import ppo_clip_loss
# Registers "cispo", "cispo_trl" and "sapo" into POLICY_LOSSES on import.
from rlkit.objectives.policy_losses_soft import cispo_loss
from rlkit.objectives.policy_losses_soft import cispo_trl_loss
from rlkit.objectives.policy_losses_soft import sapo_loss
from rlkit.objectives.returns import clipped_value_loss
from rlkit.objectives.returns import discounted_returns
from rlkit.objectives.returns import explained_variance
from rlkit.objectives.returns import gae
from rlkit.objectives.returns import masked_whiten
from rlkit.objectives.returns import outcome_token_rewards
from rlkit.objectives.returns import reinforce_pp_advantages
from rlkit.objectives.returns import reinforce_pp_baseline_advantages
