"""A packed trajectory tree through the transformer (`forward(..., tree_mask=)` with depth positions): one path
is the plain forward exactly, and the deduplicated loss and gradients with `node_weights` equal those of training
every chosen root-to-leaf path as its own sequence."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rollout.tree import (TITOCall, build_tree, node_weights, pack_tree, path, select_leaves, tree_logprobs,
                                tree_mask)

CFG = TransformerConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, rope_theta=10_000.0)
MODEL = Transformer(CFG)


def _forward(params, tokens, positions, mask=None):
  return MODEL.apply({"params": params}, tokens, positions, method=MODEL.forward, tree_mask=mask).logits


def _calls(rng, n=8):
  calls, stems = [], [rng.integers(1, 40, size=5)]
  for _ in range(n):
    base = stems[rng.integers(len(stems))]
    stem = np.concatenate([base[:rng.integers(1, base.size + 1)], rng.integers(1, 40, size=rng.integers(0, 3))])
    out = rng.integers(1, 40, size=rng.integers(1, 4))
    calls.append(TITOCall(stem.astype(np.int32), out.astype(np.int32), np.zeros(out.size, np.float32)))
    stems.append(np.concatenate([stem, out]))
  return calls


def test_one_path_with_the_tree_mask_is_the_plain_forward():
  params = init_params(CFG, jax.random.key(0))
  tokens = jnp.asarray([[3, 7, 1, 9, 4, 4, 2]], jnp.int32)
  packed = pack_tree(build_tree([TITOCall(np.asarray(tokens[0, :4]), np.asarray(tokens[0, 4:]), np.zeros(3))]), [0])
  tree = _forward(params, jnp.asarray(packed.tokens)[None], jnp.asarray(packed.positions)[None],
                  jnp.asarray(tree_mask(packed.parent))[None])
  np.testing.assert_array_equal(tree, _forward(params, tokens, jnp.arange(7)[None]))


@pytest.mark.parametrize("norm", ["seq_mean", "token_sum"])
def test_dedup_loss_and_gradients_equal_the_expanded_paths(norm):
  rng = np.random.default_rng(0)
  params = init_params(CFG, jax.random.key(1))
  tree = build_tree(_calls(rng))
  chosen = select_leaves(tree, 6, np.random.default_rng(2))
  adv = rng.normal(size=len(chosen))
  packed = pack_tree(tree, chosen)
  w = jnp.asarray(node_weights(tree, packed, chosen, adv, norm))
  tokens, positions = jnp.asarray(packed.tokens)[None], jnp.asarray(packed.positions)[None]
  mask, parent = jnp.asarray(tree_mask(packed.parent))[None], jnp.asarray(packed.parent)[None]

  def dedup(p):
    return jnp.sum(w * tree_logprobs(_forward(p, tokens, positions, mask), tokens, parent)[0])

  # Every chosen path as its own row, right-padded into one batch (one compile): padding after a path's end is
  # never attended by its tokens.
  paths = [path(tree, int(tree.leaves[c])) for c in chosen]
  width = max(p.size for p in paths)
  seqs = np.zeros((len(paths), width), np.int32)
  train = np.zeros((len(paths), width), bool)
  for i, nodes in enumerate(paths):
    seqs[i, :nodes.size], train[i, :nodes.size] = tree.tokens[nodes], tree.trainable[nodes]
  count = train.sum(1)
  scale = jnp.asarray(adv * (1.0 / count if norm == "seq_mean" else 1.0), jnp.float32)
  seqs_j, train_j = jnp.asarray(seqs), jnp.asarray(train[:, 1:])

  def expanded(p):
    logits = _forward(p, seqs_j, jnp.broadcast_to(jnp.arange(width), seqs.shape))
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], -1), seqs_j[:, 1:, None], -1)[..., 0]
    return jnp.sum(scale * jnp.sum(jnp.where(train_j, lp, 0.0), 1))

  # jitted: eager, op by op, the two backward passes took ~20 s
  (l1, g1), (l2, g2) = jax.jit(jax.value_and_grad(dedup))(params), jax.jit(jax.value_and_grad(expanded))(params)
  np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), g1, g2)
  assert packed.tokens.size < sum(p.size for p in paths)


def test_a_tree_mask_of_the_wrong_shape_is_refused():
  params = init_params(CFG, jax.random.key(0))
  with pytest.raises(ValueError, match=r"tree_mask must be \[B, T, T\]"):
    _forward(params, jnp.zeros((1, 4), jnp.int32), jnp.arange(4)[None], jnp.ones((1, 4, 3), bool))
