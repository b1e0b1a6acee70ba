"""KV-cache sampler: batched generation that returns exactly what RL needs, as a `Rollout`.

`generate` is one jitted program: prefill the (left-padded) prompts into a KV cache and sample each row's
first token, then a `lax.while_loop` that runs the model on the last sampled token against the cache and
samples the next. It is `rlkit.rollout.resumable`'s prefill + decode_until fused into one call, the same
tokens and log-probs bit for bit, without the forward pass of the last token that resuming needs (an MoE
model runs it, to record that token's routing). Shapes are static (cache length = prompt length +
max_new_tokens), the loop exits early once every row has emitted a stop token, and each decode step costs
one token's forward pass: the prefix is never recomputed. On CPU the call first makes features-major copies
of the dense weights (`decode_layout.decode_params`, the decode layout): XLA:CPU's matmuls of a few rows by a
weight run twice as fast per layer that way, at the cost of one more copy of those weights while sampling
runs.

The log-probability returned for each sampled token is taken under the distribution it was actually drawn
from (`rlkit.rollout.distribution`, re-exported here): `log_softmax(processed logits)` after temperature,
top-k and top-p (the nucleus is renormalised); for greedy decoding the model's own log-probability at
temperature 1. `rlkit.rollout.scoring` re-scores sequences with the same processing, which is what the
trainer/sampler mismatch metric compares.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from rlkit.core.types import Rollout
from rlkit.models.transformer import Transformer
from rlkit.rollout.distribution import (SamplingConfig, nucleus_reference, nucleus_threshold,  # noqa: F401
                                        processed_logits, processed_logprobs, sample_categorical)
from rlkit.rollout.resumable import (NOISE_STREAM, decode_steps, prefill_state, to_rollout,  # noqa: F401
                                     with_decode_layout)

Array = jax.Array


def generate(model: Transformer, params: Any, prompt: Array, prompt_mask: Array, key: Array,
             cfg: SamplingConfig, group_ids: Optional[Array] = None,
             perturb: Optional[Callable[[Array, Array], Array]] = None) -> Rollout:
  """Samples `cfg.max_new_tokens` tokens (at most) for each left-padded prompt row.

  Args:
    model: the `Transformer` module (static).
    params: its parameters (may be sharded; the batch is sharded by the caller).
    prompt: [B, P] int32, left-padded so the last column is each row's last prompt token.
    prompt_mask: [B, P] bool, True on real prompt tokens.
    key: PRNG key; the uniforms of all steps are `uniform(key, (max_new_tokens, B))`, drawn before the
      decode loop (inside it XLA:CPU ran the generator as a nested loop, ~6% of an S decode step).
    cfg: a `SamplingConfig`.
    group_ids: optional [B] int32 stored in the Rollout (default arange(B)).
    perturb: optional hashable (static) `perturb(logits [B, V] float32, key_i) -> logits` applied to the raw
      logits of every step i before `processed_logits` (`rlkit.rollout.mismatch` simulates an inference
      engine with it). Tokens are drawn from, and `Rollout.logprobs` are taken under, the perturbed
      distribution. key_i = fold_in(fold_in(key, NOISE_STREAM), i): the uniforms above are those of the
      unperturbed run, and None leaves the decode loop as it is.
  Returns:
    A `Rollout`; for MoE models `extras["routed_experts"]` is [B, P+R, L_moe, k] (the chosen experts) and
    `extras["routed_weights"]` their combine weights (float32).
  """
  if prompt.ndim != 2 or prompt.shape != prompt_mask.shape:
    raise ValueError(f"prompt {prompt.shape} and prompt_mask {prompt_mask.shape} must both be [B, P].")
  if group_ids is None:
    group_ids = jnp.arange(prompt.shape[0], dtype=jnp.int32)
  return _generate(model, cfg, params, jnp.asarray(prompt, jnp.int32), jnp.asarray(prompt_mask, bool), key,
                   jnp.asarray(group_ids, jnp.int32), perturb)


@functools.partial(jax.jit, static_argnums=(0, 1, 7))
def _generate(model: Transformer, cfg: SamplingConfig, params, prompt, prompt_mask, key, group_ids,
              perturb=None):
  # Features-major copies of the dense weights for the decode matmuls on CPU (rlkit/models/decode_layout.py),
  # made once per call; they hold one more copy of those weights while sampling runs.
  variables = {"params": with_decode_layout(params, model.cfg)}
  state = prefill_state(model, variables, prompt, prompt_mask, key, cfg.max_new_tokens, cfg.pad_id)
  # Nothing resumes from this state, so the last drawn token is not fed (an MoE model feeds it anyway).
  state = decode_steps(model, variables, state, cfg, perturb, feed_last=False)
  return to_rollout(state, prompt, prompt_mask, group_ids)
