"""Distribution metrics that score every reward head alike (rlkit/rewards/reward_heads.py, drm.py): 1-Wasserstein
and CRPS between predicted reward samples and true or observed ratings, and a bimodality detector with its AUC.
Used by the diffusion reward model's evaluation (DESIGN, ../shared/methods/llm.md §11).

  W1(P, Q)   = ∫_0^1 |F_P^{-1}(u) − F_Q^{-1}(u)| du      exact for two empirical distributions of any sizes
  CRPS(P, y) = E|X − y| − ½ E|X − X'|,   X, X' ~ P       the energy form; averaged over a row's observed y
  BC         = (g² + 1) / (k + 3 (n−1)² / ((n−2)(n−3)))   Sarle's bimodality coefficient, g the sample skewness
                                                         and k the sample excess kurtosis (both bias-corrected)

`is_bimodal` is BC > 5/9, Sarle's rule: 5/9 is the BC of the uniform distribution (the flattest unimodal
shape); a normal gives 1/3, two equal point masses 1. The rule is known to misfire on strongly skewed unimodal
samples (skewness raises BC) and on mixtures with very unequal weights (which look skewed, not bimodal), so use
it where the modes carry comparable mass, as in the annotator-disagreement data of §11. A row without spread
(a point model's samples) has undefined moments and counts as unimodal: BC = 0.

All functions but `bimodality_auc` (numpy) are jitted jnp; rows are independent.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

BIMODAL_THRESHOLD = 5.0 / 9.0


@jax.jit
def wasserstein1(pred_samples: jax.Array, true_samples: jax.Array) -> jax.Array:
  """W1 per row between the empirical distributions of pred [N, S] and true [N, M] -> [N].

  Both quantile functions are step functions with steps at i/S and j/M; on each interval of the merged grid
  they are constant, so the integral is a finite sum (for S = M, the mean |x_(i) − y_(i)| of sorted samples).
  """
  x = jnp.sort(jnp.asarray(pred_samples, jnp.float32), axis=1)
  y = jnp.sort(jnp.asarray(true_samples, jnp.float32), axis=1)
  s, m = x.shape[1], y.shape[1]
  edges = np.unique(np.concatenate([np.arange(s + 1) / s, np.arange(m + 1) / m]))     # static grid, float64
  mid, width = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
  ix, iy = np.floor(mid * s).astype(np.int32), np.floor(mid * m).astype(np.int32)
  return (jnp.abs(x[:, ix] - y[:, iy]) * width.astype(np.float32)).sum(axis=1)


@jax.jit
def crps(pred_samples: jax.Array, observed: jax.Array, mask=None) -> jax.Array:
  """CRPS per row [N] of the sample forecast pred [N, S] against observed ratings [N, M] (mask [N, M], 1:
  observed; default all), averaged over the row's observed ratings; NaN for a row with none. Lower is better;
  for a point forecast it is the mean absolute error.

  ½E|X − X'| uses all S² pairs (the CRPS of the empirical distribution itself), computed from sorted samples:
  Σ_{i,j} |x_i − x_j| = 2 Σ_i (2i − S + 1) x_(i).
  """
  x = jnp.asarray(pred_samples, jnp.float32)
  y = jnp.asarray(observed, jnp.float32)
  mask = jnp.ones_like(y) if mask is None else jnp.asarray(mask, jnp.float32)
  s = x.shape[1]
  spread = 2.0 * (jnp.sort(x, axis=1) * (2.0 * jnp.arange(s) - s + 1)).sum(axis=1) / s ** 2     # E|X − X'|
  error = jnp.abs(x[:, :, None] - jnp.where(mask > 0, y, 0.0)[:, None, :]).mean(axis=1)           # [N, M]
  per_rating = error - 0.5 * spread[:, None]
  count = mask.sum(axis=1)
  return jnp.where(count > 0, (per_rating * mask).sum(axis=1) / jnp.maximum(count, 1.0), jnp.nan)


@jax.jit
def bimodality_coefficient(samples: jax.Array) -> jax.Array:
  """Sarle's bimodality coefficient per row of samples [N, S] (S >= 4) -> [N]; 0 for a row without spread."""
  x = jnp.asarray(samples, jnp.float32)
  n = x.shape[1]
  if n < 4:
    raise ValueError(f"bimodality_coefficient needs at least 4 samples per row, got {n}.")
  d = x - x.mean(axis=1, keepdims=True)
  m2, m3, m4 = (jnp.mean(d ** p, axis=1) for p in (2, 3, 4))
  # Relative to the row's scale: float32 rounding leaves a constant row a spread of ~1e-7 |x|, not 0.
  flat = m2 <= (1e-6 * jnp.max(jnp.abs(x), axis=1)) ** 2 + 1e-30
  m2 = jnp.where(flat, 1.0, m2)
  skew = np.sqrt(n * (n - 1)) / (n - 2) * m3 / m2 ** 1.5
  kurt = (n - 1) / ((n - 2) * (n - 3)) * ((n + 1) * m4 / m2 ** 2 - 3 * (n - 1))
  bc = (skew ** 2 + 1) / (kurt + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))
  return jnp.where(flat, 0.0, bc)


@jax.jit
def is_bimodal(samples: jax.Array, threshold: float = BIMODAL_THRESHOLD) -> jax.Array:
  """[N] bool: Sarle's rule, bimodality coefficient > threshold (5/9; see the module docstring)."""
  return bimodality_coefficient(samples) > threshold


def bimodality_auc(scores, labels) -> float:
  """ROC AUC of scores [N] (e.g. `bimodality_coefficient`) for binary labels [N] (True: truly bimodal):
  P(score of a positive > score of a negative), ties counted ½ (the Mann–Whitney U statistic / (P · Q))."""
  scores = np.asarray(scores, np.float64).reshape(-1)
  labels = np.asarray(labels).reshape(-1).astype(bool)
  if scores.shape != labels.shape:
    raise ValueError(f"bimodality_auc: {scores.shape[0]} scores but {labels.shape[0]} labels.")
  pos, neg = scores[labels], scores[~labels]
  if not len(pos) or not len(neg):
    raise ValueError("bimodality_auc needs at least one positive and one negative label; "
                     f"got {len(pos)} positive and {len(neg)} negative.")
  greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
  return float(greater / (len(pos) * len(neg)))
