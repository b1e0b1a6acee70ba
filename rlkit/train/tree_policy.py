"""The token decoder trained on trajectory trees (`rl.policy=llm_tree`, QwenGyre's shared-prefix packing,
methods/systems.md §5): each group's rows share their prompt, so the update runs the prompt once per group.

The G rows of a group (same prompt, left-padded to P columns; responses of R columns) are packed into one
sequence, the trie of prompt -> G branches (`rlkit.rollout.tree`'s layout for this shape):

  packed   = [prompt | response_1 | ... | response_G]          P + G*R tokens instead of G*(P+R)
  mask     = tree attention: a prompt token sees the prompt before it, a response token the prompt and its own
             branch before it (never a sibling branch)
  position = prompt: its real tokens' count; response k, token t: the prompt's length + its real tokens so far

so every response token is predicted from exactly the context the expanded row gives it, and its logits are
gathered back to the row layout [N, R, V]: the first token of each branch from the prompt's last column, the
others from their predecessor in the branch. Every loss, correction and aggregation then reads the same [N, R]
log-probs as with `llm` (equal up to float reassociation: the tests compare logp and gradients to 1e-5), and the
gradient through a shared prompt token sums over its branches, which is the expanded gradient exactly.

Cost: the prompt's tokens once per group (the MLPs and projections: G*(P+R) -> P+G*R tokens), but attention
over one sequence of P+G*R, quadratic in it: the win needs prompts long against the responses (agent contexts),
as `experiments/trajectory_tree/` measures. Needs every group whole in each micro-batch, so
`rl.minibatches=1`, `rl.micro_batches=1` and `rl.augment='none'` (G = `rl.group_size` rows per group).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rlkit.core.types import TrainBatch
from rlkit.models.transformer import Transformer
from rlkit.rollout.sampler import SamplingConfig
from rlkit.rollout.scoring import processed_token_logprobs
from rlkit.train.policy import POLICIES, PolicyAdapter

Array = jax.Array


def tree_logits(model: Transformer, params, tokens: Array, attention_mask: Array, group_ids: Array,
                response_len: int, group_size: int) -> Array:
  """[N, R, V] logits predicting each row's response tokens, from one packed tree forward per group.

  :param tokens: [N, P+R] prompt + response (prompt left-padded); rows of a group must share the prompt.
  :param group_ids: [N] int32; every group must have exactly `group_size` rows (in any order).
  """
  n, width = tokens.shape
  r, g = response_len, group_size
  if n % g:
    raise ValueError(f"llm_tree: the update batch has {n} rows, not whole groups of {g}: keep rl.minibatches=1, "
                     "rl.micro_batches=1 and rl.augment='none'.")
  p = width - r
  order = jnp.argsort(group_ids, stable=True)
  inverse = jnp.argsort(order)
  toks, mask = tokens[order].reshape(n // g, g, width), attention_mask[order].reshape(n // g, g, width)
  prompt, prompt_mask = toks[:, 0, :p], mask[:, 0, :p]
  packed = jnp.concatenate([prompt, toks[:, :, p:].reshape(n // g, g * r)], axis=1)
  packed_mask = jnp.concatenate([prompt_mask, mask[:, :, p:].reshape(n // g, g * r)], axis=1)
  n_prompt = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)
  prompt_pos = jnp.cumsum(prompt_mask, axis=1, dtype=jnp.int32) - 1
  branch_pos = n_prompt[:, None, None] + jnp.cumsum(mask[:, :, p:], axis=2, dtype=jnp.int32) - 1
  positions = jnp.maximum(jnp.concatenate([prompt_pos, branch_pos.reshape(n // g, g * r)], axis=1), 0)
  branch = jnp.concatenate([jnp.full((p,), -1, jnp.int32), jnp.repeat(jnp.arange(g, dtype=jnp.int32), r)])
  tree = (branch[None, :] == -1) | (branch[None, :] == branch[:, None])              # [L, L] key j for query i
  tree = jnp.broadcast_to(tree[None], (n // g,) + tree.shape)
  out = model.apply({"params": params}, packed, positions, packed_mask, tree_mask=tree,
                    method=Transformer.forward)
  # The logits predicting branch k's token t: the prompt's last column for t = 0, else the branch's t - 1.
  col = p + jnp.arange(g)[:, None] * r + jnp.arange(r)[None, :] - 1                 # [G, R]
  col = jnp.where(jnp.arange(r)[None, :] == 0, p - 1, col)
  logits = jnp.take(out.logits, col.reshape(-1), axis=1).reshape(n, r, -1)
  return logits[inverse]


def check(section, name: str) -> None:
  """The settings `llm_tree` needs: whole groups in every micro-batch, no routing replay (ValueError)."""
  for key, want in (("minibatches", 1), ("micro_batches", 1), ("augment", "none"), ("replay_routing", False)):
    if section[key] != want:
      raise ValueError(f"{name}.policy='llm_tree' packs whole groups and does not replay MoE routing, so it needs "
                       f"{name}.{key}={want!r} (got {section[key]!r}); set it, or use {name}.policy='llm'.")


@POLICIES.register("llm_tree")
def llm_tree_policy(model: Transformer, cfg, sampling: SamplingConfig, replay_routing: bool = False) -> PolicyAdapter:
  """`llm` with each group's prompt computed once (module docstring)."""
  check(dict(cfg, replay_routing=bool(replay_routing)), "rl")
  group_size = int(cfg.group_size)

  def logits_of(params, mb: TrainBatch) -> Array:
    return tree_logits(model, params, mb.tokens, mb.attention_mask, mb.group_ids, mb.response_len, group_size)

  def forward(params, mb: TrainBatch, keys):
    del keys
    logits = logits_of(params, mb)
    return processed_token_logprobs(logits, mb.response, sampling), {"logits": logits}

  return PolicyAdapter("llm_tree", forward, has_logits=True,
                       probe_logits=lambda params, mb: logits_of(params, mb) / sampling.temperature)


llm_tree_policy.check = check
