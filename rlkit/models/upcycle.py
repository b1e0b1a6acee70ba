"""Sparse upcycling (Komatsuzaki et al., 2022): a dense decoder's MLPs become the experts of an MoE
(`model.upcycle_experts`; the MoE policy of the FP4/TRACE and routing experiments, started from the base model).

Each MLP layer's SwiGLU kernels are copied into E experts (gate_up [D, 2, F] -> [E, D, 2F], gate then up, the
MoE's layout; down [F, D] -> [E, F, D]), optionally perturbed by `noise` x N(0, 1) x the kernel's RMS so the
experts can specialise, and a router W_r [D, E] is drawn from N(0, router_std^2). With norm_topk_prob the
combine weights of a token sum to 1, so without noise the upcycled model computes the dense one's function
exactly (up to float summation order); top-k of the random router then only picks which identical copies serve
each token. Attention, norms, embeddings and the LM head are kept as they are.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlkit.models.transformer import TransformerConfig

Array = jax.Array


def upcycle(cfg: TransformerConfig, params: Any, num_experts: int, k: int, key: Array, noise: float = 0.0,
            router_std: float = 0.02) -> tuple[TransformerConfig, Any]:
  """(MoE config, its params) from a dense `cfg` and `params` (module docstring)."""
  if cfg.num_experts:
    raise ValueError(f"upcycle: the model already has {cfg.num_experts} experts; upcycle a dense model.")
  if not 0 < k <= num_experts:
    raise ValueError(f"upcycle: need 1 <= k={k} <= num_experts={num_experts}.")
  moe_cfg = cfg.replace(num_experts=num_experts, num_experts_per_tok=k, moe_intermediate_size=cfg.intermediate_size,
                        norm_topk_prob=True, mlp_only_layers=())
  out = dict(params)
  for i in range(cfg.num_layers):
    name = f"layers_{i}"
    layer = dict(params[name])
    mlp = layer.pop("mlp")
    keys = jax.random.split(jax.random.fold_in(key, i), 3)
    d = mlp["gate_up"].shape[0]
    experts = {"gate_up": mlp["gate_up"].reshape(d, -1), "down": mlp["down"]}
    moe = {}
    for (part, w), kk in zip(experts.items(), keys[:2]):
      stacked = jnp.broadcast_to(w, (num_experts,) + w.shape)
      if noise:
        rms = jnp.sqrt(jnp.mean(jnp.square(w.astype(jnp.float32))))
        stacked = stacked + (noise * rms * jax.random.normal(kk, stacked.shape)).astype(w.dtype)
      moe[part] = stacked.astype(w.dtype)
    moe["router"] = (router_std * jax.random.normal(keys[2], (d, num_experts))).astype(mlp["down"].dtype)
    layer["moe"] = moe
    out[name] = layer
  return moe_cfg, out
