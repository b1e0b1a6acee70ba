"""Calibrated importance sampling: our confidence-calibrated TIS (registry name `calibrated`; OUR DESIGN,
methods/llm.md §9) and the published rule (registry name `cis`; kzhao5/CIS-RL, methods/primary-sources.md),
both in correction.py's registry beside token-TIS (`rollout_correction`).

No peer implements this; it is rlkit's design, built from two pieces of prior art: Dynamic Vocabulary Pruning's
bound that the sampler/trainer log-prob mismatch of a token scales like `(1 - p)` (vanishes for confident
tokens, is largest in the tail), and TIS/MIS-style truncation and rejection (verl's rollout correction). The
idea: measure each token's log ratio in units of the mismatch *expected* for a token of that confidence, so one
threshold is tight on confident tokens and loose in the tail, instead of verl's single ratio window.

Per corrected token t (policy row, on the loss mask), with `log_rho_t = old_logp - rollout_logp` clamped to
[-20, 20] and `p_t = exp(rollout_logp)` (the sampler's probability of the token it drew):

  s_t    = sigma * (1 - p_t) + eps                           expected mismatch scale (eps: floor for p -> 1)
  w_t    = exp(min(log_rho_t, tau_hi * s_t))                 truncation in calibrated units (never from below)
  rej_t  = log_rho_t < -tau_lo * s_t                         token rejection: abnormally under-weighted token
  seq    rejected if  sum_t rej_t / |T_row| > max_masked_frac  (then every token of the row is rejected)
  keep_t = not rej_t and the row is not rejected;            weight = w_t on kept tokens, 0 on rejected ones

Calibration of sigma (state). `r_t = |log_rho_t| / (1 - p_t + eps)` is one token's mismatch in sigma units; the
batch estimate is `m = median_t r_t` over the batch's corrected tokens. Choices:

  * Order: this batch's weights use sigma from BEFORE the batch; sigma then absorbs the batch. The weights never
    depend on a statistic of the very tokens they weight, and the first iteration uses `sigma_init`.
  * The median is over all corrected tokens, before rejection (§9: "over response tokens"). A median over the
    kept tokens only would drop the upper tail each step, bias sigma low, reject more next step, and so on: a
    self-reinforcing shrink. The median already ignores the (few) outliers that rejection targets.
  * Bias-corrected EMA (Adam's debiasing): `ema_n = decay * ema_{n-1} + (1 - decay) * m_n` from `ema_0 = 0`,
    `sigma_n = ema_n / (1 - decay^n)`. With decay 0.99 a plain EMA started at sigma_init would keep ~60% of
    sigma_init after 50 iterations (a whole default RL stage), so sigma_init would be the real hyperparameter;
    debiased, sigma after the first batch is that batch's median and then averages over ~1/(1-decay) batches.
    A batch without corrected tokens leaves the state unchanged.
  * sigma_init = 0.1 (used for the first batch only): for a tail token (p ~ 0) it truncates above
    rho = e^0.36 = 1.43 and rejects below e^-0.72 = 0.49, the width of verl's default ratio window [0.5, 2];
    for a confident token (p ~ 1, s = eps) it truncates above e^0.06 and rejects below e^-0.12, which a
    numerically matched engine (|log_rho| ~ 1e-3 there) never reaches.

State: {"sigma_ema": ema_n, "sigma_updates": n} (float32 scalars, checkpointed with the stage).

Defaults (§9): tau_hi = 3, tau_lo = 6, eps = 0.02, max_masked_frac = 0.2, decay = 0.99.

The published rule (`cis_weights`; the public code kzhao5/CIS-RL, `cis/operator.py` and its AReaL patch, read for
its semantics). With k_t = p_t / q_t the trainer/sampler ratio of the sampled token and p_t = exp(old_logp) the
trainer's probability of it (detached, as every weight here):

  f_t = min(k_t, 1 + lambda * max(1 - p_t, kappa)),   defaults lambda = 2.3, kappa = 5e-3,

replacing token-TIS's min(k_t, C): the cap tightens as the trainer grows confident (1 + lambda kappa = 1.0115 at
p -> 1, 1 + lambda at p -> 0). Only the upper side is truncated and nothing is rejected (keep = the mask). With
kappa <= 1 the cap is at most 1 + lambda, so f_t <= min(k_t, C) for any C >= 1 + lambda; lambda = 0 gives
min(k_t, 1). Where ours calibrates a scale sigma from the batches and rejects, this rule is stateless and
scales its cap with the trainer's p (ours: the sampler's p). As the public code, a token whose log ratio is not
finite weighs 1; unlike it, the log ratio is clamped to [-20, 20] before the exp (every correction here does),
which changes a weight only below e^-20.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

SAFETY_BOUND = 20.0


def init_state() -> dict:
  """The calibration state before any batch: an empty debiased EMA."""
  return {"sigma_ema": np.float32(0.0), "sigma_updates": np.float32(0.0)}


def current_sigma(state: dict, sigma_init: float, decay: float) -> jax.Array:
  """sigma for the next batch: sigma_init before any update, else the debiased EMA `ema / (1 - decay^n)`."""
  n = jnp.asarray(state["sigma_updates"], jnp.float32)
  ema = jnp.asarray(state["sigma_ema"], jnp.float32)
  debiased = ema / jnp.maximum(1.0 - jnp.power(jnp.float32(decay), n), 1e-12)
  return jnp.where(n > 0, debiased, jnp.float32(sigma_init))


def expected_scale(rollout_logp: jax.Array, sigma: jax.Array, eps: float) -> jax.Array:
  """`s_t = sigma * (1 - p_t) + eps` with `p_t = exp(rollout_logp)` (clipped to [0, 1] against rounding)."""
  p = jnp.clip(jnp.exp(rollout_logp.astype(jnp.float32)), 0.0, 1.0)
  return sigma * (1.0 - p) + eps


def calibrated_weights(log_ratio, rollout_logp, mask, sigma, *, tau_hi, tau_lo, eps, max_masked_frac):
  """Truncated weights and the keep mask of the calibrated rule, `[N, R]` each.

  `log_ratio` is trainer minus sampler log-probs, `mask` the corrected tokens. Returns (w [N, R] float32 before
  rejection, keep [N, R] bool, truncated [N, R] bool, token_rejected [N, R] bool, row_rejected [N] bool);
  everything is False / 1 off `mask`.
  """
  lr = jnp.clip(jnp.where(mask, log_ratio, 0.0), -SAFETY_BOUND, SAFETY_BOUND)
  s = expected_scale(rollout_logp, sigma, eps)
  truncated = mask & (lr > tau_hi * s)
  w = jnp.where(mask, jnp.exp(jnp.minimum(lr, tau_hi * s)), 1.0)
  token_rejected = mask & (lr < -tau_lo * s)
  n = mask.sum(-1)
  frac = token_rejected.sum(-1) / jnp.maximum(n, 1)
  row_rejected = (n > 0) & (frac > max_masked_frac)
  keep = mask & ~token_rejected & ~row_rejected[:, None]
  return w, keep, truncated, token_rejected, row_rejected


def batch_sigma(log_ratio, rollout_logp, mask, eps) -> tuple[jax.Array, jax.Array]:
  """(`median_t |log_rho_t| / (1 - p_t + eps)` over `mask`, whether `mask` has any token)."""
  lr = jnp.clip(jnp.where(mask, log_ratio, 0.0), -SAFETY_BOUND, SAFETY_BOUND)
  p = jnp.clip(jnp.exp(rollout_logp.astype(jnp.float32)), 0.0, 1.0)
  r = jnp.abs(lr) / (1.0 - p + eps)
  has_any = mask.any()
  median = jnp.nanmedian(jnp.where(mask, r, jnp.nan))
  return jnp.where(has_any, median, 0.0), has_any


def update_state(state: dict, median: jax.Array, has_any: jax.Array, decay: float) -> dict:
  """One debiased-EMA step with this batch's median; unchanged when the batch had no corrected token."""
  ema = jnp.asarray(state["sigma_ema"], jnp.float32)
  n = jnp.asarray(state["sigma_updates"], jnp.float32)
  return {"sigma_ema": jnp.where(has_any, decay * ema + (1.0 - decay) * median, ema),
          "sigma_updates": jnp.where(has_any, n + 1.0, n)}


# ---------------------------------------------------------------------------------------------------------------
# The published rule (registry name `cis`)

def cis_weights(log_ratio, train_logp, mask, *, lam, kappa):
  """The published rule's weights (module docstring), `[N, R]` each: (f float32, 1 off `mask`; truncated bool,
  where the cap bound). `log_ratio` is trainer minus sampler log-probs, `train_logp` the trainer's."""
  lr = jnp.where(mask & jnp.isfinite(log_ratio), log_ratio, 0.0)
  p = jnp.clip(jnp.exp(train_logp.astype(jnp.float32)), 0.0, 1.0)
  cap = 1.0 + lam * jnp.maximum(1.0 - p, kappa)
  k = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
  return jnp.where(mask, jnp.minimum(k, cap), 1.0), mask & (k > cap)
