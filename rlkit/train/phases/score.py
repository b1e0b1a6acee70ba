"""Phase 5, score: the trainer's log-probs of every row's response, by the one scorer
(`rlkit.rollout.scoring`), and the `TrainBatch` the update consumes.

  old_logp      the policy before this iteration's updates (the PPO ratio's denominator)
  ref_logp      the reference model (kl_beta > 0): the stage's initial policy, or `models.reference`
  others        a method asks for more by role (e.g. a teacher's log-probs for distillation) through
                `rl.score_roles`, stored in `TrainBatch.extras["<role>_logp"]`; a distribution scorer's dict
                (rlkit/train/distill.py) goes to extras["<key>_logp"], ["<key>_ids"]

All are taken under the sampler's processing (temperature, top-k, top-p), so the mismatch metric
(`rl_metrics.mismatch`: trainer old_logp vs the sampler's `rollout_logp`, policy rows) measures numerics
alone: a mismatch well above float rounding means the trainer and the sampler compute different
distributions.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.types import TrainBatch
from rlkit.train.phases.collect import Samples


def train_batch(samples: Samples, advantages, put_batch: Callable[[dict], dict],
                token_weights: Optional[jax.Array] = None) -> TrainBatch:
  """The update's batch from the selected, augmented rows (old/ref log-probs still zero: see `score`;
  `advantages` [n, R] host-side, or None: zeros, filled in by the advantage phase after scoring). Token
  weights: `token_weights`, else each row's `samples.weight` on all its positions, else ones."""
  ro = samples.rollout
  # This process's rows -> global arrays, sharded like the rollout.
  host = {"row_source": samples.row_source.astype(np.int32), "valid": samples.valid}
  if samples.weight is not None and token_weights is None:
    host["weight"] = samples.weight.astype(np.float32)
  if advantages is not None:
    host["advantages"] = np.asarray(advantages, np.float32)
  host = put_batch(host)
  valid = host["valid"][:, None]
  loss_mask = ro.response_mask & valid
  attention_mask = ro.attention_mask & valid
  zeros = jnp.zeros_like(ro.logprobs)
  return TrainBatch(tokens=ro.tokens, attention_mask=attention_mask, loss_mask=loss_mask, old_logp=zeros,
                    rollout_logp=jnp.where(loss_mask, ro.logprobs, 0.0),
                    advantages=host["advantages"] if advantages is not None else zeros,
                    token_weights=(token_weights if token_weights is not None else
                                   jnp.broadcast_to(host["weight"][:, None], zeros.shape) if "weight" in host
                                   else jnp.ones_like(zeros)),
                    group_ids=ro.group_ids, row_source=host["row_source"], extras=dict(ro.extras))


def score(batch: TrainBatch, scorers: dict[str, tuple[Callable, Any]]) -> TrainBatch:
  """Fills old_logp ("policy"), ref_logp ("reference") and extras["<role>_logp"] for every other role.

  :param scorers: role -> (jitted `score(params, batch)`, params).
  """
  out, extras = {}, dict(batch.extras)
  for role, (fn, params) in scorers.items():
    out[role] = fn(params, batch)
    if isinstance(out[role], dict):          # a distribution scorer: "<teacher>_dist" -> <teacher>_dist_logp, ...
      extras.update({f"{role}_{k[len('dist_'):]}": v for k, v in out[role].items()})
    elif role not in ("policy", "reference"):
      extras[f"{role}_logp"] = out[role]
  return batch.replace(old_logp=out["policy"], ref_logp=out.get("reference"), extras=extras)
