"""LoRA and LoGRA in the trainer: an SFT step under LoRA changes the adapters only (and the optimizer holds
state for them only); a role section's `lora` gives that model adapters; an RL run with LoRA (sampling
through the unmerged adapter path) resumes exactly; config validation of the new fields."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.grpo_arith import get_config
from rlkit.models import lora
from rlkit.models.tokenizer import CharTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.optim.optimizers import gradient_path, make_optimizer, optimizer_defaults
from rlkit.rewards import RewardOutput, register_reward
from rlkit.core.errors import ConfigError
from rlkit.train.config_checks import validate
from rlkit.train.metrics import without_timings
from rlkit.train.steps import init_train_state, make_sft_step
from tests.fast_compile import fast_compile
from tests.resume import cut_and_resume


def test_an_sft_step_with_lora_changes_the_adapters_only():
  cfg = TransformerConfig(vocab_size=24, hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
  model = Transformer(cfg)
  section = lora.lora_defaults()
  section.rank = 2
  params = lora.add_adapters(init_params(cfg, jax.random.key(0)), section, jax.random.key(1))
  opt = optimizer_defaults()
  opt.weight_decay = 0.1                      # decays whatever the optimizer holds: it must not reach the base
  tx, path = make_optimizer(opt, 10), gradient_path(opt)
  state = init_train_state(jax.tree.map(jnp.copy, params), tx, path)
  adapter_shapes = sorted(x.shape for x in jax.tree.leaves(path.trainable(params)))
  assert len(adapter_shapes) == 8                # A and B of qkv, o, gate_up, down
  moments = [x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim]
  assert sorted(moments) == sorted(adapter_shapes * 2)          # Adam's m and v of the adapters, nothing else
  tokens = jax.random.randint(jax.random.key(2), (4, 8), 0, cfg.vocab_size)
  batch = {"tokens": tokens, "attention_mask": jnp.ones((4, 8), bool), "loss_mask": jnp.ones((4, 8), bool)}
  with fast_compile():
    step = make_sft_step(model, tx, 1, path)
    for _ in range(2):                            # A's gradient is 0 while B = 0: it moves on the second step
      state, m = step(state, batch, {})
  assert int(m["skipped_updates"].value) == 0
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  for (keypath, before), after in zip(flat, jax.tree.leaves(state.params)):
    name = keypath[-1].key
    if name.endswith((lora.A, lora.B)):
      assert not np.array_equal(before, after), name
    else:
      np.testing.assert_array_equal(before, after, err_msg=name)


def test_a_role_sections_lora_gives_that_model_adapters():
  from rlkit.train.models import build_models, role_model_defaults
  import ml_collections
  models = ml_collections.ConfigDict()
  models.critic = role_model_defaults()
  models.critic.update(hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2, num_kv_heads=1,
                       head_dim=8, trainable=True)
  models.critic.lora.rank = 2
  models.critic.lora.targets = ("o",)
  from rlkit.parallel.mesh import make_mesh
  built = build_models(models, CharTokenizer(), jax.random.key(0), make_mesh({"data": -1}))
  attn = built["critic"].params["layers_0"]["attn"]
  assert attn["o_lora_a"].shape == (16, 2) and "qkv_lora_a" not in attn
  assert not lora.has_adapters(built["critic"].params["layers_0"]["mlp"])


@register_reward("test_lowrank_digits")
def _make_digits_reward(task, executor):
  """The number of digits in the completion: an untrained policy's groups have reward variance (the task's
  verifier gives them all 0, and zero advantages would leave nothing to resume)."""
  del task, executor

  def reward_fn(batch):
    r = np.array([sum(c.isdigit() for c in text) for text in batch.completions], np.float64)
    return RewardOutput(rewards=r, correct=r > 2, components={}, failures={})
  return reward_fn


def _rl_config(**lora_fields):
  c = get_config("test")
  c.stages = ("rl",)
  del c["sft"]
  c.data.num_train, c.data.num_test = 64, 0        # no held-out split: no evaluation to compile
  # 8 rows per batch: the tests' 8 simulated devices
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 2, 4, 2, 3
  c.rl.optimizer.lr = 1e-2
  c.model.num_layers = 1
  c.rl.reward.name, c.rl.reward.timeout_s = "test_lowrank_digits", 0.0     # inline: no worker process
  c.checkpoint.every = 1
  c.model.lora.update(lora_fields)
  validate(c)
  return c


def test_an_rl_run_with_lora_resumes_exactly(tmp_path, monkeypatch):
  """The RL stage with LoRA adapters on the policy (the sampler on the unmerged adapter path) for 2 steps,
  against the same run interrupted after its step-1 checkpoint and resumed: identical metrics rows
  (losses, gradient norms, rewards)."""
  config = _rl_config(rank=4, alpha=8.0, merged_sampling=False)
  reference, resumed = cut_and_resume(config, tmp_path, monkeypatch, 1)
  assert [r["step"] for r in reference if "loss" in r] == [1, 2]
  assert all(r["grad_norm"] > 0 for r in reference if "loss" in r)
  assert without_timings(resumed) == without_timings(reference)
  # The run's policy loads (as a model path, or for a Hugging Face export) with its adapters merged.
  from rlkit.train.checkpoint import CheckpointReader
  from rlkit.train.models import load_model
  module, loaded, _ = load_model(str(tmp_path / "ref"))
  reader = CheckpointReader(str(tmp_path / "ref" / "checkpoints"))
  saved = reader.saved_params(2)
  assert lora.has_adapters(saved) and not lora.has_adapters(loaded)
  one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=one), saved)
  raw = reader.restore_params(2, target)
  reader.close()
  assert np.abs(np.asarray(raw["layers_0"]["mlp"]["down_lora_b"])).max() > 0          # the adapters trained
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(lora.merge(raw))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_validation_names_the_new_keys():
  c = _rl_config()
  for key, value, needle in (("rl.optimizer.logra_rank", 0, "rl.optimizer.logra_rank=0 must be >= 1"),
                             ("rl.optimizer.logra_targets", ("lm_head",), "rl.optimizer.logra_targets"),
                             ("rl.optimizer.kl_target", -1.0, "rl.optimizer.kl_target=-1.0 must be >= 0"),
                             ("rl.critic.optimizer.logra_b2", 1.0, "rl.critic.optimizer.logra_b2=1.0"),
                             ("model.lora.alpha", -1.0, "model.lora.alpha=-1.0 must be > 0")):
    bad = _rl_config()
    section, field = key.rsplit(".", 1)
    target = bad
    for part in section.split("."):
      target = target[part]
    target[field] = value
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
      validate(bad)
  c.rl.optimizer.name = "logra"
  validate(c)
