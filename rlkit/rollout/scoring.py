"""Re-scoring sampled sequences with the trainer's model: per-token log-probs of a `Rollout`'s response.

The trainer computes `logp` of each response token with one forward pass over prompt + response; the
logits at position t predict token t+1, so the response tokens are scored by positions P-1 .. P+R-2.
With the same `SamplingConfig` processing the result is directly comparable to `Rollout.logprobs`
(the sampler/trainer mismatch metric), and for MoE the sampler's routing can be replayed.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from rlkit.core.types import Rollout
from rlkit.models.transformer import ModelOutput, Transformer
from rlkit.objectives import token_logprobs
from rlkit.rollout.sampler import SamplingConfig, processed_logits

Array = jax.Array


def response_forward(model: Transformer, params: Any, rollout: Rollout,
                     replay_routing: bool = False) -> tuple[Array, ModelOutput]:
  """Forward over prompt + response. Returns (response logits [N, R, V], the model output)."""
  routed = rollout.extras.get("routed_experts") if replay_routing else None
  out = model.apply({"params": params}, rollout.tokens, None, rollout.attention_mask, None, routed,
                    method=Transformer.forward)
  p, r = rollout.prompt.shape[1], rollout.response.shape[1]
  return out.logits[:, p - 1:p + r - 1], out


def response_logprobs(model: Transformer, params: Any, rollout: Rollout,
                      cfg: Optional[SamplingConfig] = None, replay_routing: bool = False) -> Array:
  """[N, R] log-probs of the response tokens, zero outside `response_mask`, under the logits processed as
  the sampler would (temperature, top-k, top-p; plain softmax if cfg is None)."""
  logits, _ = response_forward(model, params, rollout, replay_routing)
  logp = token_logprobs(logits if cfg is None else processed_logits(logits, cfg), rollout.response)
  return jnp.where(rollout.response_mask, logp, 0.0)
