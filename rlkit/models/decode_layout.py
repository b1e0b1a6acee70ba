"""The decode layout, for sampling on CPU.

A decode step multiplies a few rows by each weight matrix. XLA:CPU ran x [16, K] @ W [K, N] at 0.83-0.90x
torch's speed at the Qwen3-0.6B shape, and 1.21x torch's with W stored features-major, [N, K], as the left
operand: the contracted axis is then minor in both operands (benchmarks/decode_layer.py, session 14: 10.15
vs 14.76 ms per layer for the four projections; a decode step 8.59 vs 17.27 ms). Parameters keep their
[K, N] layout (training, checkpoints, HF interop); `decode_params` adds a features-major copy "<name>_nk" of
each dense projection, in the compute dtype, which `rlkit.models.transformer` multiplies by (`dot_nk`)
wherever the params carry one. The sampler adds them on CPU, once per generate call.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
NK = "_nk"


def dot_nk(eq: str, w: Array, x: Array, dtype, out_dtype=None) -> Array:
  """`einsum(eq, w, x)` (eq weight first, e.g. "fd,btd->btf") computed as the weight times the tokens,
  [features, tokens], then moved to eq's output order. XLA:CPU's fast matmul wants the left operand's
  contracted axis minor, which the features-major copy has; the barrier keeps XLA from folding that last
  transpose into the matmul by swapping its operands back (which it did, then transposing the weight before
  every matmul: a decode step of 34.6 instead of 21.0 ms per layer, benchmarks/decode_layer.py, session 14)."""
  (ws, xs), out = eq.split("->")[0].split(","), eq.split("->")[1]
  features, tokens = "".join(c for c in ws if c not in xs), "".join(c for c in xs if c not in ws)
  y = jnp.einsum(f"{ws},{xs}->{features}{tokens}", w.astype(dtype), x.astype(dtype),
                 preferred_element_type=jnp.float32)
  y = jax.lax.optimization_barrier(y)
  return jnp.einsum(f"{features}{tokens}->{out}", y).astype(out_dtype or dtype)


def decode_params(params: Any, cfg) -> Any:
  """`params` plus the features-major copies "<name>_nk" the model reads: qkv, o, gate_up and down of every
  dense layer and the LM head (for a tied one, the embedding), in the compute dtype, behind an optimization
  barrier (XLA would otherwise fold each transpose into its matmul, the layout being avoided). MoE experts,
  and kernels that round their activations (W4A4), are left as they are. `cfg`: the model's TransformerConfig."""
  dt, d = jnp.dtype(cfg.dtype), cfg.hidden_size
  layouts = {"qkv": lambda w: w.reshape(d, -1).T, "o": lambda w: w.reshape(-1, d).T,
             "gate_up": lambda w: w.transpose(1, 2, 0), "down": lambda w: w.T}
  out = dict(params)
  copies = {}
  for name, layer in params.items():
    if not name.startswith("layers_"):
      continue
    for part in ("attn", "mlp"):
      if part in layer:
        # A kernel whose activations the sampler rounds (FP4Weight.act, the *_w4a4 quantizers) keeps its own
        # matmul: a dequantized copy would multiply unrounded activations.
        copies[f"{name}/{part}"] = {k + NK: f(layer[part][k]).astype(dt) for k, f in layouts.items()
                                if k in layer[part] and not getattr(layer[part][k], "act", "")}
  # The LM head: a copy of an untied one; a tied one's [V, D] embedding already is features-major.
  copies["lm_head"] = (params["lm_head"].T if "lm_head" in params else params["embedding"]).astype(dt)
  copies = jax.lax.optimization_barrier(copies)
  for key, value in copies.items():
    if key == "lm_head":
      out["lm_head" + NK] = value
    else:
      name, part = key.split("/")
      out[name] = dict(out[name], **{part: dict(params[name][part], **value)})
  return out
