"""Qwen3-architecture decoder (dense and MoE) in Flax Linen, with a KV cache and MoE routing replay.

The network is architecturally identical to Hugging Face's Qwen3 / Qwen3-MoE (and, with `qk_norm=False`,
`attention_bias=True`, to Qwen2), so real checkpoints load through `rlkit.models.hf`:

  h   = embed(tokens)
  per layer:  h += Attn(RMSNorm(h));  h += MLP(RMSNorm(h))        (MLP = SwiGLU, or a top-k MoE of SwiGLUs)
  Attn: GQA with per-head RMSNorm on q and k (Qwen3), RoPE (rotate-half form, theta from config),
        softmax(q k^T / sqrt(d) + causal&padding mask) v
  logits = RMSNorm(h) @ W_lm   (W_lm = embedding^T when tied)

Layout choices (why): the q/k/v projections are one kernel `[D, KV, G+2, hd]` (for each KV head: its G query
heads, then k, then v) and the SwiGLU gate/up are one kernel `[D, 2, F]`, so each is a single matmul per
step (decode on CPU is dominated by per-op overhead and small matmuls), and tensor parallelism shards the
KV-head / F axes without splitting a head. Matmuls take `preferred_element_type=float32`, which is what makes
bf16 fast on CPUs with AMX and accurate everywhere. The weight matmuls (`rlkit.models.matmul`) and `swiglu`
(`rlkit.models.layers`, with the other building blocks) have hand-written backward passes that save XLA:CPU
full-size copies in the train step.

Positions are explicit: with left-padded prompts, `positions = cumsum(mask) - 1`, so padded and unpadded
prompts give the same logits on real tokens. `Transformer.__call__(tokens)` returns logits `[B, T, V]`;
`Transformer.forward` is the full interface (cache, routing replay, hidden states).

Low precision (the rollout's levers, methods/systems.md §1): the decode cache holds keys and values in
`kv_cache_dtype` (default the compute dtype; a float8 cache halves a bf16 one, saturating, with unit scales as
vLLM's default fp8 cache), and the MoE experts compute on FP4 values with `expert_quant` (every MoE layer, or
those of `expert_quant_layers`; rlkit/models/moe.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from rlkit.models.attention import attend, causal_blocks, masked_probs, merge_blocks, query_blocks
from rlkit.models.decode_layout import NK, dot_nk
from rlkit.models.layers import (NormScale, RMSNorm, as_dtype, init_weight, kernel_param,  # noqa: F401
                                 positions_from_mask, project, rope, rope_tables, swiglu)
from rlkit.models.matmul import weight_matmul
from rlkit.models.moe import MoE, Routing, route  # noqa: F401 (route: re-exported)
from rlkit.parallel.rules import constrain_batch

Array = jax.Array

ATTENTION_IMPLS = ("xla", "cpu_kernel")
KV_CACHE_DTYPES = ("", "float32", "bfloat16", "float8_e4m3fn", "float8_e5m2")
EXPERT_QUANTS = ("", "nvfp4", "mxfp4")
TRACE_RECORDS = ("codes", "bits")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of a Qwen3-style decoder; field names follow rlkit, `hf.py` maps HF's names."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1_000_000.0
  tie_word_embeddings: bool = False
  qk_norm: bool = True            # Qwen3: RMSNorm on each q/k head; Qwen2/Llama: False
  attention_bias: bool = False    # Qwen2: bias on q/k/v projections
  # Mixture of experts (Qwen3-MoE); num_experts == 0 means dense.
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = True
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  expert_quant: str = ""          # "", "nvfp4" or "mxfp4": MoE experts on FP4 values (rlkit/models/moe.py, TRACE)
  expert_quant_layers: tuple[int, ...] = ()   # the MoE layers (decoder indices) expert_quant applies to; (): all
  trace_record: str = "codes"     # what the FP4 experts record for TRACE: "codes" (whole E2M1 codes, a byte each)
                                  # or "bits" (the paper's hint: each code's LSB, 8 to a byte)
  kv_cache_dtype: str = ""        # the decode cache's dtype: "" (dtype), float32, bfloat16, float8_e4m3fn or
                                  # float8_e5m2 (saturating cast, no scale); training forwards have no cache
  param_dtype: str = "float32"
  dtype: str = "float32"          # compute dtype of activations and matmul inputs
  # Self-attention over whole sequences (training, scoring): "xla" (`attention.attend`) or "cpu_kernel"
  # (`kernels/cpu_attention.py`, a C++ kernel for XLA:CPU, built on first use; head_dim % 32 == 0).
  # Decoding with a KV cache always runs the XLA path.
  attention: str = "xla"

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}.")
    if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
      raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be in [1, num_experts="
                       f"{self.num_experts}] for a MoE model.")
    as_dtype(self.param_dtype), as_dtype(self.dtype)
    if self.expert_quant not in EXPERT_QUANTS:
      raise ValueError(f"expert_quant={self.expert_quant!r}: use '' (off), 'nvfp4' or 'mxfp4'.")
    bad = [i for i in self.expert_quant_layers if not 0 <= i < self.num_layers]
    if bad:
      raise ValueError(f"expert_quant_layers={tuple(self.expert_quant_layers)} names layers {bad} outside "
                       f"[0, {self.num_layers}); list decoder layer indices, or () for every MoE layer.")
    if self.trace_record not in TRACE_RECORDS:
      raise ValueError(f"trace_record={self.trace_record!r}: use 'codes' or 'bits'.")
    if self.kv_cache_dtype not in KV_CACHE_DTYPES:
      raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r}: use one of {', '.join(map(repr, KV_CACHE_DTYPES))}.")
    if self.attention not in ATTENTION_IMPLS:
      raise ValueError(f"Unknown attention={self.attention!r}; use one of {list(ATTENTION_IMPLS)}.")
    if self.attention == "cpu_kernel" and self.head_dim % 32:
      raise ValueError(f"attention='cpu_kernel' needs head_dim % 32 == 0, got head_dim={self.head_dim}; "
                       f"use attention='xla'.")

  @property
  def q_per_kv(self) -> int:
    return self.num_heads // self.num_kv_heads

  def is_moe_layer(self, i: int) -> bool:
    return (self.num_experts > 0 and i not in self.mlp_only_layers
            and (i + 1) % self.decoder_sparse_step == 0)

  @property
  def moe_layers(self) -> tuple[int, ...]:
    return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

  def layer_config(self, i: int) -> "TransformerConfig":
    """Decoder layer i's config: without expert_quant where `expert_quant_layers` leaves it out."""
    if self.expert_quant and self.expert_quant_layers and i not in self.expert_quant_layers:
      return self.replace(expert_quant="")
    return self

  def replace(self, **kw) -> "TransformerConfig":
    return dataclasses.replace(self, **kw)


@flax.struct.dataclass
class KVCache:
  """Decode state: per-layer keys and values, which slots hold real tokens, the next slot to write."""
  keys: tuple[Array, ...]     # [B, KV, hd, S] each: transposed, see Attention
  values: tuple[Array, ...]   # [B, KV, S, hd] each
  slot_mask: Array      # [B, S] bool
  index: Array          # [] int32, next slot to write (the same for every row)

  @property
  def max_len(self) -> int:
    return self.slot_mask.shape[1]


def init_cache(cfg: TransformerConfig, batch: int, max_len: int) -> KVCache:
  kshape = (batch, cfg.num_kv_heads, cfg.head_dim, max_len)
  vshape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  dt = jnp.dtype(cfg.kv_cache_dtype) if cfg.kv_cache_dtype else as_dtype(cfg.dtype)
  layers = lambda shape: tuple(jnp.zeros(shape, dt) for _ in range(cfg.num_layers))  # noqa: E731
  return KVCache(keys=layers(kshape), values=layers(vshape), slot_mask=jnp.zeros((batch, max_len), bool),
                 index=jnp.zeros((), jnp.int32))


@flax.struct.dataclass
class ModelOutput:
  logits: Array                       # [B, T, V] float32
  hidden: Array                       # [B, T, D] final-norm hidden states
  cache: Optional[KVCache] = None
  routed_experts: Optional[Array] = None   # [B, T, L_moe, k] int32 (MoE only)
  routed_weights: Optional[Array] = None   # [B, T, L_moe, k] float32 combine weights (MoE only)
  router_probs: Optional[Array] = None     # [B, T, L_moe, E] float32 router softmax (MoE only)
  trace: Optional[dict] = None             # MoE with expert_quant: the TRACE hints, {name: [B, T, L_fp4, ...]}
                                           # (L_fp4: the MoE layers expert_quant applies to)


def to_cache(x: Array, dtype) -> Array:
  """x in the cache's dtype; into a float8 cache saturating at its largest finite value (a plain cast would
  make NaN of what overflows float8_e4m3fn), as vLLM's fp8 cache with unit scales."""
  if jnp.dtype(dtype).itemsize == 1:
    top = float(jnp.finfo(dtype).max)
    x = jnp.clip(x.astype(jnp.float32), -top, top)
  return x.astype(dtype)


def _cached_attention(q: Array, k: Array, v: Array, allowed: Array, cache_kv, dt) -> tuple[Array, tuple]:
  """Attention of the new queries q [B, T, KV, G, hd] over the cache, after writing this call's keys and
  values k, v [B, T, KV, hd] into it at its index: (out [B, T, KV*G*hd], (new key cache, new value cache))."""
  b, t, kvh, g, hd = q.shape
  qh = q.transpose(0, 2, 1, 3, 4).reshape(b, kvh, t * g, hd)             # queries of a KV head: (t, g) rows
  # The cache keeps keys transposed, [B, KV, hd, S], and values as [B, KV, S, hd]: both attention
  # matmuls then stream the cache along its minor axis. With keys as [B, KV, S, hd] the decode step's
  # q.k^T reduces over the 32-64 wide minor axis, which XLA:CPU ran 2x (S = 80) to 20x (S = 576) slower.
  k_cache, v_cache, index = cache_kv
  k = jax.lax.dynamic_update_slice(k_cache, to_cache(k.transpose(0, 2, 3, 1), k_cache.dtype), (0, 0, 0, index))
  scores = jnp.einsum("bkqh,bkhs->bkqs", qh, k.astype(dt), preferred_element_type=jnp.float32)
  v = jax.lax.dynamic_update_slice(v_cache, to_cache(v.transpose(0, 2, 1, 3), v_cache.dtype), (0, 0, index, 0))
  probs = masked_probs(scores, allowed, g, hd)
  out = jnp.einsum("bkqs,bksh->bkqh", probs.astype(dt), v.astype(dt), preferred_element_type=jnp.float32)
  return out.reshape(b, kvh, t, g * hd).transpose(0, 2, 1, 3).reshape(b, t, kvh * g * hd), (k, v)


class Attention(nn.Module):
  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x, rope_cs, key_mask, q_slots, cache_kv, tree_mask=None):
    """x: [B,T,D]; rope_cs: (cos, sin) from `rope_tables`; key_mask: [B,S] real key slots;
    q_slots: [T] slot of each query (causality); tree_mask: optional [B,T,T] which earlier tokens each query
    may see (a packed trajectory tree's ancestors; no cache).

    cache_kv: None (keys are this call's tokens, S == T) or (k_cache, v_cache, index) to write into.
    """
    cfg = self.cfg
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    kvh, g, hd = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    w_qkv = kernel_param(self, "qkv", init_weight, (cfg.hidden_size, kvh, g + 2, hd), pdt)
    # One 2-D matmul over the merged (KV, G + 2, hd) features, like the output projection's. As
    # "btd,dkgh->btkgh", XLA reordered the three axes inside the input-gradient matmul, which copied the
    # weight and the q/k/v gradient (summing its three parts a second time) each step (M train step
    # 1.023x, 12 interleaved rounds). The head axis leads the merged one, so tensor parallelism's split
    # of the heads carries over (the same collectives as before in a tensor=2 step).
    b, t = x.shape[:2]
    qkv = project(self, "qkv", "btd,df->btf", "fd,btd->btf", x, w_qkv.reshape(cfg.hidden_size, -1), dt)
    qkv = qkv.reshape(b, t, kvh, g + 2, hd)
    if cfg.attention_bias:
      qkv = qkv + self.param("qkv_bias", nn.initializers.zeros, (kvh, g + 2, hd), pdt).astype(dt)
    new_kv = None
    s = t if cache_kv is None else cache_kv[0].shape[-1]
    causal = jnp.arange(s)[None, :] <= q_slots[:, None]                 # [T, S]
    allowed = causal[None, :, :] & key_mask[:, None, :]                  # [B, T, S]
    if tree_mask is not None:
      # Within the causal mask (parents are packed before children), so the causal block skipping holds.
      allowed = allowed & tree_mask.astype(bool)
    if cache_kv is None and cfg.attention == "cpu_kernel":
      # q/k norm, rope and attention in one C++ kernel, reading qkv as it comes out of the matmul: XLA's
      # own slice, norm and rope passes over q and k took about 60 ms of the M train step's forward.
      from kernels.cpu_attention import cpu_attention     # built on first use: imported only when asked for
      scales = (NormScale(pdt, name="q_norm")(hd), NormScale(pdt, name="k_norm")(hd)) if cfg.qk_norm else None
      out = cpu_attention(qkv, allowed, *rope_cs, scales, cfg.rms_norm_eps, True).reshape(b, t, kvh * g * hd)
    else:
      q, k, v = qkv[:, :, :, :g], qkv[:, :, :, g], qkv[:, :, :, g + 1]   # [B,T,KV,G,hd], [B,T,KV,hd] x2
      if cfg.qk_norm:
        q = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="q_norm")(q)
        k = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="k_norm")(k)
      q = rope(q, *rope_cs)
      k = rope(k, *rope_cs)
      if cache_kv is None:
        nb = causal_blocks(t)
        out = merge_blocks(attend(query_blocks(q, nb), k.transpose(0, 2, 1, 3).astype(dt),
                                  v.transpose(0, 2, 1, 3).astype(dt), allowed, g, nb), g)
      else:
        out, new_kv = _cached_attention(q, k, v, allowed, cache_kv, dt)
    out = out.astype(dt)
    # The output projection is a plain 2-D matmul over the merged (KV, G, hd) axis, with `out` moved to
    # [B, T, KV*G*hd] (a free reshape when T == 1). As "bktgh,kghd->btd" XLA:CPU transposed the weight to
    # (G, hd, KV) order before every decode step's matmul (0.1 ms per layer on M; the M sampler 1.065x).
    w_o = kernel_param(self, "o", init_weight, (kvh, g, hd, cfg.hidden_size), pdt)
    return project(self, "o", "btf,fd->btd", "df,btf->btd", out, w_o.reshape(kvh * g * hd, cfg.hidden_size),
                 dt), new_kv


class MLP(nn.Module):
  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    w_gu = kernel_param(self, "gate_up", init_weight, (cfg.hidden_size, 2, cfg.intermediate_size), pdt)
    w_down = kernel_param(self, "down", init_weight, (cfg.intermediate_size, cfg.hidden_size), pdt)
    h = swiglu(project(self, "gate_up", "btd,dcf->btcf", "cfd,btd->btcf", x, w_gu, dt))
    return project(self, "down", "btf,fd->btd", "df,btf->btd", h, w_down, dt)


class DecoderLayer(nn.Module):
  cfg: TransformerConfig
  moe: bool

  @nn.compact
  def __call__(self, h, rope_cs, key_mask, q_slots, cache_kv, given, tree_mask=None, token_mask=None):
    cfg = self.cfg
    dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
    a, new_kv = Attention(cfg, name="attn")(
        RMSNorm(cfg.rms_norm_eps, dt, pdt, name="attn_norm")(h), rope_cs, key_mask, q_slots, cache_kv, tree_mask)
    h = h + a
    z = RMSNorm(cfg.rms_norm_eps, dt, pdt, name="mlp_norm")(h)
    routing = record = None
    if self.moe:
      m, routing, record = MoE(cfg, name="moe")(z, token_mask=token_mask, **given)
    else:
      m = MLP(cfg, name="mlp")(z)
    return h + m, new_kv, routing, record


class Transformer(nn.Module):
  cfg: TransformerConfig

  def setup(self):
    cfg = self.cfg
    pdt = as_dtype(cfg.param_dtype)
    self.embedding = self.param("embedding", init_weight, (cfg.vocab_size, cfg.hidden_size), pdt)
    self.layers = [DecoderLayer(cfg.layer_config(i), cfg.is_moe_layer(i), name=f"layers_{i}")
                   for i in range(cfg.num_layers)]
    self.final_norm = RMSNorm(cfg.rms_norm_eps, as_dtype(cfg.dtype), pdt, name="final_norm")
    if not cfg.tie_word_embeddings:
      self.lm_head = kernel_param(self, "lm_head", init_weight, (cfg.hidden_size, cfg.vocab_size), pdt)

  def __call__(self, tokens: Array, positions: Optional[Array] = None,
               attention_mask: Optional[Array] = None) -> Array:
    """Logits `[B, T, V]` (float32) of a full sequence; HF-style `apply({'params': p}, tokens)`."""
    return self.forward(tokens, positions, attention_mask).logits

  def forward(self, tokens: Array, positions: Optional[Array] = None, attention_mask: Optional[Array] = None,
              cache: Optional[KVCache] = None, routed_experts: Optional[Array] = None,
              routed_weights: Optional[Array] = None, trace_hints: Optional[dict] = None, logits: str = "all", rope_cs: Optional[tuple[Array, Array]] = None,
              tree_mask: Optional[Array] = None) -> ModelOutput:
    """Full interface.

    Args:
      tokens: [B, T] int32.
      positions: [B, T] position ids; default `positions_from_mask(attention_mask)` (arange if no mask).
        With a cache, pass the true positions of the new tokens.
      attention_mask: [B, T] bool, True on real tokens (default all True).
      cache: a `KVCache`; the T new tokens are written at slots [cache.index, cache.index + T) and attend
        to every earlier real slot.
      routed_experts: [B, T, L_moe, k] expert indices to replay instead of routing (MoE only).
      routed_weights: [B, T, L_moe, k] combine weights to replay with them (rlkit/models/moe.py).
      trace_hints: {trace_x_codes, trace_x_scales, trace_h_codes, trace_h_scales: [B, T, L_fp4, ...]} (or
        trace_*_bits for `trace_record='bits'`), the rollout's FP4 record that guides the experts' rounding
        (`expert_quant`, over its `expert_quant_layers`; rlkit/quant/trace.py).
      logits: "all" (LM head at every position), "last" (only the last position, as `[B, 1, V]`: prefill
        needs nothing else) or "none" (hidden states only, e.g. for value heads).
      rope_cs: optional `rope_tables(positions, ...)`, precomputed by a caller that runs many steps (the
        sampler computes them for every decode step before its loop); default computed here.
      tree_mask: optional [B, T, T] bool, True where query i may attend to key j: a packed trajectory tree's
        ancestor-or-self mask (rlkit/rollout/tree.py), with `positions` the tree depths. It must lie within
        the causal mask (parents packed first); not with a cache.
    """
    cfg = self.cfg
    dt = as_dtype(cfg.dtype)
    b, t = tokens.shape
    if attention_mask is None:
      attention_mask = jnp.ones((b, t), bool)
    attention_mask = attention_mask.astype(bool)
    if positions is None:
      positions = positions_from_mask(attention_mask)
    if tree_mask is not None and (cache is not None or tree_mask.shape != (b, t, t)):
      raise ValueError(f"tree_mask must be [B, T, T] = {(b, t, t)} and without a cache; got "
                       f"{tree_mask.shape}{' with a cache' if cache is not None else ''}.")
    if cache is None:
      key_mask, q_slots, index = attention_mask, jnp.arange(t), None
    else:
      index = cache.index
      key_mask = jax.lax.dynamic_update_slice(cache.slot_mask, attention_mask, (0, index))
      q_slots = index + jnp.arange(t)

    # FSDP: rows stay split over (data, fsdp) under `jax.set_mesh` (GSPMD may split D instead); else no-op.
    h = constrain_batch(jnp.take(self.embedding, tokens, axis=0).astype(dt))
    if rope_cs is None:
      rope_cs = rope_tables(positions, cfg.head_dim, cfg.rope_theta, dt)
    new_k, new_v, routings, records = [], [], [], []
    for i, layer in enumerate(self.layers):
      cache_kv = None if cache is None else (cache.keys[i], cache.values[i], index)
      j, q = len(routings), len(records)        # this layer's index among the MoE / the FP4-expert layers
      given = {}
      if layer.moe:
        at = lambda a, j: None if a is None else a[:, :, j]       # noqa: E731 (this layer's slice)
        given = dict(given_idx=at(routed_experts, j), given_weights=at(routed_weights, j),
                     hints=None if trace_hints is None or not layer.cfg.expert_quant
                     else {n: at(a, q) for n, a in trace_hints.items()})
      h, kv, routing, record = layer(h, rope_cs, key_mask, q_slots, cache_kv, given, tree_mask, attention_mask)
      h = constrain_batch(h)
      if kv is not None:
        new_k.append(kv[0]), new_v.append(kv[1])
      if routing is not None:
        routings.append(routing)
      if record is not None:
        records.append(record)
    h = self.final_norm(h)
    if logits not in ("all", "last", "none"):
      raise ValueError(f"logits={logits!r}; use 'all', 'last' or 'none'.")
    out_logits = None
    if logits != "none":
      hl = (h[:, -1:] if logits == "last" else h).astype(dt)
      if self.has_variable("params", "lm_head" + NK):        # decode layout (see NK)
        out_logits = dot_nk("vd,btd->btv", self.get_variable("params", "lm_head" + NK), hl, dt, jnp.float32)
      elif cfg.tie_word_embeddings:
        out_logits = weight_matmul("btd,vd->btv", hl, self.embedding.astype(dt))
      else:
        out_logits = weight_matmul("btd,dv->btv", hl, self.lm_head.astype(dt))
    new_cache = None
    if cache is not None:
      new_cache = KVCache(tuple(new_k), tuple(new_v), key_mask, index + t)
    moe = {}
    if routings:                                   # [B, T, L_moe, ...]
      moe = {name: jnp.stack([getattr(r, field) for r in routings], axis=2)
             for name, field in (("routed_experts", "experts"), ("routed_weights", "weights"),
                                 ("router_probs", "probs"))}
    if records:
      moe["trace"] = {n: jnp.stack([r[n] for r in records], axis=2) for n in records[0]}
    return ModelOutput(logits=out_logits, hidden=h, cache=new_cache, **moe)


def init_params(cfg: TransformerConfig, key: Array) -> Any:
  """Random parameters for `Transformer(cfg)` (jitted, so large models initialise fast)."""
  model = Transformer(cfg)
  return jax.jit(lambda k: model.init(k, jnp.zeros((1, 1), jnp.int32))["params"])(key)


def num_params(params: Any) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
