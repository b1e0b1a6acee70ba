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

from rlkit.core.labels import ROW_SOURCE, ROW_SOURCES, SEGMENT_KINDS  # noqa: F401  (re-exported)


def _is_array(x) -> bool:
  return hasattr(x, "shape") and hasattr(x, "dtype")


def single_turn_segments(mask: jax.Array) -> jax.Array:
  """[N, R] int32 segment kinds of single-turn responses: `policy` where `mask`, else `pad`."""
  return jnp.where(mask, SEGMENT_KINDS["policy"], SEGMENT_KINDS["pad"]).astype(jnp.int32)


@flax.struct.dataclass
class Rollout:
  """A batch of sampled trajectories: one prompt and one response region per row, token in / token out.

  The response region holds everything after the prompt, in order: for a single-turn row the sampled
  completion; for a multi-turn row the policy's turns interleaved with what the environment or a tool fed
  back (observations), exactly as the model saw them. Two masks tell the two roles apart: `response_mask`
  is what the model attends to (every real token), `loss_mask` what is trained on (the tokens the policy
  sampled). For single-turn rows they are equal.

  Attributes:
    prompt: [N, P] int32 prompt tokens, left-padded (real tokens end at column P-1).
    prompt_mask: [N, P] bool, True on real prompt tokens.
    response: [N, R] int32 response-region tokens; after a row's end it holds `pad_id`.
    response_mask: [N, R] bool, the attended mask: True on every real token of the response region (sampled
      tokens up to and including the stop token, and any inserted observation tokens).
    logprobs: [N, R] float32 log-probability of each sampled token under the distribution it was drawn
      from (after temperature / top-k / top-p); 0 where `loss_mask` is False.
    lengths: [N] int32 attended response length (the sum of `response_mask`).
    finished: [N] bool, True where the row ended with a stop token (False: cut by the token budget).
    group_ids: [N] int32 index of the prompt a row was sampled for (G rows share one id).
    extras: optional named arrays, e.g. "routed_experts" [N, P+R, L_moe, k] for MoE routing replay.
    loss_mask: [N, R] bool, the trained mask: True on the tokens the policy sampled (default: `response_mask`).
    segment_ids: [N, R] int32 `SEGMENT_KINDS` id of each token (default: `policy` on the response, `pad` after).
    turn_ids: [N, R] int32 the turn a token belongs to, from 0 (default: all 0).
    num_calls: [N] int32 model calls (decode segments) that produced the row (default: 1).
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
  loss_mask: Any = None
  segment_ids: Any = None
  turn_ids: Any = None
  num_calls: Any = None

  def __post_init__(self):
    # Single-turn defaults, filled at construction (never during pytree unflattening, which passes every field).
    mask = self.response_mask
    if not _is_array(mask):
      return
    if self.loss_mask is None:
      object.__setattr__(self, "loss_mask", mask)
    if self.segment_ids is None:
      object.__setattr__(self, "segment_ids", single_turn_segments(mask))
    if self.turn_ids is None:
      object.__setattr__(self, "turn_ids", jnp.zeros(mask.shape, jnp.int32))
    if self.num_calls is None:
      object.__setattr__(self, "num_calls", jnp.ones(mask.shape[:1], jnp.int32))

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


@flax.struct.dataclass
class TrainBatch:
  """What the jitted update step consumes (one iteration's rows, or a minibatch of them).

  Rows are laid out group by group, `capacity` rows per group (`group_ids` says which group a row is in);
  a group with fewer real rows is filled with padding rows whose masks are all False, so augmenters can add
  rows without changing the static shapes.

  Attributes:
    tokens: [N, P+R] int32 prompt followed by response.
    attention_mask: [N, P+R] bool, True on every token the model attends to.
    loss_mask: [N, R] bool, True on response tokens that are trained on. Separate from the attention mask: a
      token can be attended to (it is part of the context of later tokens: an observation, a rejected token)
      but not trained on. Every loss term, correction, advantage and training metric reads this mask; the
      attended mask is for context only.
    old_logp: [N, R] float32 the trainer's log-probs before the update (the PPO ratio's denominator), under
      the sampler's processed distribution (temperature, top-k, top-p).
    rollout_logp: [N, R] float32 the sampler's behaviour log-probs (`Rollout.logprobs`): what off-policy
      corrections between sampler and trainer consume. Equals old_logp up to numerics when on-policy.
    advantages: [N, R] float32 per-token advantages (stop-gradient).
    token_weights: [N, R] float32 stop-gradient weights multiplying the per-token loss (ones by default).
    group_ids: [N] int32, unique within the iteration.
    row_source: [N] int32 `ROW_SOURCES` id.
    ref_logp: optional [N, R] float32 reference-model log-probs (KL penalty).
    extras: named arrays for methods: "routed_experts" [N, P+R, L_moe, k] (MoE routing replay), teacher
      log-probs, per-token calibration targets, ...
    segment_ids: [N, R] int32 `SEGMENT_KINDS` id of each response token (default: single-turn, from loss_mask).
    turn_ids: [N, R] int32 the turn of each response token (default: all 0).
  """
  tokens: jax.Array
  attention_mask: jax.Array
  loss_mask: jax.Array
  old_logp: jax.Array
  rollout_logp: jax.Array
  advantages: jax.Array
  token_weights: jax.Array
  group_ids: jax.Array
  row_source: jax.Array
  ref_logp: Any = None
  extras: dict[str, Any] = flax.struct.field(default_factory=dict)
  segment_ids: Any = None
  turn_ids: Any = None

  def __post_init__(self):
    mask = self.loss_mask
    if not _is_array(mask):
      return
    if self.segment_ids is None:
      object.__setattr__(self, "segment_ids", single_turn_segments(mask))
    if self.turn_ids is None:
      object.__setattr__(self, "turn_ids", jnp.zeros(mask.shape, jnp.int32))

  @property
  def response_len(self) -> int:
    return self.loss_mask.shape[1]

  @property
  def response(self) -> jax.Array:
    """[N, R] the response tokens (the last R columns of `tokens`)."""
    return self.tokens[:, -self.response_len:]

  @property
  def response_mask(self) -> jax.Array:
    """[N, R] True on the response tokens attended to (the last R columns of `attention_mask`)."""
    return self.attention_mask[:, -self.response_len:]

  @property
  def num_rows(self) -> int:
    return self.tokens.shape[0]


@flax.struct.dataclass
class Metric:
  """A metric computed inside a jitted step, with how it combines across micro-batches and update steps.

  reduce:
    "mean"  the value is this slice's contribution to a batch mean (normalised by the full batch's count),
            so micro-batches add up to the batch mean; update steps are averaged.
    "sum"   added over micro-batches and over update steps (counts).
    "max" / "min"  the extreme over micro-batches and update steps.
  """
  value: jax.Array
  reduce: str = flax.struct.field(pytree_node=False, default="mean")


METRIC_REDUCTIONS = ("mean", "sum", "max", "min")
