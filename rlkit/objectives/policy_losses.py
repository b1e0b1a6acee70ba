"""Clipped policy-gradient losses: PPO/GRPO token-level clipping, GSPO, GSPO-token and GMPO.

Each returns the per-token NEGATIVE clipped surrogate (to minimise), to be reduced by `aggregation.py`:

  ppo_clip:    rho_t = pi(o_t) / pi_old(o_t)
  gspo:        rho_t = s_i = exp( (1/|o_i|) sum_t log(pi(o_t) / pi_old(o_t)) )   for every token of o_i
  gspo_token:  rho_t = sg[s_i] * pi(o_t) / sg[pi(o_t)]     (value s_i, gradient s_i * grad log pi(o_t))

  loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
  dual clip (c > 1, only where A_t < 0):  loss_t = min(loss_t, -c A_t)

  gmpo (verl "geo_mean"):  loss_t = -Abar_i exp( (1/|o_i|) sum_t clip_sgn(A_t)(log rho_t) )  for every token of o_i
    clip_+(x) = min(x, eps_high), clip_-(x) = max(x, -eps_low), clip_0(x) = 0; eps in LOG space, Abar_i = mean_t A_t

Losses that bound a token's update without zeroing its gradient (CISPO, SAPO) live in `policy_losses_soft.py`
and register into the same `POLICY_LOSSES`.

GRPO is `ppo_clip` + "seq-mean-token-mean", DAPO is `ppo_clip` (eps_high > eps_low) + "token-mean", the
GSPO paper's loss is `gspo` + "seq-mean-token-mean". GSPO and GSPO-token agree in value and gradient unless
advantages vary within a sequence. Exact formulas: methods/llm.md §12.

Choices:
- `old_logp` and `advantages` pass through `stop_gradient`; `advantages` may be `[N]` (broadcast over tokens)
  or `[N, T]`.
- Log-ratios are clamped to [-20, 20] before `exp` (as verl does), and padded tokens get log-ratio 0, so
  garbage log-probs on padding cannot make inf/NaN that would leak into gradients through a 0 * inf.
- Dual clip is off by default (TRL never applies it, Tunix only when set, verl always with c = 3); pass
  `dual_clip=3.0` for verl's behaviour. Applying it to `gspo` / `gspo_token` (on the sequence ratio) is our
  extension, not the GSPO paper's.
- GSPO's eps is about 1000x smaller than GRPO's, so its defaults are the paper's (3e-4, 4e-4), not 0.2.

All share one keyword signature, so a config can switch `objective.policy_loss` alone.
Metrics are masked token means over the rows given (local to a micro-batch):
  clip_frac       tokens where the clipped branch is active (its gradient is zero)
  dual_clip_frac  tokens where the dual clip is active (0 when off)
  ratio_mean      mean rho_t
  approx_kl       mean of log pi_old - log pi (k1 estimate of KL(pi_old || pi))
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from rlkit.core.registry import Registry

PolicyLossFn = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")

MAX_LOG_RATIO = 20.0


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  x = jnp.where(mask, x.astype(jnp.float32), 0.0)
  return x.sum() / jnp.maximum(mask.sum(), 1)


def _prepare(logp, old_logp, advantages, mask):
  """Shared input handling: bool mask, [N, T] stop-gradient advantages, masked token log-ratio."""
  mask = jnp.asarray(mask).astype(bool)
  old_logp = jax.lax.stop_gradient(old_logp)
  advantages = jax.lax.stop_gradient(jnp.asarray(advantages)).astype(logp.dtype)
  if advantages.ndim == 1:
    advantages = advantages[:, None]
  advantages = jnp.broadcast_to(advantages, logp.shape)
  log_ratio = jnp.where(mask, logp - old_logp, 0.0)
  return mask, advantages, log_ratio


def _check_dual_clip(dual_clip) -> None:
  if dual_clip is not None and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1 (verl uses 3.0) or None to disable it, got {dual_clip}.")


def _check_clip(eps_low, eps_high, dual_clip) -> None:
  if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
    raise ValueError(f"Need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}.")
  _check_dual_clip(dual_clip)


def _metrics(mask, clipped, dual, ratio, log_ratio) -> dict[str, jax.Array]:
  """The metric keys every policy loss reports, as masked token means (see the module docstring)."""
  return {
      "clip_frac": _masked_mean(clipped, mask),
      "dual_clip_frac": _masked_mean(dual, mask),
      "ratio_mean": _masked_mean(jax.lax.stop_gradient(ratio), mask),
      "approx_kl": _masked_mean(-jax.lax.stop_gradient(log_ratio), mask),
  }


def _dual_clip(loss, advantages, dual_clip):
  """`min(loss, -c A)` where `A < 0`; returns the loss and where the cap is active."""
  if dual_clip is None:
    return loss, jnp.zeros(loss.shape, bool)
  capped = -advantages * dual_clip
  dual = (advantages < 0) & (loss > capped)
  return jnp.where(dual, capped, loss), dual


def _clipped_surrogate(ratio, advantages, mask, log_ratio, eps_low, eps_high, dual_clip):
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss, dual = _dual_clip(jnp.maximum(unclipped, clipped), advantages, dual_clip)
  return jnp.where(mask, loss, 0.0), _metrics(mask, clipped > unclipped, dual, ratio, log_ratio)


def _sequence_log_ratio(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
  """[N, 1] length-normalised sequence log-ratio; empty rows get 0."""
  return log_ratio.sum(-1, keepdims=True) / jnp.maximum(mask.sum(-1, keepdims=True), 1)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                  eps_low: float = 0.2, eps_high: float = 0.2,
                  dual_clip: Optional[float] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Token-level clipped surrogate (PPO, GRPO; DAPO's clip-higher with `eps_high > eps_low`).

  :param logp: `[N, T]` log-probs of the sampled tokens under the current policy (differentiated).
  :param old_logp: `[N, T]` log-probs under the policy that generated the data (no gradient).
  :param advantages: `[N]` or `[N, T]` (no gradient).
  :param mask: `[N, T]` True on response tokens.
  :returns: `([N, T]` loss, 0 off the mask, `metrics)`.
  """
  _check_clip(eps_low, eps_high, dual_clip)
  mask, advantages, log_ratio = _prepare(logp, old_logp, advantages, mask)
  ratio = jnp.exp(jnp.clip(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
  return _clipped_surrogate(ratio, advantages, mask, log_ratio, eps_low, eps_high, dual_clip)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
              eps_low: float = 3e-4, eps_high: float = 4e-4,
              dual_clip: Optional[float] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GSPO: one length-normalised ratio per sequence, clipped at the sequence level, broadcast to tokens.

  With "seq-mean-token-mean" this is the paper's `-(1/G) sum_i min(s_i A_i, clip(s_i) A_i)`. With per-token
  advantages each token is clipped against its own `A_t` (TRL `importance_sampling_level="sequence"`).
  Arguments and return as `ppo_clip_loss`.
  """
  _check_clip(eps_low, eps_high, dual_clip)
  mask, advantages, log_ratio = _prepare(logp, old_logp, advantages, mask)
  seq_log_ratio = _sequence_log_ratio(log_ratio, mask)
  ratio = jnp.exp(jnp.clip(seq_log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))
  ratio = jnp.broadcast_to(ratio, logp.shape)
  return _clipped_surrogate(ratio, advantages, mask, log_ratio, eps_low, eps_high, dual_clip)


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                    eps_low: float = 3e-4, eps_high: float = 4e-4,
                    dual_clip: Optional[float] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GSPO-token: `rho_t = sg[s_i] * pi(o_t) / sg[pi(o_t)]`, for per-token advantages.

  Value `s_i` on every token (so clipping decisions match `gspo`), gradient `s_i * grad log pi(o_t)`.
  Arguments and return as `ppo_clip_loss`.
  """
  _check_clip(eps_low, eps_high, dual_clip)
  mask, advantages, log_ratio = _prepare(logp, old_logp, advantages, mask)
  seq_log_ratio = jax.lax.stop_gradient(_sequence_log_ratio(log_ratio, mask))
  # logp - sg[logp] is 0 in value and carries the gradient of log pi(o_t); masked so padding stays finite.
  token_part = jnp.where(mask, logp - jax.lax.stop_gradient(logp), 0.0)
  ratio = jnp.exp(jnp.clip(seq_log_ratio + token_part, -MAX_LOG_RATIO, MAX_LOG_RATIO))
  return _clipped_surrogate(ratio, advantages, mask, log_ratio, eps_low, eps_high, dual_clip)


@POLICY_LOSSES.register("gmpo")
def gmpo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, *,
              eps_low: float = 0.4, eps_high: float = 0.4,
              dual_clip: Optional[float] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GMPO (geometric-mean policy optimization), following verl's `compute_policy_loss_geo_mean` ("geo_mean").

  Each token's log-ratio is clipped in log space on the side its advantage's sign makes harmful (A > 0:
  `min(lr, eps_high)`, A < 0: `max(lr, -eps_low)`, A == 0: 0; verl's `sgn * min(sgn lr, sgn clamp(lr))`),
  the sequence ratio is the geometric mean `rho_i = exp(mean_t clipped lr)`, and every valid token of row i
  carries `-Abar_i rho_i` with `Abar_i` the row's mean advantage (verl averages per-token advantages: only
  sequence-level advantages match the paper). With "seq-mean-token-mean" the loss is verl's
  `mean_i(-Abar_i rho_i)` (verl ignores `loss_agg_mode` and averages rows, empty rows included).

  `eps_low` / `eps_high` bound the LOG-ratio: the defaults 0.4 / 0.4 (verl's GMPO example, the paper's
  setting) allow token ratios in [e^-0.4, e^0.4] = [0.67, 1.49]; a PPO-style 0.2 / 0.28 is a narrower range.
  Any `eps_low >= 0` is valid. Dual clip (off by default; verl has none for GMPO) caps the row's loss at
  `-c Abar_i`, on the sequence ratio as for `gspo`: our extension.

  Metrics: `clip_frac` counts tokens whose log-ratio was clipped (their gradient is zero); verl's
  `pg_clipfrac` / `pg_clipfrac_lower` count tokens outside [-eps_low, eps_high] with A > 0 / A < 0, whichever
  side. `ratio_mean` is the mean sequence ratio over tokens. Arguments and return as `ppo_clip_loss`.
  """
  if eps_low < 0.0 or eps_high < 0.0:
    raise ValueError(f"GMPO needs eps_low >= 0 and eps_high >= 0 (log space), got {eps_low}, {eps_high}.")
  _check_dual_clip(dual_clip)
  mask, advantages, log_ratio = _prepare(logp, old_logp, advantages, mask)
  bounded = jnp.clip(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO)
  clipped_lr = jnp.where(advantages > 0, jnp.minimum(bounded, eps_high),
                         jnp.where(advantages < 0, jnp.maximum(bounded, -eps_low), 0.0))
  clipped_lr = jnp.where(mask, clipped_lr, 0.0)
  clipped = mask & (((advantages > 0) & (bounded > eps_high)) | ((advantages < 0) & (bounded < -eps_low)))
  lengths = jnp.maximum(mask.sum(-1, keepdims=True), 1)
  ratio = jnp.exp(clipped_lr.sum(-1, keepdims=True) / lengths)  # |mean| <= 20: no overflow
  seq_adv = jnp.where(mask, advantages, 0.0).sum(-1, keepdims=True) / lengths
  loss, dual = _dual_clip(-seq_adv * ratio, seq_adv, dual_clip)
  loss, dual, ratio = (jnp.broadcast_to(x, logp.shape) for x in (loss, dual, ratio))
  return jnp.where(mask, loss, 0.0), _metrics(mask, clipped, dual, ratio, log_ratio)
