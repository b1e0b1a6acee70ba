"""On-policy distillation in the trainer (the maths: `rlkit.objectives.distill`): one config section, `rl.distill`,
one token advantage estimator and the teacher's scorers.

  advantage `opd`        a_t = sg(log p_T(y_t) − log p_S(y_t)) + λ·A_t, with A the group estimator
                         `distill.reward_advantage` of the rewards (λ = `distill.reward_weight`; 0: pure OPD) on
                         every response token: OPD as RL with a per-token reward and discount 0, through the
                         clipped surrogate (the recipe of Thinking Machines' "On-Policy Distillation")
  loss terms             `opd` (sampled-token reverse KL, policy-gradient form), `reverse_kl`, `forward_kl`, `jsd`
                         (full distribution or the teacher's top-k), each weighted in `rl.loss_terms`
  scoring                the teacher (`distill.teacher`, a role of config.models) is scored in the scoring phase
                         whenever one of them is on: its log-probs of the sampled tokens (extras
                         "<teacher>_logp") and, for the full-distribution terms, its distribution at the sampling
                         temperature ("<teacher>_dist_logp", with top-k also "<teacher>_dist_ids")

The `distill` stage kind (`rl_stage.distill_defaults`) is the rl stage with `advantage="opd"` by default, so
`stages = ("sft", "rl", "distill")` distils the RL policy into a student given as the run's model.
"""
from __future__ import annotations

import jax.numpy as jnp
import ml_collections

from rlkit.objectives import ADVANTAGES, group_advantages
from rlkit.objectives.distill import DIVERGENCES, opd_token_advantage
from rlkit.rollout.scoring import make_distribution_scorer, make_scorer
from rlkit.train.phases.advantages import TOKEN_ESTIMATORS, TokenEstimator

SAMPLED = ("opd",)          # loss terms that read the teacher's log-probs of the sampled tokens


def distill_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.teacher = "teacher"         # the config.models role distilled from (same tokenizer as the student)
  c.top_k = 0                   # full-distribution terms: the teacher's k most likely tokens per position (0: all)
  c.beta = 0.5                  # jsd: interpolation, 0 = forward KL, 1 = reverse KL (TRL GKD's convention)
  c.reward_weight = 0.0         # advantage opd: λ, the weight of the RL advantage added (0: pure distillation)
  c.reward_advantage = "group"  # advantage opd: the group estimator of that RL advantage
  return c


def uses_sampled(cfg) -> bool:
  return cfg.advantage == "opd" or any(t in cfg.loss_terms for t in SAMPLED)


def uses_distribution(cfg) -> bool:
  return any(t in cfg.loss_terms for t in DIVERGENCES)


def distill_roles(cfg) -> tuple:
  """The config.models roles the section's distillation scores: its teacher when anything reads it."""
  return (cfg.distill.teacher,) if uses_sampled(cfg) or uses_distribution(cfg) else ()


def distill_scorers(ctx, cfg, sampling) -> dict:
  """scorer key -> (jitted scorer, params) for `rl_stage`'s scoring phase (module docstring)."""
  d, out = cfg.distill, {}
  if not distill_roles(cfg):
    return out
  teacher = ctx.models[d.teacher]
  if uses_sampled(cfg) and d.teacher not in cfg.score_roles:
    out[d.teacher] = (make_scorer(teacher.module, sampling), teacher.params)
  if uses_distribution(cfg):
    if teacher.module.cfg.vocab_size != ctx.model.cfg.vocab_size:
      from rlkit.train.config import ConfigError
      raise ConfigError(f"models.{d.teacher} has a vocabulary of {teacher.module.cfg.vocab_size}, the student "
                        f"{ctx.model.cfg.vocab_size}: the full-distribution terms ({', '.join(DIVERGENCES)}) compare "
                        "distributions over one vocabulary; use the `opd` term or advantage, or one tokenizer.")
    out[f"{d.teacher}_dist"] = (make_distribution_scorer(teacher.module, cfg.temperature, d.top_k), teacher.params)
  return out


def check(cfg, name: str) -> str:
  """'' if the section's distill settings are in range, else the message."""
  d = cfg.distill
  if not 0.0 <= d.beta <= 1.0 or d.top_k < 0 or d.reward_weight < 0:
    return (f"{name}.distill needs beta in [0, 1], top_k >= 0 and reward_weight >= 0; got beta={d.beta}, "
            f"top_k={d.top_k}, reward_weight={d.reward_weight}.")
  if d.reward_advantage not in ADVANTAGES:
    return f"{name}.distill.reward_advantage={d.reward_advantage!r}: one of {', '.join(ADVANTAGES)}."
  return ""


def _opd(rewards, batch, cfg, capacity, valid):
  d, mask = cfg.distill, batch.loss_mask
  adv = opd_token_advantage(batch.old_logp, batch.extras[f"{d.teacher}_logp"], mask)
  if d.reward_weight:
    group = group_advantages(d.reward_advantage, rewards, capacity, cfg.adv_eps, valid)
    adv = adv + d.reward_weight * jnp.where(mask, group[:, None], 0.0)
  return adv, {}


TOKEN_ESTIMATORS.add("opd", TokenEstimator(_opd, needs_values=False))
