"""Per-token estimators of KL(pi_theta || pi_ref) from the sampled tokens' log-probs (Schulman's k1, k2, k3).

With `d = log pi_ref(o_t) - log pi_theta(o_t)` and `o_t ~ pi_theta`:

  k1 = -d                      unbiased, can be negative
  k2 = d^2 / 2                 biased (second-order accurate), always >= 0
  k3 = exp(d) - d - 1          unbiased (E[exp(d)] = 1), always >= 0; = 0 iff logp == ref_logp
  abs = |d|                    not a KL estimator (biased, >= 0); verl's "abs" penalty
  k1+, k3+                     value of k1 / k3, gradient of k2:  k2 - sg[k2] + sg[k]   (straight-through)

Why the "+" forms (verl `kl_penalty`, names ending in "+"): k1 and k3 are unbiased for the KL's VALUE, but the
gradient of a per-token estimate is not an estimate of the KL's gradient; k2's gradient, `(log pi - log
pi_ref) grad log pi`, is (its expectation under o ~ pi is grad KL(pi || pi_ref)). The straight-through form
keeps the logged value of k1 / k3 and back-propagates k2's gradient.

verl names: "kl" = k1, "mse" = k2, "low_var_kl" = k3, "abs", "k1+", "k3+" (only the names above are
registered here). We follow verl's documented "+" semantics (docs/algo/ppo.md, `kl_loss_type`); at b178a3c its
`kl_penalty` passes the name with the "+" on to `kl_penalty_forward`, which knows no such name and raises.

The KL term enters the per-token loss as `+ beta * k` (methods/llm.md §12, "Shared pieces"); reduce it with
`aggregation.py` like the policy loss. `ref_logp` passes through `stop_gradient`.

Clamping (peers disagree, methods/llm.md §12): k3 clamps `d` to [-20, 20] (verl's inner clamp) so `exp` stays
finite in float32; k3 stays >= 0 because `exp(x) - x - 1 >= 0` for every x. We do not clamp the result
(verl also clamps it to +-10, OpenRLHF clamps k1, k2 and k3 to +-10): a result clamp silences the penalty on
exactly the tokens that drifted furthest; the gradient is only zeroed beyond |d| = 20. k1, k2 and abs are not
clamped (they are linear and quadratic in d, so they cannot overflow). k3+ takes its value from the clamped k3
and its gradient from the unclamped k2, so its gradient is never zeroed (verl's k3+ value is also clamped to
+-10).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rlkit.core.registry import Registry

KLFn = Callable[[jax.Array, jax.Array], jax.Array]

KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")

K3_MAX_LOG_RATIO = 20.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`log pi - log pi_ref` per token, `[N, T] -> [N, T]`."""
  return logp - jax.lax.stop_gradient(ref_logp)


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`(log pi - log pi_ref)^2 / 2` per token, `[N, T] -> [N, T]`."""
  return 0.5 * jnp.square(logp - jax.lax.stop_gradient(ref_logp))


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`pi_ref/pi - log(pi_ref/pi) - 1` per token, log-ratio clamped to +-20, `[N, T] -> [N, T]`."""
  d = jnp.clip(jax.lax.stop_gradient(ref_logp) - logp, -K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
  return jnp.expm1(d) - d  # expm1 keeps k3 accurate (and exactly 0 at d == 0) when d is tiny.


@KL_ESTIMATORS.register("abs")
def kl_abs(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """`|log pi - log pi_ref|` per token (verl "abs"), `[N, T] -> [N, T]`."""
  return jnp.abs(logp - jax.lax.stop_gradient(ref_logp))


def _k2_gradient(value: jax.Array, logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  k2 = kl_k2(logp, ref_logp)
  return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value)


@KL_ESTIMATORS.register("k1+")
def kl_k1_plus(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Value of k1, gradient of k2 (verl "k1+"), `[N, T] -> [N, T]`."""
  return _k2_gradient(kl_k1(logp, ref_logp), logp, ref_logp)


@KL_ESTIMATORS.register("k3+")
def kl_k3_plus(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Value of k3 (clamped as `kl_k3`), gradient of k2 (verl "k3+"), `[N, T] -> [N, T]`."""
  return _k2_gradient(kl_k3(logp, ref_logp), logp, ref_logp)


def kl_penalty(name: str, logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token KL estimate `[N, T]` from the estimator registered as `name` (k1, k2, k3, abs, k1+, k3+)."""
  return KL_ESTIMATORS.get(name)(logp, ref_logp)
