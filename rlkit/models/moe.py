"""The Qwen3-MoE mixture-of-experts layer, its routing, and the statistics that keep MoE RL stable (routing
replay with combine weights, padding kept out, load-balancing loss, load statistics; methods/systems.md §4).

  probs   = softmax(x W_router)                                  [N, E] float32
  experts = top-k(probs)    (or the given ones: routing replay)  [N, k]
  weights = probs[experts], renormalised when norm_topk_prob     [N, k] (or the given ones: weight replay)
  y       = sum_j weights_j * SwiGLU_{experts_j}(x)              dropless grouped matmuls (`ragged_dot`)

Routing replay (R3): with `given_idx` the selection is the sampler's and the weights are recomputed from the
current router (gradients reach it); with `given_weights` as well, the combine weights are the sampler's too,
so the layer computes exactly the sampler's mixture (only the experts' outputs can differ) and the router
learns only through the auxiliary loss.

Padding: tokens with `token_mask` False are dispatched (static shapes) with combine weight 0, so they add
nothing to any real token, and every statistic below counts real tokens only.

Statistics (pure functions of a `Routing` and the mask, all float32 scalars):
  `load_balancing_loss`  Switch/Qwen3-MoE's auxiliary loss, HF's `load_balancing_loss_func`:
                         E * sum_e f_e * P_e, f_e = assignments to expert e per real token (sum_e f_e = k),
                         P_e = mean router probability of e over real tokens. k at perfect balance.
  `load_stats`           load CV (std / mean of the assignments per expert), peak load (the busiest expert's
                         share over the mean share), cold fraction (experts with no assignment).
  `flip_rate`            the fraction of real (token, layer) pairs whose chosen expert *sets* differ between
                         two routings (sampler vs trainer).
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from rlkit.models.layers import as_dtype, init_weight, kernel_param
from rlkit.models.matmul import QuantizedWeight, expert_matmul
from rlkit.quant import trace
from rlkit.quant.fp4_weight import quantize_fp4_experts

Array = jax.Array


@flax.struct.dataclass
class Routing:
  experts: Array           # [..., k] int32
  weights: Array           # [..., k] float32, the combine weights the layer used
  probs: Array             # [..., E] float32, the router's softmax


def route(router_logits: Array, k: int, norm_topk_prob: bool, given: Optional[Array] = None,
          given_weights: Optional[Array] = None) -> Routing:
  """Qwen3-MoE routing (module docstring): the chosen experts, their combine weights and the router's
  probabilities, with the selection (and optionally the weights) replayed."""
  probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
  if given is None:
    weights, idx = jax.lax.top_k(probs, k)
  else:
    idx = given.astype(jnp.int32)
    weights = jnp.take_along_axis(probs, idx, axis=-1)
  if norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  if given_weights is not None:
    weights = given_weights.astype(jnp.float32)
  return Routing(idx.astype(jnp.int32), weights, probs)


class MoE(nn.Module):
  """Top-k mixture of SwiGLU experts with stacked weights; dropless grouped matmuls (`ragged_dot`).

  With `cfg.expert_quant` (an FP4 format) the experts compute on FP4 values (TRACE's quantization points,
  rlkit/quant/trace.py): their inputs (per token) and the down projection's inputs (per token and slot) are
  fake-quantized, with a straight-through gradient, guided by the rollout's `hints` where given (TRACE) and
  rounded to nearest otherwise; the stacked expert weights too, unless they already are a quantized copy (the
  sampler's, `rl.sync.quantizer`). The third output then records every quantized value's E2M1 code and block
  scales ({trace_x_codes [B, T, D] uint8, trace_x_scales [B, T, D/B], trace_h_codes [B, T, k, F], trace_h_scales}),
  which the sampler keeps with the rollout: TRACE's hint is each code's least significant bit. With
  `cfg.trace_record='bits'` the record keeps only those bits, packed (trace_x_bits [B, T, D/8], trace_h_bits
  [B, T, k, F/8]: the paper's payload, 1/8 of the codes'); whole codes let the trainer measure its full-code
  mismatch with the rollout (rlkit/quant/trace.py)."""
  cfg: "TransformerConfig"  # noqa: F821 (rlkit.models.transformer; a string to avoid the import cycle)

  @nn.compact
  def __call__(self, x, given_idx=None, given_weights=None, token_mask=None, hints=None):
    cfg = self.cfg
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    e, k, f, d = cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.hidden_size
    fmt = cfg.expert_quant
    w_router = self.param("router", init_weight, (d, e), pdt)
    w_gu = kernel_param(self, "gate_up", init_weight, (e, d, 2 * f), pdt)
    w_down = kernel_param(self, "down", init_weight, (e, f, d), pdt)
    if fmt:
      w_gu, w_down = (fake_quant_experts(w, fmt) for w in (w_gu, w_down))
    b, t, _ = x.shape
    router_logits = jnp.einsum("btd,de->bte", x.astype(dt), w_router.astype(dt),
                               preferred_element_type=jnp.float32)
    routing = route(router_logits, k, cfg.norm_topk_prob, given_idx, given_weights)
    weights = routing.weights
    if token_mask is not None:
      weights = jnp.where(token_mask[..., None], weights, 0.0)

    # Dispatch: sort the N*k (token, expert) pairs by expert so each expert sees one contiguous group.
    xf = x.reshape(b * t, d).astype(dt)
    flat_e = routing.experts.reshape(-1)
    order = jnp.argsort(flat_e, stable=True)
    if fmt:      # hints come per token [B, T, D], and per (token, slot) pair [B, T, k, F] (pair = token * k + slot)
      x_hint, h_hint = (None, None) if hints is None else (
          _rows(_hint(hints, "x"), b * t), jax.tree.map(lambda a: a[order], _rows(_hint(hints, "h"), b * t * k)))
      xf, x_codes, x_scales = trace.fake_quant(xf, fmt, x_hint)
    tok = order // k
    group_sizes = jnp.bincount(flat_e, length=e).astype(jnp.int32)
    xs = xf[tok]
    gu = expert_matmul(xs, w_gu.astype(dt), group_sizes).astype(dt)
    h = jax.nn.silu(gu[:, :f]) * gu[:, f:]
    record = None
    if fmt:
      h, h_codes, h_scales = trace.fake_quant(h, fmt, h_hint)
      unsort = lambda a: jnp.zeros_like(a).at[order].set(a).reshape((b, t, k) + a.shape[1:])   # noqa: E731
      kind = cfg.trace_record
      record = {f"trace_{point}_{n}": a for point, codes, scales in (
          ("x", x_codes.reshape(b, t, d), x_scales.reshape(b, t, -1)), ("h", unsort(h_codes), unsort(h_scales)))
          for n, a in trace.record(codes, scales, kind).items()}
    y = expert_matmul(h, w_down.astype(dt), group_sizes)
    y = y * weights.reshape(-1)[order][:, None]
    out = jnp.zeros((b * t, d), jnp.float32).at[tok].add(y)
    return out.reshape(b, t, d).astype(dt), routing, record


def _hint(hints: dict, point: str) -> trace.Hint:
  prefix = f"trace_{point}_"
  return trace.hint_from({n[len(prefix):]: a for n, a in hints.items() if n.startswith(prefix)})


def _rows(hint: trace.Hint, n: int) -> trace.Hint:
  """A hint's arrays with their leading axes merged into `n` rows (the quantized arrays' rows)."""
  return jax.tree.map(lambda a: a.reshape((n, a.shape[-1])), hint)


def fake_quant_experts(w, fmt: str):
  """Stacked expert kernels [E, D, N] rounded to the sampler's FP4 export (blocks along D, rlkit/quant/
  fp4_weight.py) with a straight-through gradient; a quantized copy (the sampler's) as it is."""
  if isinstance(w, QuantizedWeight):
    return w
  w_hat = quantize_fp4_experts(jax.lax.stop_gradient(w), "float32", fmt).dequantize()
  return w + jax.lax.stop_gradient(w_hat.astype(w.dtype) - w)


def _real(mask: Optional[Array], shape: tuple) -> Array:
  return jnp.ones(shape, jnp.float32) if mask is None else jnp.broadcast_to(mask, shape).astype(jnp.float32)


def load_balancing_loss(routing: Routing, mask: Optional[Array] = None) -> Array:
  """E * sum_e f_e P_e over real tokens (module docstring); `routing` fields [..., k] / [..., E] (any leading
  axes, e.g. [B, T, L]); `mask` broadcastable to the leading axes."""
  n_experts = routing.probs.shape[-1]
  real = _real(mask, routing.probs.shape[:-1])
  denom = jnp.maximum(real.sum(), 1.0)
  assigned = jax.nn.one_hot(routing.experts, n_experts, dtype=jnp.float32).sum(-2)      # [..., E]
  f = (assigned * real[..., None]).reshape(-1, n_experts).sum(0) / denom
  p = (routing.probs * real[..., None]).reshape(-1, n_experts).sum(0) / denom
  return n_experts * jnp.sum(f * p)


def load_stats(experts: Array, n_experts: int, mask: Optional[Array] = None) -> dict[str, Array]:
  """{load_cv, peak_load, cold_fraction} of the assignments `experts` [..., L, k] over real tokens (`mask`
  broadcastable to [..., L]): each statistic per layer L, then averaged over the layers."""
  real = _real(mask, experts.shape[:-1])
  counts = jax.nn.one_hot(experts, n_experts, dtype=jnp.float32).sum(-2) * real[..., None]     # [..., L, E]
  per_layer = counts.reshape((-1,) + counts.shape[-2:]).sum(0)                                  # [L, E]
  mean = jnp.maximum(per_layer.mean(-1), 1e-9)
  return {"load_cv": jnp.mean(per_layer.std(-1) / mean),
          "peak_load": jnp.mean(per_layer.max(-1) / mean),
          "cold_fraction": jnp.mean((per_layer == 0).astype(jnp.float32).mean(-1))}


def flip_rate(experts_a: Array, experts_b: Array, mask: Optional[Array] = None) -> Array:
  """The fraction of real (token, layer) pairs whose chosen expert sets differ ([..., k] each)."""
  differ = jnp.any(jnp.sort(experts_a, -1) != jnp.sort(experts_b, -1), axis=-1).astype(jnp.float32)
  real = _real(mask, differ.shape)
  return jnp.sum(differ * real) / jnp.maximum(real.sum(), 1.0)
