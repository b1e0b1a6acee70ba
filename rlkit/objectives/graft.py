"""GRAFT (OUR DESIGN, methods/llm.md §8): two heterogeneous policies trade successful trajectories for the
prompts one of them cannot solve.

For a prompt whose group is all-fail for model A while model B has successes, up to k of B's successful
rows join A's group ("peer" rows, with B's behaviour log-probs). A re-scores them (its old log-probs) and
trains on them with

  token weight   w_t = min(rho_t, C),   rho_t = exp(logp_A(y_t) - logp_B(y_t))    (truncated IS; C = 0: w = 1)
  row rejection  keep the row iff g_lo <= exp(mean_t log rho_t) <= g_hi            (verl's geometric rejection)
  positive only  keep a peer row only if its advantage is > 0                      (F-TIS's filter)

and advantages recomputed on the augmented group (the group estimator over its valid rows). The PPO ratio of
peer rows is A's own new / old ratio; the A/B mismatch enters only through w (no clip on it). Log-ratios are
clamped to [-20, 20] in log space, so long rows stay finite.

`rescue` picks the rows; `graft_weights` computes w and the row mask. The exchange itself (Samples, rewards)
is in `rlkit/train/graft_stage.py`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MAX_LOG_RATIO = 20.0


def rescue(own_correct: np.ndarray, peer_correct: np.ndarray, group_size: int, k: int) -> np.ndarray:
  """[groups, k] int64 indices (into the peer's rows) of the rows grafted into each group, -1 where none.

  A group gets peer rows only if none of its own rows is correct and the peer's group has a correct row; the
  peer's first k correct rows of that group, in order.
  """
  own = np.asarray(own_correct, bool).reshape(-1, group_size)
  peer = np.asarray(peer_correct, bool).reshape(-1, group_size)
  out = np.full((own.shape[0], k), -1, np.int64)
  for g in np.flatnonzero(~own.any(1) & peer.any(1)):
    rows = g * group_size + np.flatnonzero(peer[g])[:k]
    out[g, :len(rows)] = rows
  return out


@jax.jit
def _log_ratio(logp_self, logp_peer, mask):
  return jnp.clip(jnp.where(mask, logp_self - logp_peer, 0.0), -MAX_LOG_RATIO, MAX_LOG_RATIO)


def graft_weights(logp_self: jax.Array, logp_peer: jax.Array, mask: jax.Array, cap: float = 2.0,
                  geo_low: float = 0.5, geo_high: float = 2.0) -> tuple[jax.Array, jax.Array]:
  """Stop-gradient token weights `[N, T]` and kept rows `[N]` of foreign rows (`mask` [N, T] their tokens).

  :param cap: truncation C of the token ratio; 0: no weights (w = 1, naive exchange).
  :param geo_low, geo_high: bounds of the geometric-mean ratio; geo_high = 0: no rejection.
  :returns: (w, keep): w is 0 off `mask` and on rejected rows; keep is False on rows without tokens.
  """
  mask = jnp.asarray(mask, bool)
  lr = _log_ratio(logp_self, logp_peer, mask)
  n = mask.sum(-1)
  keep = n > 0
  if geo_high > 0:
    geo = lr.sum(-1) / jnp.maximum(n, 1)
    keep = keep & (geo >= jnp.log(geo_low)) & (geo <= jnp.log(geo_high))
  w = jnp.minimum(jnp.exp(lr), cap) if cap > 0 else jnp.ones_like(lr)
  return jax.lax.stop_gradient(jnp.where(mask & keep[:, None], w, 0.0)), keep
