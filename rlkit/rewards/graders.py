"""MiMo-V2.6's graders and behaviour shaping (methods/systems.md §4), as pure functions over a batch's groups.

Groups are `capacity` contiguous rows (a prompt's samples), as everywhere in rlkit. `valid` (optional [N] bool)
marks real rows; padding rows get advantage 0 and are left out of every group statistic.

  grs_rewards(test, solution, behaviour)    GRS: R = R_test * S_sol * S_beh (each in [0, 1])
  gar_advantages(rewards, passed, quality, capacity, lam_cap)
                                            GAR, for groups with mixed outcomes: A = R - mean(R); over the
                                            passing set P, lam = sum_P A / sum_P f*A and A'_i = lam*f_i*A_i
                                            (which keeps sum_P A); lam capped at lam_cap, then the group
                                            re-centred to mean 0. A group whose quality is unusable (outside
                                            (0, 1] for a passing row) or whose sum_P f*A is not positive keeps
                                            A, as does a group that all pass or all fail.
  length_penalties(lengths, passed, capacity, pass_rate_min, anchor_quantile, coef)
                                            a group-relative length penalty for successful rollouts, in groups
                                            whose pass rate is at least pass_rate_min: -coef * (L - L_ref) /
                                            L_ref for a passing row longer than L_ref, the anchor_quantile
                                            quantile of the group's passing lengths (the released code's 0.3);
                                            the formula past the anchor is DESIGN (the sources give the anchor)
  flag_weights(advantages, flagged, mask, amplify)
                                            segment-level flags (format errors, failed tool calls) with mass
                                            conservation: in a row of positive advantage flagged tokens get
                                            weight 0, in a row of negative advantage weight `amplify`; each
                                            row's weights are then rescaled so that its sum over the loss mask
                                            is unchanged (the released code's reason: a bad trajectory set to
                                            -1 injects net negative mass and, without KL or entropy terms,
                                            lengthens outputs). A positive row flagged everywhere gets 0.
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp


def grs_rewards(test, solution, behaviour):
  """GRS: the product of the test pass rate, the solution score and the behaviour score."""
  return jnp.asarray(test) * jnp.asarray(solution) * jnp.asarray(behaviour)


def _groups(x, capacity: int):
  return jnp.reshape(jnp.asarray(x), (-1, capacity))


def _valid(valid, n: int, capacity: int):
  return jnp.ones((n // capacity, capacity), bool) if valid is None else _groups(valid, capacity)


def gar_advantages(rewards, passed, quality, capacity: int, lam_cap: float, valid: Optional[jnp.ndarray] = None):
  """GAR's [N] advantages (module docstring). `passed` [N] bool is the passing set P, `quality` [N] the grader's
  f_i (read on passing rows only)."""
  n = jnp.shape(rewards)[0]
  r = _groups(rewards, capacity).astype(jnp.float32)
  ok = _valid(valid, n, capacity)
  p = _groups(passed, capacity) & ok
  f = _groups(quality, capacity).astype(jnp.float32)
  count = jnp.maximum(ok.sum(1, keepdims=True), 1)
  a = jnp.where(ok, r - jnp.where(ok, r, 0).sum(1, keepdims=True) / count, 0.0)
  num = jnp.where(p, a, 0).sum(1, keepdims=True)
  den = jnp.where(p, f * a, 0).sum(1, keepdims=True)
  mixed = p.any(1, keepdims=True) & (ok & ~p).any(1, keepdims=True)
  usable = jnp.all(~p | ((f > 0) & (f <= 1)), axis=1, keepdims=True) & (den > 0)
  lam = jnp.minimum(num / jnp.where(den > 0, den, 1.0), lam_cap)
  shaped = jnp.where(p, lam * f * a, a)
  shaped = jnp.where(ok, shaped - jnp.where(ok, shaped, 0).sum(1, keepdims=True) / count, 0.0)
  return jnp.where(mixed & usable, shaped, a).reshape(n)


def length_penalties(lengths, passed, capacity: int, pass_rate_min: float, anchor_quantile: float, coef: float,
                     valid: Optional[jnp.ndarray] = None):
  """[N] penalties (<= 0) for successful rows longer than their group's anchor length (module docstring)."""
  n = jnp.shape(lengths)[0]
  length = _groups(lengths, capacity).astype(jnp.float32)
  ok = _valid(valid, n, capacity)
  p = _groups(passed, capacity) & ok
  rate = p.sum(1, keepdims=True) / jnp.maximum(ok.sum(1, keepdims=True), 1)
  anchor = jnp.nanquantile(jnp.where(p, length, jnp.nan), anchor_quantile, axis=1, keepdims=True)
  anchor = jnp.where(jnp.isfinite(anchor), jnp.maximum(anchor, 1.0), 1.0)
  over = jnp.maximum(length - anchor, 0.0) / anchor
  return jnp.where(p & (rate >= pass_rate_min), -coef * over, 0.0).reshape(n)


def flag_weights(advantages, flagged, mask, amplify: float):
  """[N, R] advantages with flagged tokens masked (positive rows) or amplified (negative rows), each row's
  mass over `mask` conserved (module docstring)."""
  adv = jnp.asarray(advantages, jnp.float32)
  m = jnp.asarray(mask, bool)
  fl = jnp.asarray(flagged, bool) & m
  row = jnp.where(m, adv, 0).sum(1, keepdims=True)   # the row's sign decides (its tokens share one sign)
  w = jnp.where(fl, jnp.where(row > 0, 0.0, jnp.where(row < 0, amplify, 1.0)), 1.0)
  total = m.sum(1, keepdims=True).astype(jnp.float32)
  weighted = jnp.where(m, w, 0).sum(1, keepdims=True)
  scale = jnp.where(weighted > 0, total / jnp.where(weighted > 0, weighted, 1.0), 0.0)
  return jnp.where(m, adv * w * scale, adv)
