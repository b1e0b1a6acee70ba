"""Pytree types that flow through one RL step (see DESIGN.md, "One RL step, as data").

Everything downstream of the sampler (rewards, advantages, objectives, off-policy corrections) reads these
fields and never re-derives them: in particular `logprobs` are the log-probabilities of the distribution the
sampler actually drew from, which is what importance weights and mismatch metrics need.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Rollout:
  """A batch of sampled completions.

  Attributes:
    prompt: [N, P] int32 prompt tokens, left-padded (real tokens end at column P-1).
    prompt_mask: [N, P] bool, True on real prompt tokens.
    response: [N, R] int32 sampled tokens; after the stop token the row holds `pad_id`.
    response_mask: [N, R] bool, True on generated tokens up to and including the stop token.
    logprobs: [N, R] float32 log-probability of each sampled token under the distribution it was drawn
      from (after temperature / top-k / top-p); 0 where `response_mask` is False.
    lengths: [N] int32 number of generated tokens (the sum of `response_mask`).
    finished: [N] bool, True where the row ended with a stop token (False: cut by `max_new_tokens`).
    group_ids: [N] int32 index of the prompt a row was sampled for (G rows share one id).
    extras: optional named arrays, e.g. "routed_experts" [N, P+R, L_moe, k] for MoE routing replay.
  """
  prompt: jax.Array
  prompt_mask: jax.Array
  response: jax.Array
  response_mask: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  finished: jax.Array
  group_ids: jax.Array
  extras: dict[str, Any] = flax.struct.field(default_factory=dict)

  @property
  def tokens(self) -> jax.Array:
    """[N, P+R] prompt followed by response: the sequence the trainer re-scores."""
    return jnp.concatenate([self.prompt, self.response], axis=1)

  @property
  def attention_mask(self) -> jax.Array:
    """[N, P+R] True on every real token of `tokens`."""
    return jnp.concatenate([self.prompt_mask, self.response_mask], axis=1)

  @property
  def num_rows(self) -> int:
    return self.prompt.shape[0]
