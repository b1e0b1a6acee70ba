"""Policy losses that bound a token's update without zeroing its gradient: CISPO (twice) and SAPO.

PPO's clip drops the gradient of every token whose ratio left [1 - eps_low, 1 + eps_high] on the harmful side;
these keep every token in the update and bound how much each one counts. With `rho_t = pi(o_t) / pi_old(o_t)`:

  cispo       loss_t = -sg[clip(rho_t, 1 - eps_low, 1 + eps_high)] A_t log pi(o_t)     (verl "cispo")
  cispo_trl   loss_t = -sg[min(rho_t, eps_high)] A_t log pi(o_t)                        (TRL loss_type="cispo")
  sapo        loss_t = -(4 / tau_t) sigmoid(tau_t (rho_t - 1)) A_t,  tau_t = tau_pos if A_t > 0 else tau_neg

CISPO (MiniMax-M1) is REINFORCE with a clipped, stop-gradient importance weight: gradient
`-sg[w_t] A_t grad log pi(o_t)`, so clipped tokens still learn, at weight w_t. Its loss VALUE is
`-w A log pi` (as in both peers), not a surrogate: it is not comparable with `ppo_clip`'s value, only its
gradient is meaningful. The peers split on what eps means (methods/llm.md §12, point 5), so both are here:
- `cispo` (verl `compute_policy_loss_cispo`): eps are relative, as in PPO. Natural defaults differ from
  0.2 / 0.2: the paper sets no lower bound (verl's CISPO example uses clip_ratio_low=10, clip_ratio_high=0.2);
  any eps_low >= 1 disables the lower clip (rho > 0), so our defaults are eps_low=1.0, eps_high=0.2.
- `cispo_trl` (TRL `GRPOTrainer._compute_loss`, `loss_type="cispo"`): `eps_high` is an ABSOLUTE cap on the
  ratio (ScaleRL's eps_max; TRL's docs recommend 5.0, our default), and there is no lower clip (`eps_low` is
  unused). TRL's own default cap is `epsilon_high = epsilon = 0.2`, which scales even on-policy tokens by 0.2;
  we refuse caps below 1 for that reason.
Both peers aggregate CISPO with a global token mean ("token-mean").

SAPO (Qwen, arXiv 2511.20347) replaces the clip with a smooth gate; verl `compute_policy_loss_sapo` and TRL
`loss_type="sapo"` compute the same formula with the same defaults (tau_pos 1.0, tau_neg 1.05), and both
aggregate per sequence ("seq-mean-token-mean"; verl hard-codes it). The gradient is
`-4 sigma (1 - sigma) rho_t A_t grad log pi`: equal to PPO's `-A_t grad log pi` on-policy (rho = 1), decaying
smoothly as rho leaves 1. The value at rho = 1 is `-2 A_t / tau_t`, not `-A_t`. SAPO has no eps: `eps_low` /
`eps_high` are accepted for the shared signature and unused.

Choices:
- Dual clip (c > 1, off by default; neither peer applies it to these losses, our extension): for CISPO it caps
  the weight of `A < 0` tokens at c, `w = min(w, c)` (dual clip's bound on how much a negative-advantage
  token can count); it binds only when the weight can exceed c (cispo_trl's cap 5 > 3). SAPO's gate is
  already bounded (<= 4 / tau), and a hard cap there would reintroduce the zero-gradient region SAPO removes,
  so `sapo` refuses `dual_clip`.
- Log-ratios are clamped to +-20 and masked (as in `policy_losses.py`), and `log pi` is masked before it
  multiplies the weight, so garbage log-probs on padding cannot make inf/NaN values or gradients.

Metrics (same keys as `ppo_clip`): `clip_frac` is the fraction of tokens whose weight was clipped (verl counts
both sides; TRL's `cispo_clip_ratio` counts only `A > 0` tokens above the cap); SAPO has no hard clip and
reports 0 (as verl), plus `gate_weight_mean`, the mean of `4 sigma (1 - sigma)`: the factor by which SAPO
scales the unclipped surrogate's gradient (1 on-policy, towards 0 far off-policy).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from rlkit.objectives.policy_losses import MAX_LOG_RATIO
from rlkit.objectives.policy_losses import POLICY_LOSSES
from rlkit.objectives.policy_losses import _check_dual_clip
from rlkit.objectives.policy_losses import _masked_mean
from rlkit.objectives.policy_losses import _metrics
from rlkit.objectives.policy_losses import _prepare


def _ratio(logp, old_logp, advantages, mask):
  mask, advantages, log_ratio = _prepare(logp, old_logp, advantages, mask)
  ratio = jnp.exp(jnp.clip(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
  return mask, advantages, log_ratio, ratio


def _weighted_log_likelihood(logp, weight, clipped, advantages, mask, log_ratio, ratio, dual_clip):
  """`-sg[w] A log pi` with the optional dual-clip cap on the weight of `A < 0` tokens."""
  if dual_clip is not None:
    dual = (advantages < 0) & (weight > dual_clip)
    weight = jnp.where(dual, dual_clip, weight)
  else:
    dual = jnp.zeros(mask.shape, bool)
  loss = -jax.lax.stop_gradient(weight) * advantages * jnp.where(mask, logp, 0.0)
  return jnp.where(mask, loss, 0.0), _metrics(mask, clipped, dual, ratio, log_ratio)


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
               eps_low: float = 1.0, eps_high: float = 0.2,
               dual_clip: Optional[float] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """CISPO as verl's `compute_policy_loss_cispo`: weight `sg[clip(rho, 1 - eps_low, 1 + eps_high)]`.

  eps are relative (PPO's meaning); any `eps_low >= 1` means no lower clip (the paper's and verl's example
  setting, hence the default 1.0). Arguments and return as `ppo_clip_loss`.
  """
  if eps_low < 0.0 or eps_high < 0.0:
    raise ValueError(f"CISPO needs eps_low >= 0 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}.")
  _check_dual_clip(dual_clip)
  mask, advantages, log_ratio, ratio = _ratio(logp, old_logp, advantages, mask)
  weight = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  return _weighted_log_likelihood(logp, weight, weight != ratio, advantages, mask, log_ratio, ratio, dual_clip)


@POLICY_LOSSES.register("cispo_trl")
def cispo_trl_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                   eps_low: float = 0.2, eps_high: float = 5.0,
                   dual_clip: Optional[float] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """CISPO as TRL's `loss_type="cispo"`: weight `sg[min(rho, eps_high)]`, `eps_high` an absolute cap.

  No lower clip; `eps_low` is unused. `eps_high` must be >= 1 (TRL recommends 5.0, the default here).
  Arguments and return as `ppo_clip_loss`.
  """
  del eps_low
  if eps_high < 1.0:
    raise ValueError(
        f"cispo_trl caps the ratio at eps_high itself (an absolute value, TRL recommends 5.0), got {eps_high}: a "
        "cap below 1 shrinks even on-policy tokens. For PPO-style relative eps use policy loss 'cispo'.")
  _check_dual_clip(dual_clip)
  mask, advantages, log_ratio, ratio = _ratio(logp, old_logp, advantages, mask)
  weight = jnp.minimum(ratio, eps_high)
  return _weighted_log_likelihood(logp, weight, ratio > eps_high, advantages, mask, log_ratio, ratio, dual_clip)


@POLICY_LOSSES.register("sapo")
def sapo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
              eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: Optional[float] = None,
              tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[jax.Array, dict[str, jax.Array]]:
  """SAPO as verl's `compute_policy_loss_sapo` (= TRL `loss_type="sapo"`): `-(4/tau) sigmoid(tau (rho-1)) A`.

  :param tau_pos: gate temperature for tokens with `A > 0` (verl `tau_pos`, TRL `sapo_temperature_pos`).
  :param tau_neg: gate temperature for tokens with `A <= 0` (verl `tau_neg`, TRL `sapo_temperature_neg`); a
    larger value makes the gate fall off faster, damping negative updates more.
  `eps_low` / `eps_high` are unused; `dual_clip` must be None. Otherwise as `ppo_clip_loss`.
  """
  del eps_low, eps_high
  if dual_clip is not None:
    raise ValueError(f"SAPO has no hard clip to dual-clip (its gate is bounded by 4 / tau); got "
                     f"dual_clip={dual_clip}, set it to None for policy loss 'sapo'.")
  if tau_pos <= 0.0 or tau_neg <= 0.0:
    raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}.")
  mask, advantages, log_ratio, ratio = _ratio(logp, old_logp, advantages, mask)
  tau = jnp.where(advantages > 0, tau_pos, tau_neg).astype(ratio.dtype)
  gate = jax.nn.sigmoid(tau * (ratio - 1.0))
  loss = -(4.0 / tau) * gate * advantages
  none = jnp.zeros(mask.shape, bool)
  metrics = _metrics(mask, none, none, ratio, log_ratio)
  metrics["gate_weight_mean"] = _masked_mean(jax.lax.stop_gradient(4.0 * gate * (1.0 - gate)), mask)
  return jnp.where(mask, loss, 0.0), metrics
