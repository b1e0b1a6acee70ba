"""Loss aggregation: how per-token losses `l [N, T]` under a mask `m` become one scalar (verl `agg_loss`).

  token-mean                sum_{i,t} l m / sum_{i,t} m                         DAPO, TRL "dapo"/"bnpo"
  seq-mean-token-mean       (1/S) sum_i (sum_t l m / |o_i|)                     GRPO, GSPO
  seq-mean-token-sum        (1/S) sum_i sum_t l m
  seq-mean-token-sum-norm   sum_{i,t} l m / (S * max_len)                       Dr. GRPO ("1/(G L)")
  token-sum                 sum_{i,t} l m                                       Tinker's built-in RL losses

S is the number of non-empty rows. The choice changes the effective learning rate by large factors and is
what separates the GRPO / DAPO / Dr. GRPO length biases (methods/llm.md §12).

Choices:
- Fully masked rows are skipped: they add nothing to the sum and are not counted in S (verl, Tunix,
  OpenRLHF; TRL's "grpo"/"dr_grpo" count them, which shrinks the loss when rows are empty). A batch with no
  valid token gives 0.
- `seq-mean-token-sum-norm` divides by S * `max_len` with `max_len` a constant the caller passes (e.g. the
  sampler's max_new_tokens), not the padded width: with bucketed padding the width changes between batches,
  and Dr. GRPO's point is a constant normaliser. verl divides the batch sum by the mask width only.
- `token-sum` has no normaliser at all: the loss (and the update size) grows with the number of tokens, so
  the learning rate or the advantages must absorb the scale. verl has no such mode (its `agg_loss` at
  b178a3c offers the four above; the nearest, seq-mean-token-sum-norm, divides by a constant,
  `loss_scale_factor`); Tinker's `importance_sampling` / `ppo` / `cispo` losses are this plain sum. It is
  additive over micro-batches even without the global counts.

Micro-batching: pass the full batch's counts, `aggregate(..., **loss_normalizers(full_mask))`, to every
micro-batch; the sum of the micro-batch losses (and of their gradients) then equals the full-batch loss for
every mode, whatever the micro-batch split. Without them each micro-batch normalises by its own counts, and
summing or averaging micro-batches gives a different (split-dependent) loss.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from rlkit.core.registry import Registry

AggregationFn = Callable[..., jax.Array]

# Entries take already-resolved, clamped counts (`num_tokens`, `num_seqs`); call them through `aggregate`.
AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")


def loss_normalizers(mask: jax.Array) -> dict[str, jax.Array]:
  """Counts of a full batch for global normalisation: valid tokens and non-empty rows.

  :param mask: `[N, T]` True (or 1) on valid tokens of the whole batch, before micro-batch splitting.
  :returns: `{"num_tokens_global": int scalar, "num_seqs_global": int scalar}`, to `**`-splat into
    `aggregate`.
  """
  mask = jnp.asarray(mask).astype(bool)
  return {"num_tokens_global": mask.sum(), "num_seqs_global": mask.any(axis=-1).sum()}


@AGGREGATIONS.register("token-mean")
def _token_mean(per_token, mask, *, num_tokens, num_seqs, max_len):
  del num_seqs, max_len
  return per_token.sum() / num_tokens


@AGGREGATIONS.register("seq-mean-token-mean")
def _seq_mean_token_mean(per_token, mask, *, num_tokens, num_seqs, max_len):
  del num_tokens, max_len
  lengths = jnp.maximum(mask.sum(axis=-1), 1).astype(per_token.dtype)  # empty rows: 0 / 1
  return (per_token.sum(axis=-1) / lengths).sum() / num_seqs


@AGGREGATIONS.register("seq-mean-token-sum")
def _seq_mean_token_sum(per_token, mask, *, num_tokens, num_seqs, max_len):
  del num_tokens, max_len
  return per_token.sum() / num_seqs


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(per_token, mask, *, num_tokens, num_seqs, max_len):
  del num_tokens
  if max_len is None:
    raise ValueError(
        "Aggregation 'seq-mean-token-sum-norm' (Dr. GRPO) needs max_len, the constant completion-length "
        "normaliser (e.g. the sampler's max_new_tokens).")
  return per_token.sum() / (num_seqs * max_len)


@AGGREGATIONS.register("token-sum")
def _token_sum(per_token, mask, *, num_tokens, num_seqs, max_len):
  del mask, num_tokens, num_seqs, max_len
  return per_token.sum()


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str = "token-mean", *,
              num_tokens_global: Optional[jax.Array] = None,
              num_seqs_global: Optional[jax.Array] = None,
              max_len: Optional[int] = None) -> jax.Array:
  """Reduces a per-token loss to a scalar.

  :param per_token: `[N, T]` loss per token (values off the mask are ignored, even if NaN).
  :param mask: `[N, T]` True (or 1) on tokens that count.
  :param mode: a name in `AGGREGATIONS`.
  :param num_tokens_global: valid tokens in the full batch (for "token-mean" under micro-batching);
    None: this call's own count.
  :param num_seqs_global: non-empty rows in the full batch (for the "seq-mean-*" modes); None: this
    call's own count.
  :param max_len: constant length normaliser; required by "seq-mean-token-sum-norm", ignored otherwise.
  :returns: scalar loss.
  """
  fn = AGGREGATIONS.get(mode)
  mask = jnp.asarray(mask).astype(bool)
  per_token = jnp.where(mask, per_token, 0.0)
  local = loss_normalizers(mask)
  num_tokens = local["num_tokens_global"] if num_tokens_global is None else num_tokens_global
  num_seqs = local["num_seqs_global"] if num_seqs_global is None else num_seqs_global
  # max(., 1): an all-empty batch (or micro-batch of a batch that is all empty) gives 0, not NaN.
  num_tokens = jnp.maximum(num_tokens, 1).astype(per_token.dtype)
  num_seqs = jnp.maximum(num_seqs, 1).astype(per_token.dtype)
  return fn(per_token, mask, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
