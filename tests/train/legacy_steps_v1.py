"""The update steps as they were before trainer v2 (commit f412db8), frozen as the oracle for the property
"with token_weights = 1 and loss_mask = response_mask, v2's loss and gradients equal v1's bit for bit".

Not library code: do not import it outside tests, and do not change it (it is the reference, not an API).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from rlkit.models.transformer import Transformer
from rlkit.objectives import (POLICY_LOSSES, aggregate, kl_penalty, loss_normalizers, token_entropy,
                              token_logprobs)
from rlkit.optim.optimizers import current_lr

Array = jax.Array


class TrainState(NamedTuple):
  step: Array          # [] int32 optimizer steps taken in this stage
  params: Any
  opt_state: Any


def init_train_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))


def _split(tree: Any, n: int) -> Any:
  """[B, ...] -> [n, B/n, ...] for every leaf (micro-batches for lax.scan)."""
  def f(x):
    if x.shape[0] % n:
      raise ValueError(f"Batch of {x.shape[0]} rows does not split into {n} equal micro-batches; make the "
                       "batch size a multiple of micro_batches.")
    return x.reshape((n, x.shape[0] // n) + x.shape[1:])
  return jax.tree.map(f, tree)


def _accumulate(loss_fn, params: Any, batch: Any, micro_batches: int):
  """Sum of (loss, grads, metrics) of `loss_fn` over micro-batches; loss_fn normalises globally."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if micro_batches == 1:
    (loss, metrics), grads = grad_fn(params, batch)
    return loss, grads, metrics

  def body(carry, mb):
    (loss, metrics), grads = grad_fn(params, mb)
    acc = jax.tree.map(jnp.add, carry, (loss, grads, metrics))
    return acc, None

  first = jax.tree.map(lambda x: x[0], _split(batch, micro_batches))
  shapes = jax.eval_shape(grad_fn, params, first)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[0][0], shapes[1], shapes[0][1]))
  (loss, grads, metrics), _ = jax.lax.scan(body, zeros, _split(batch, micro_batches))
  return loss, grads, metrics


def _apply(state: TrainState, tx: optax.GradientTransformation, grads: Any) -> tuple[TrainState, dict]:
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  info = {"grad_norm": optax.global_norm(grads)}
  lr = current_lr(opt_state)
  if lr is not None:
    info["lr"] = lr
  return TrainState(state.step + 1, params, opt_state), info


# ---------------------------------------------------------------------------------------------------- SFT

def make_sft_step(model: Transformer, tx: optax.GradientTransformation, micro_batches: int = 1):
  """`sft_step(state, batch) -> (state, metrics)`; batch: tokens, attention_mask, loss_mask [B, T]."""

  def loss_fn(params, mb, num_tokens):
    logits = model.apply({"params": params}, mb["tokens"], attention_mask=mb["attention_mask"])
    # Position t predicts token t+1. Scoring every position against the tokens shifted left (the last
    # position's target is masked out) avoids slicing the [B, T, V] logits, a full copy in each direction.
    targets = jnp.roll(mb["tokens"], -1, axis=1)
    mask = jnp.pad(mb["loss_mask"][:, 1:], ((0, 0), (0, 1)))
    nll = -token_logprobs(logits, targets)
    # Correct when the target's logit is the row maximum (argmax up to exact ties): one max, which the
    # logsumexp also computes, instead of a variadic argmax reduction over the vocabulary.
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    correct = (target_logit >= jnp.max(logits, axis=-1)) & mask
    loss = jnp.sum(jnp.where(mask, nll, 0.0)) / num_tokens
    return loss, {"token_accuracy": jnp.sum(correct) / num_tokens}

  @functools.partial(jax.jit, donate_argnums=0)
  def sft_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    num_tokens = jnp.maximum(jnp.sum(batch["loss_mask"][:, 1:]), 1)
    loss, grads, metrics = _accumulate(lambda p, mb: loss_fn(p, mb, num_tokens), state.params, batch,
                                       micro_batches)
    state, info = _apply(state, tx, grads)
    return state, {"loss": loss, **metrics, **info}

  return sft_step


# ----------------------------------------------------------------------------------------------------- RL

@dataclasses.dataclass(frozen=True)
class RLLossConfig:
  """Static settings of the RL loss (hashable: part of the jitted step's closure)."""
  policy_loss: str = "ppo_clip"
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: Optional[float] = None
  aggregation: str = "token-mean"
  kl_estimator: str = "k3"
  kl_beta: float = 0.0
  entropy_coef: float = 0.0
  temperature: float = 1.0
  max_len: int = 0                 # constant normaliser of seq-mean-token-sum-norm (max_new_tokens)
  replay_routing: bool = False     # MoE: reuse the sampler's expert choices in the trainer forward


def response_logits(model: Transformer, params: Any, batch: dict, replay_routing: bool = False) -> Array:
  """[N, R, V] logits that predict the response tokens (positions P-1 .. P+R-2 of prompt + response)."""
  routed = batch.get("routed_experts") if replay_routing else None
  out = model.apply({"params": params}, batch["tokens"], None, batch["attention_mask"], None, routed,
                    method=Transformer.forward)
  r = batch["response"].shape[1]
  p = batch["tokens"].shape[1] - r
  return out.logits[:, p - 1:p + r - 1]


def rl_loss(model: Transformer, cfg: RLLossConfig, params: Any, mb: dict, norms: dict) -> tuple[Array, dict]:
  """Scalar loss of one micro-batch, normalised by the full batch's `norms`, and summable metrics."""
  mask = mb["response_mask"]
  logits = response_logits(model, params, mb, cfg.replay_routing)
  logp = token_logprobs(logits, mb["response"], cfg.temperature)
  per_tok, m = POLICY_LOSSES.get(cfg.policy_loss)(
      logp, mb["old_logp"], mb["advantages"], mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
      **({"dual_clip": cfg.dual_clip} if cfg.dual_clip else {}))
  n_tok = norms["num_tokens_global"]
  fm = mask.astype(jnp.float32)
  entropy = token_entropy(logits.astype(jnp.float32) / cfg.temperature)
  metrics = {"entropy": jnp.sum(entropy * fm) / n_tok,
             "clip_frac": jnp.sum(m.get("clip_frac", 0.0) * jnp.sum(fm)) / n_tok}
  if cfg.kl_beta > 0:
    kl = kl_penalty(cfg.kl_estimator, logp, jax.lax.stop_gradient(mb["ref_logp"]))
    per_tok = per_tok + cfg.kl_beta * kl
    metrics["kl"] = jnp.sum(kl * fm) / n_tok
  if cfg.entropy_coef:
    per_tok = per_tok - cfg.entropy_coef * entropy
  loss = aggregate(per_tok, mask, cfg.aggregation, max_len=cfg.max_len or None, **norms)
  return loss, metrics


def make_rl_step(model: Transformer, tx: optax.GradientTransformation, cfg: RLLossConfig,
                 micro_batches: int = 1):
  """`rl_step(state, batch) -> (state, metrics)`.

  batch: tokens, attention_mask [N, P+R]; response, response_mask, old_logp (, ref_logp) [N, R];
  advantages [N] or [N, R]; optional routed_experts for MoE replay.
  """

  @functools.partial(jax.jit, donate_argnums=0)
  def rl_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    norms = loss_normalizers(batch["response_mask"])
    loss, grads, metrics = _accumulate(lambda p, mb: rl_loss(model, cfg, p, mb, norms), state.params, batch,
                                       micro_batches)
    state, info = _apply(state, tx, grads)
    return state, {"loss": loss, **metrics, **info}

  return rl_step
