"""Trajectory trees (QwenGyre, methods/systems.md §5): many model calls of one agent execution (retries,
sub-agents, resampling) that share prefixes, stored once as a trie on token ids and packed into one sequence that
a tree attention mask and depth positions make equivalent to its root-to-leaf paths.

Host-side NumPy (the trainer packs trees between rollout and update), but for `tree_logprobs`:

  build_tree(calls)                  the trie: each call's context + output, prefix-matched on token ids (token
                                     in/token out: never re-tokenised), one node per distinct token; a node the
                                     policy generated in any call is trainable, with that call's behaviour logp
  select_leaves(tree, j_max, rng)    QwenGyre's bounded dedup sampling: from the highest-priority role that
                                     still has untrained trainable tokens, a leaf drawn in proportion to them;
                                     its path is then marked trained; up to j_max leaves
  pack_tree(tree, leaves)            the nodes on the chosen leaves' paths, parents first: tokens, depth
                                     positions, packed parent indices, trainable mask, behaviour logps
  tree_mask(parent)                  [L, L] bool: i attends to j iff j is i or an ancestor of i (siblings never
                                     see each other); on a single path it is the causal mask
  node_weights(...)                  exact per-token weights (below)
  tree_logprobs(logits, tokens, parent)   on device: each packed token's log-prob under its parent's logits
                                     (the model run with `tree_mask` and depth positions)

Exact weights (DESIGN, systems.md §5). The expanded objective over chosen leaves l, each with advantage A_l and
path normaliser c_l (1/|trainable tokens of the path| for sequence-mean, 1 for token-sum), is
sum_l c_l A_l sum_{t in path(l)} log pi(y_t | ancestors of t). Every path through a shared token gives it the same
context, so its log-prob (and gradient) is the same on each: training the packed tree once with
w_t = sum_{l below t} c_l A_l gives the expanded loss and gradient exactly, for any objective linear in the
per-token log-prob. (QwenGyre trains each chosen path's new tokens once with its execution's advantage, which
down-weights shared prefixes: `weights="qwengyre"`.)
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class TITOCall(NamedTuple):
  """One model call, token in / token out: `prompt_ids` the whole context it was given, `out_ids` what the policy
  generated (trainable), `out_logp` their behaviour log-probs, `role` its leaf priority (0 highest, e.g. main
  agent 0, main summary 1, sub-agent 2, sub-agent summary 3)."""
  prompt_ids: np.ndarray
  out_ids: np.ndarray
  out_logp: np.ndarray
  role: int = 0


class Tree(NamedTuple):
  tokens: np.ndarray       # [M] int32 token of each node (node 0..M-1, parents before children)
  parent: np.ndarray       # [M] int32 parent node, -1 for a root
  depth: np.ndarray        # [M] int32 position id (0 at a root)
  trainable: np.ndarray    # [M] bool: the policy generated this token in some call
  logp: np.ndarray         # [M] float32 behaviour log-prob of trainable nodes (0 elsewhere)
  leaves: np.ndarray       # [C] int32 the last node of each call
  roles: np.ndarray        # [C] int32 each call's role


def build_tree(calls: Sequence[TITOCall]) -> Tree:
  """The prefix trie of `calls` (each call's prompt_ids + out_ids). A token that one call generated and another
  received as context is one trainable node with the generating call's log-prob."""
  if not calls:
    raise ValueError("build_tree: no calls.")
  tokens, parent, depth, trainable, logp = [], [], [], [], []
  children: dict = {}                     # (parent node, token id) -> node
  leaves, roles = [], []
  for i, call in enumerate(calls):
    prompt, out = np.asarray(call.prompt_ids).reshape(-1), np.asarray(call.out_ids).reshape(-1)
    out_logp = np.asarray(call.out_logp, np.float32).reshape(-1)
    if out_logp.shape != out.shape:
      raise ValueError(f"build_tree: call {i} has {out.size} output tokens and {out_logp.size} log-probs.")
    if prompt.size + out.size == 0:
      raise ValueError(f"build_tree: call {i} holds no token.")
    node = -1
    for k, token in enumerate(np.concatenate([prompt, out]).astype(np.int64)):
      key = (node, int(token))
      if key not in children:
        children[key] = len(tokens)
        tokens.append(int(token))
        parent.append(node)
        depth.append(0 if node < 0 else depth[node] + 1)
        trainable.append(False)
        logp.append(0.0)
      node = children[key]
      generated = k >= prompt.size
      if generated and not trainable[node]:
        trainable[node], logp[node] = True, float(out_logp[k - prompt.size])
    leaves.append(node)
    roles.append(int(call.role))
  return Tree(np.asarray(tokens, np.int32), np.asarray(parent, np.int32), np.asarray(depth, np.int32),
              np.asarray(trainable, bool), np.asarray(logp, np.float32), np.asarray(leaves, np.int32),
              np.asarray(roles, np.int32))


def path(tree: Tree, node: int) -> np.ndarray:
  """Node ids from the root down to `node`."""
  out = []
  while node >= 0:
    out.append(node)
    node = int(tree.parent[node])
  return np.asarray(out[::-1], np.int32)


def select_leaves(tree: Tree, j_max: int, rng: np.random.Generator,
                  role_priority: Optional[Sequence[int]] = None) -> list[int]:
  """QwenGyre's bounded dedup sampling: call indices of up to `j_max` chosen leaves. Each round takes the first
  role of `role_priority` (default: ascending role ids) that has a leaf with untrained trainable tokens on its
  path, draws one of its leaves in proportion to those tokens, and marks that path trained."""
  priority = sorted(set(tree.roles.tolist())) if role_priority is None else list(role_priority)
  trained = np.zeros(tree.tokens.shape, bool)
  paths = [path(tree, int(leaf)) for leaf in tree.leaves]
  chosen: list[int] = []
  while len(chosen) < j_max:
    for role in priority:
      calls = [c for c in range(len(paths)) if tree.roles[c] == role and c not in chosen]
      counts = np.asarray([np.sum(tree.trainable[paths[c]] & ~trained[paths[c]]) for c in calls], np.float64)
      if counts.sum() > 0:
        call = calls[int(rng.choice(len(calls), p=counts / counts.sum()))]
        chosen.append(call)
        trained[paths[call]] = True
        break
    else:
      break                                # nothing left to train
  return chosen


class Packed(NamedTuple):
  nodes: np.ndarray        # [L] tree node of each packed position
  tokens: np.ndarray       # [L] int32
  positions: np.ndarray    # [L] int32 depth
  parent: np.ndarray       # [L] int32 packed index of the parent, -1 at a root
  trainable: np.ndarray    # [L] bool
  logp: np.ndarray         # [L] float32 behaviour log-probs (0 where not trainable)


def pack_tree(tree: Tree, calls: Sequence[int]) -> Packed:
  """The union of the paths of `calls` (indices into the tree's calls), each node once, in node order (parents
  before children)."""
  keep = np.zeros(tree.tokens.shape, bool)
  for c in calls:
    keep[path(tree, int(tree.leaves[c]))] = True
  nodes = np.flatnonzero(keep).astype(np.int32)
  index = np.full(tree.tokens.shape, -1, np.int32)
  index[nodes] = np.arange(nodes.size, dtype=np.int32)
  parents = tree.parent[nodes]
  return Packed(nodes, tree.tokens[nodes], tree.depth[nodes], np.where(parents >= 0, index[parents], -1),
                tree.trainable[nodes], tree.logp[nodes])


def tree_mask(parent: np.ndarray) -> np.ndarray:
  """[L, L] bool ancestor-or-self mask of packed parent indices (parents before children)."""
  n = parent.shape[0]
  mask = np.eye(n, dtype=bool)
  for i in range(n):
    if parent[i] >= 0:
      mask[i] |= mask[parent[i]]
  return mask


def node_weights(tree: Tree, packed: Packed, calls: Sequence[int], advantages: Sequence[float],
                 norm: str = "seq_mean", weights: str = "exact") -> np.ndarray:
  """[L] float32 per-token weights of the packed tree for chosen `calls` with `advantages` (one each):
  `exact` w_t = sum_{calls below t} c A (the expanded objective exactly); `qwengyre` each call's A c on the
  trainable tokens its path adds to the ones chosen before it. c = 1/|trainable tokens on the path| (seq_mean) or
  1 (token_sum). Zero on tokens that are not trainable."""
  if norm not in ("seq_mean", "token_sum") or weights not in ("exact", "qwengyre"):
    raise ValueError(f"node_weights: norm {norm!r} (seq_mean | token_sum), weights {weights!r} (exact | qwengyre).")
  position = {int(n): i for i, n in enumerate(packed.nodes)}
  w = np.zeros(packed.nodes.shape, np.float64)
  seen = np.zeros(packed.nodes.shape, bool)
  for call, adv in zip(calls, advantages):
    on_path = np.asarray([position[int(n)] for n in path(tree, int(tree.leaves[call]))])
    on_path = on_path[packed.trainable[on_path]]
    c = 1.0 / max(on_path.size, 1) if norm == "seq_mean" else 1.0
    if weights == "exact":
      w[on_path] += c * adv
    else:
      new = on_path[~seen[on_path]]
      w[new] += c * adv
      seen[on_path] = True
  return w.astype(np.float32)


def tree_logprobs(logits: jax.Array, tokens: jax.Array, parent: jax.Array) -> jax.Array:
  """[B, L] float32 log-prob of each packed token under the logits [B, L, V] at its parent's position (a token
  follows its parent, not the packed token before it); 0 at a root."""
  at_parent = jnp.take_along_axis(logits, jnp.maximum(parent, 0)[..., None], axis=1)           # [B, L, V]
  logp = jnp.take_along_axis(jax.nn.log_softmax(at_parent.astype(jnp.float32), -1), tokens[..., None], -1)[..., 0]
  return jnp.where(parent >= 0, logp, 0.0)
