"""Per-token estimators of KL(pi_theta || pi_ref) from the sampled tokens' log-probs (Schulman's k1, k2, k3).

With `d = log pi_ref(o_t) - log pi_theta(o_t)` and `o_t ~ pi_theta`:

  k1 = -d                      unbiased, can be negative
  k2 = d^2 / 2                 biased (second-order accurate), always >= 0
  k3 = exp(d) - d - 1          unbiased (E[exp(d)] = 1), always >= 0; = 0 iff logp == ref_logp

The KL term enters the per-token loss as `+ beta * k` (methods/llm.md §12, "Shared pieces"); reduce it with
`aggregation.py` like the policy loss. `ref_logp` passes through `stop_gradient`.

Clamping (peers disagree, methods/llm.md §12): k3 clamps `d` to [-20, 20] (verl's inner clamp) so `exp` stays
finite in float32; k3 stays >= 0 because `exp(x) - x - 1 >= 0` for every x. We do not clamp the result
(verl also clamps it to +-10, OpenRLHF clamps k1, k2 and k3 to +-10): a result clamp silences the penalty on
exactly the tokens that drifted furthest; the gradient is only zeroed beyond |d| = 20. k1 and k2 are not
clamped (they are linear and quadratic in d, so they cannot overflow).
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


def kl_penalty(name: str, logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token KL estimate `[N, T]` from the estimator registered as `name` ("k1", "k2", "k3")."""
  return KL_ESTIMATORS.get(name)(logp, ref_logp)
