"""LoRA (rlkit/models/lora.py): adapters with B = 0 are exactly the base model; merged == unmerged logits and
samples (the KV-cache sampler, with the decode layout) up to float rounding; the Hugging Face export merges;
the trainable mask (adapters + value heads); the section's checks."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlkit.models import lora
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rollout.sampler import SamplingConfig, generate
from tests.fast_compile import fast_compile

# GQA with 2 query heads per KV head, so the qkv [D, KV, G+2, hd] and o [KV, G, hd, D] views are non-trivial.
CFG = TransformerConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, tie_word_embeddings=False)
MODEL = Transformer(CFG)
TOKENS = jax.random.randint(jax.random.key(1), (2, 7), 0, CFG.vocab_size)


def _section(**fields):
  s = lora.lora_defaults()
  s.update(dict(rank=3, alpha=6.0), **fields)
  return s


@pytest.fixture(scope="module")
def base():
  return init_params(CFG, jax.random.key(0))


def _trained(params):
  """Adapters with every B (and A) moved off its initial value, as after training."""
  def walk(tree, i=0):
    out = {}
    for k, v in tree.items():
      if isinstance(v, dict):
        out[k] = walk(v, i + 1)
      elif k.endswith(lora.B):
        out[k] = 0.3 * jax.random.normal(jax.random.fold_in(jax.random.key(7), hash(k) % 1000 + i), v.shape)
      else:
        out[k] = v
    return out
  return walk(params)


@pytest.fixture(scope="module")
def logits_fn():
  with fast_compile():
    yield jax.jit(lambda p: MODEL.apply({"params": p}, TOKENS))


def test_zero_b_adapters_give_exactly_the_base_logits(base, logits_fn):
  p = lora.add_adapters(base, _section(), jax.random.key(2))
  assert p["layers_0"]["attn"]["qkv_lora_a"].shape == (32, 3)
  assert p["layers_0"]["attn"]["qkv_lora_b"].shape == (3, 2 * (2 + 2) * 8)
  assert p["layers_1"]["attn"]["o_lora_a"].shape == (2 * 2 * 8, 3)
  assert p["layers_0"]["mlp"]["gate_up_lora_b"].shape == (3, 2 * 48)
  np.testing.assert_array_equal(logits_fn(p), logits_fn(base))


def test_adapters_change_the_model_and_merging_keeps_its_logits(base, logits_fn):
  p = _trained(lora.add_adapters(base, _section(), jax.random.key(2)))
  merged = lora.merge(p)
  assert jax.tree.structure(merged) == jax.tree.structure(base)
  assert np.abs(logits_fn(p) - logits_fn(base)).max() > 1e-2
  np.testing.assert_allclose(logits_fn(merged), logits_fn(p), rtol=1e-5, atol=1e-5)


def test_targets_rank_and_alpha_act(base, logits_fn):
  """No dead field: `targets` chooses the projections, `rank` the adapters' width, `alpha` their scale."""
  only = lora.add_adapters(base, _section(targets=("down",)), jax.random.key(2))
  assert set(only["layers_0"]["attn"]) == set(base["layers_0"]["attn"])
  assert set(only["layers_0"]["mlp"]) == {"gate_up", "down", "down_lora_a", "down_lora_b", "down_lora_scale"}
  assert lora.add_adapters(base, _section(rank=5), jax.random.key(2))["layers_0"]["mlp"]["down_lora_a"].shape == (48, 5)
  assert lora.add_adapters(base, _section(rank=0), jax.random.key(2)) is base
  a, b = (_trained(lora.add_adapters(base, _section(alpha=alpha), jax.random.key(2))) for alpha in (6.0, 12.0))
  delta = lambda p: logits_fn(p) - logits_fn(base)  # noqa: E731
  assert float(a["layers_0"]["mlp"]["down_lora_scale"]) == 2.0
  assert not np.allclose(delta(a), delta(b), atol=1e-4)


def test_merged_and_unmerged_sampling_give_the_same_samples(base):
  """The sampler (KV cache, decode layout on CPU) draws the same tokens from the adapter path and from the
  merged weights, with log-probs equal up to float rounding (what `lora.merged_sampling` switches)."""
  p = _trained(lora.add_adapters(base, _section(), jax.random.key(2)))
  cfg = SamplingConfig(max_new_tokens=6, temperature=1.0)
  prompt = TOKENS[:, :4]
  mask = jnp.ones_like(prompt, bool)
  with fast_compile():
    unmerged = generate(MODEL, lora.sampling_params(p, _section(merged_sampling=False)), prompt, mask,
                        jax.random.key(3), cfg)
    merged = generate(MODEL, lora.sampling_params(p, _section(merged_sampling=True)), prompt, mask,
                      jax.random.key(3), cfg)
  assert lora.has_adapters(lora.sampling_params(p, _section(merged_sampling=False)))
  assert not lora.has_adapters(lora.sampling_params(p, _section(merged_sampling=True)))
  np.testing.assert_array_equal(unmerged.response, merged.response)
  np.testing.assert_allclose(unmerged.logprobs, merged.logprobs, rtol=1e-5, atol=1e-5)


def test_hf_export_writes_the_merged_weights(base, logits_fn, tmp_path):
  from rlkit.models import hf
  p = _trained(lora.add_adapters(base, _section(), jax.random.key(2)))
  hf.save(tmp_path / "export", MODEL, p)
  _, loaded = hf.load(tmp_path / "export")
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(lora.merge(p))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_trainable_mask_is_the_adapters_and_heads_outside_the_decoder(base):
  p = lora.add_adapters(base, _section(), jax.random.key(2))
  critic = {"decoder": p, "value_head": {"w": jnp.zeros(4), "b": jnp.zeros(())}}
  mask = lora.trainable_mask(critic)
  assert mask["value_head"] == {"w": True, "b": True}
  assert mask["decoder"]["layers_0"]["attn"] == {"qkv": False, "o": False, "q_norm": {"scale": False},
                                                  "k_norm": {"scale": False}, "qkv_lora_a": True,
                                                  "qkv_lora_b": True, "qkv_lora_scale": False,
                                                  "o_lora_a": True, "o_lora_b": True, "o_lora_scale": False}
  assert not mask["decoder"]["embedding"] and not mask["decoder"]["lm_head"]
  assert all(jax.tree.leaves(lora.trainable_mask(base)))


@pytest.mark.parametrize("field,value,needle", [
    ("rank", -1, "rank=-1 must be >= 0"), ("alpha", 0.0, "alpha=0.0 must be > 0"),
    ("targets", ("qkv", "lm_head"), "name one or more of qkv, o, gate_up, down")])
def test_check_names_the_key_and_the_fix(field, value, needle):
  with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
    lora.check(_section(**{field: value}), "model.lora")


def test_check_run_rejects_frozen_roles_with_adapters_and_lora_with_logra():
  from rlkit.core.errors import ConfigError
  from rlkit.train.config import base_config, sft_defaults
  from rlkit.train.rl_config import rl_defaults
  from rlkit.train.config_checks import validate
  from rlkit.train.models import role_model_defaults
  c = base_config()
  c.sft, c.rl = sft_defaults(), rl_defaults()
  c.models.reference = role_model_defaults()
  c.models.reference.lora.rank = 4
  with pytest.raises(ConfigError, match=r"models.reference.lora.rank=4: the role is frozen"):
    validate(c)
  c.models.reference.lora.rank = 0
  c.model.lora.rank = 4
  c.rl.optimizer.name = "logra"
  with pytest.raises(ConfigError, match=r"model.lora.rank=4 with rl.optimizer.name='logra'"):
    validate(c)
  c.rl.optimizer.name = "adamw"
  c.model.lora.targets = ("q",)
  with pytest.raises(ConfigError, match=r"model.lora.targets=\('q',\)"):
    validate(c)
  c.model.lora.targets = ("qkv",)
  validate(c)
  assert isinstance(c.model.lora, ml_collections.ConfigDict)
