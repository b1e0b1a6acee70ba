"""rl.policy=llm_tree: each group's prompt computed once in a packed tree gives the expanded rows' log-probs and
gradients (1e-5), in any row order; the stage trains with it as with `llm`; its requirements are config errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rollout.scoring import response_forward
from rlkit.train.rl_config import rl_defaults
from rlkit.train.catalog import STAGES
from rlkit.train.tree_policy import tree_logits

CFG = TransformerConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, rope_theta=10_000.0)
G, P, R = 4, 6, 5


def _batch():
  """3 groups of G rows in shuffled order: each group one left-padded prompt, responses of varying lengths."""
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, CFG.vocab_size, (3, P))
  prompt_mask = np.arange(P)[None, :] >= np.array([0, 2, 4])[:, None]
  rows = np.repeat(np.arange(3), G)
  response = rng.integers(3, CFG.vocab_size, (3 * G, R))
  response_mask = np.arange(R)[None, :] < rng.integers(1, R + 1, 3 * G)[:, None]
  tokens = np.concatenate([np.where(prompt_mask, prompts, 0)[rows], np.where(response_mask, response, 0)], 1)
  mask = np.concatenate([prompt_mask[rows], response_mask], 1)
  perm = rng.permutation(3 * G)
  return (jnp.asarray(tokens[perm], jnp.int32), jnp.asarray(mask[perm]), jnp.asarray(rows[perm], jnp.int32),
          jnp.asarray(response_mask[perm]))


def test_tree_logits_and_gradients_equal_the_expanded_rows():
  model, params = Transformer(CFG), init_params(CFG, jax.random.key(0))
  tokens, mask, groups, response_mask = _batch()
  weights = jnp.asarray(np.random.default_rng(1).normal(size=response_mask.shape), jnp.float32) * response_mask

  def logp(params, tree):
    logits = (tree_logits(model, params, tokens, mask, groups, R, G) if tree else
              response_forward(model, params, tokens, mask, R)[0])
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, -R:, None], -1)[..., 0]
    return jnp.sum(lp * weights), lp

  # jitted: eager, op by op, the two backward passes took ~25 s
  grad = jax.jit(jax.value_and_grad(logp, has_aux=True), static_argnums=1)
  (loss_t, lp_t), grad_t = grad(params, True)
  (loss_e, lp_e), grad_e = grad(params, False)
  np.testing.assert_allclose(np.asarray(lp_t)[response_mask], np.asarray(lp_e)[response_mask], atol=1e-5)
  np.testing.assert_allclose(loss_t, loss_e, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grad_t), jax.tree.leaves(grad_e)):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("key,value", [("minibatches", 2), ("micro_batches", 2), ("augment", "demonstration"),
                                       ("replay_routing", True)])
def test_llm_tree_names_each_setting_it_needs(key, value):
  cfg = rl_defaults()
  cfg.policy = "llm_tree"
  cfg[key] = value
  with pytest.raises(ValueError, match=f"rl.{key}="):
    STAGES.get("rl").validate(cfg, "rl")
