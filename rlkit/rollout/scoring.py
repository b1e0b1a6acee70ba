"""Scoring sampled sequences with the trainer's model: per-token log-probs of the response tokens.

The one scorer of the library: the trainer's old and reference log-probs, the update step's differentiated
log-probs and the tests all go through `response_logits` + `processed_token_logprobs`. One forward pass over
prompt + response; the logits at position t predict token t+1, so the response tokens (the last R columns)
are scored by positions P-1 .. P+R-2. With the sampler's `SamplingConfig` the log-probs are taken under the
distribution tokens were drawn from (temperature, top-k, top-p, renormalised), so they are directly
comparable to `Rollout.logprobs` (the sampler/trainer mismatch metric), and for MoE the sampler's routing can
be replayed. `replay` names what of the rollout's MoE record the trainer reuses (rlkit/models/moe.py): False
(nothing), True (the chosen experts, `routed_experts` [N, P+R, L_moe, k]), or a tuple of "experts", "weights"
(their combine weights) and "trace" (the FP4 hints that guide the experts' rounding, rlkit/quant/trace.py).
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


def replay_mode(rl) -> tuple:
  """`replay` of an RL section: the experts with `rl.replay_routing`, their weights with
  `rl.moe.replay_weights` (experts implied), the FP4 hints with `rl.moe.trace`."""
  moe = rl.get("moe", {})
  weights = moe.get("replay_weights", False)
  return tuple(name for name, on in (("experts", rl.replay_routing or weights), ("weights", weights),
                                     ("trace", moe.get("trace", False))) if on)


def replayed(batch, replay) -> dict:
  """`response_forward`'s keyword arguments that replay `replay` (module docstring) from `batch.extras`."""
  replay = ("experts",) if replay is True else tuple(replay or ())
  out = {}
  extras = batch.extras if replay else {}
  if "experts" in replay:
    out["routed"] = extras.get("routed_experts")
  if "weights" in replay:
    out["routed_weights"] = extras.get("routed_weights")
  if "trace" in replay:
    out["trace_hints"] = {n: a for n, a in extras.items() if n.startswith("trace_")}
  return out


def response_forward(model: Transformer, params: Any, tokens: Array, attention_mask: Array, response_len: int,
                     routed: Optional[Array] = None, routed_weights: Optional[Array] = None,
                     trace_hints: Optional[dict] = None) -> tuple[Array, ModelOutput]:
  """Forward over `tokens` [N, P+R]. Returns (logits predicting the last R tokens [N, R, V], the output)."""
  out = model.apply({"params": params}, tokens, None, attention_mask, None, routed, routed_weights, trace_hints,
                    method=Transformer.forward)
  p = tokens.shape[1] - response_len
  return out.logits[:, p - 1:p + response_len - 1], out


def processed_token_logprobs(logits: Array, tokens: Array, cfg: Optional[SamplingConfig]) -> Array:
  """log-probs of `tokens` under the sampler's processed distribution (plain softmax if cfg is None).

  Without top-k / top-p this is `token_logprobs` at the temperature (its one-pass backward); with them the
  truncated, renormalised distribution, whose removed tokens have logit -inf (no gradient through them).
  """
  if cfg is None:
    return token_logprobs(logits, tokens)
  if not cfg.greedy and cfg.top_k == 0 and cfg.top_p >= 1.0:
    return token_logprobs(logits, tokens, cfg.temperature)
  return token_logprobs(processed_logits(logits, cfg), tokens)


def score_response(model: Transformer, params: Any, tokens: Array, attention_mask: Array, response_len: int,
                   cfg: Optional[SamplingConfig], routed: Optional[Array] = None, **replay: Any) -> Array:
  """[N, R] log-probs of the last `response_len` tokens, zero where the attention mask is False (`replay`:
  response_forward's routed_weights / trace_hints)."""
  logits, _ = response_forward(model, params, tokens, attention_mask, response_len, routed, **replay)
  logp = processed_token_logprobs(logits, tokens[:, -response_len:], cfg)
  return jnp.where(attention_mask[:, -response_len:], logp, 0.0)


def make_scorer(model: Transformer, cfg: Optional[SamplingConfig], replay_routing=False):
  """Jitted `score(params, batch) -> [N, R]` for a `TrainBatch` (or anything with its fields)."""

  @jax.jit
  def score(params, batch):
    return score_response(model, params, batch.tokens, batch.attention_mask, batch.response_len, cfg,
                          **replayed(batch, replay_routing))
  return score


def make_distribution_scorer(model: Transformer, temperature: float, top_k: int):
  """Jitted `score(params, batch) -> {"dist_logp", ["dist_ids"]}`: the model's distribution at every response
  position at `temperature`, whole or its top-k (`rlkit.objectives.distill.teacher_distribution`); zero on
  positions the attention mask leaves out."""
  from rlkit.objectives.distill import teacher_distribution

  @jax.jit
  def score(params, batch):
    logits, _ = response_forward(model, params, batch.tokens, batch.attention_mask, batch.response_len)
    out = teacher_distribution(logits, temperature, top_k)
    keep = batch.attention_mask[:, -batch.response_len:, None]
    return {k: jnp.where(keep, v, 0) for k, v in out.items()}
  return score


def response_logprobs(model: Transformer, params: Any, rollout: Rollout,
                      cfg: Optional[SamplingConfig] = None, replay_routing=False) -> Array:
  """`score_response` of a `Rollout`'s response (routing replayed from its extras if asked)."""
  return score_response(model, params, rollout.tokens, rollout.attention_mask, rollout.response.shape[1], cfg,
                        **replayed(rollout, replay_routing))
