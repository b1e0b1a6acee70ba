"""`optimizer.frozen` (rlkit/optim/optimizers.py): the leaves a pattern matches never change, bit for bit, through
the optimizer (as if they were not parameters: no state, no weight decay, no share of the clipped norm), with
LoRA, LoGRA and predicted-KL control, and through the real trainer's SFT and RL stages of a tiny MoE model with
a frozen router, resumed from a checkpoint; a pattern that matches nothing is a ConfigError naming real paths."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.grpo_arith import get_config
from rlkit.core.errors import ConfigError
from rlkit.models import lora
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.optim.optimizers import check, gradient_path, make_optimizer, optimizer_defaults
from rlkit.parallel.rules import path_str
from rlkit.rewards import RewardOutput, register_reward
from rlkit.train import sft_stage, stages
from rlkit.train.config_checks import validate
from rlkit.train.metrics import read_metrics, without_timings
from rlkit.train.steps import init_train_state, make_sft_step
from tests.fast_compile import fast_compile


def _bits(x):
  return np.asarray(x).view(np.uint32)


def _optimizer(**fields):
  c = optimizer_defaults()
  c.update(dict(weight_decay=0.1, clip_norm=1.0, lr=0.1))       # decay and clipping both act
  c.update(fields)
  return c


def _steps(tx, params, grads, **extra):
  state, out = tx.init(params), []
  for g in grads:
    u, state = tx.update(g, state, params, **extra)
    params = optax.apply_updates(params, u)
    out.append(u)
  return params, out, state


PARAMS = {"a": jnp.linspace(-1.0, 1.0, 6), "b": jnp.asarray([[0.5, -0.0], [-2.0, 3.0]]),
          "moe": {"router": jnp.asarray([-0.0, 0.0, 1.5, -7.0])}}
GRADS = [jax.tree.map(lambda x, s=s: (jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape) - 1.5) * s, PARAMS)
         for s in (3.0, -1.0, 0.5)]


def test_frozen_leaves_are_not_parameters_to_the_optimizer():
  """The router's updates are -0.0 (so even its -0.0 keeps its sign), the optimizer keeps no state for it, and
  the other leaves move exactly as under the same optimizer without the router in the tree at all (its large
  gradient enters neither the clipped norm nor Adam)."""
  frozen, updates, state = _steps(make_optimizer(_optimizer(frozen="moe/router$"), 10), PARAMS, GRADS)
  np.testing.assert_array_equal(_bits(frozen["moe"]["router"]), _bits(PARAMS["moe"]["router"]))
  assert all(np.all(np.signbit(u["moe"]["router"])) and not np.any(u["moe"]["router"]) for u in updates)
  assert not np.any([x.shape == (4,) for x in jax.tree.leaves(state)])         # no moments of the router
  without = {k: v for k, v in PARAMS.items() if k != "moe"}
  alone, _, _ = _steps(make_optimizer(_optimizer(), 10), without, [{k: g[k] for k in without} for g in GRADS])
  for k in without:
    np.testing.assert_array_equal(_bits(frozen[k]), _bits(alone[k]))
    assert not np.array_equal(frozen[k], PARAMS[k])
  # With nothing frozen the router moves (weight decay and its gradient), and so do the others differently.
  moved, _, _ = _steps(make_optimizer(_optimizer(), 10), PARAMS, GRADS)
  assert not np.array_equal(moved["moe"]["router"], PARAMS["moe"]["router"])
  assert not np.array_equal(moved["a"], alone["a"])


def test_frozen_under_predicted_kl_control_and_sgd():
  """Two patterns in one regex; the KL control wraps the partition (its probe sees the frozen leaves' zero
  displacement), and plain SGD."""
  probe = lambda d: sum(jnp.sum(x ** 2) for x in jax.tree.leaves(d))     # noqa: E731 (a stand-in quadratic)
  for fields in ({"kl_target": 1e-4}, {"name": "sgd", "b1": 0.0}):
    tx = make_optimizer(_optimizer(frozen="router|^b$", **fields), 10)
    out, _, _ = _steps(tx, PARAMS, GRADS, **({"kl_probe": probe} if "kl_target" in fields else {}))
    np.testing.assert_array_equal(_bits(out["b"]), _bits(PARAMS["b"]))
    np.testing.assert_array_equal(_bits(out["moe"]["router"]), _bits(PARAMS["moe"]["router"]))
    assert not np.array_equal(out["a"], PARAMS["a"]), fields


def test_a_pattern_that_matches_nothing_names_the_real_paths():
  tx = make_optimizer(_optimizer(frozen="router$"), 10)
  tx.init(PARAMS)                                                        # moe/router
  with pytest.raises(ConfigError, match=r"optimizer.frozen='gate' matches none of the 3 parameters.*a, b, moe/router"):
    make_optimizer(_optimizer(frozen="gate"), 10).init(PARAMS)
  with pytest.raises(ConfigError, match=r"rl.optimizer.frozen='\(router' is not a regular expression"):
    check(_optimizer(frozen="(router"), "rl.optimizer")
  check(_optimizer(frozen="moe/router$"), "rl.optimizer")


# --------------------------------------------------------------------------------- LoRA and LoGRA paths

CFG = TransformerConfig(vocab_size=24, hidden_size=16, intermediate_size=24, num_layers=2, num_heads=2,
                        num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
BATCH = {"tokens": jax.random.randint(jax.random.key(2), (4, 8), 0, CFG.vocab_size),
         "attention_mask": jnp.ones((4, 8), bool), "loss_mask": jnp.ones((4, 8), bool)}


def _sft_steps(params, opt, n=2):
  tx, path = make_optimizer(opt, 10), gradient_path(opt)
  state = init_train_state(jax.tree.map(jnp.copy, params), tx, path)
  with fast_compile():
    step = make_sft_step(Transformer(CFG), tx, 1, path)
    for _ in range(n):
      state, m = step(state, BATCH, {})
  assert int(m["skipped_updates"].value) == 0
  return state


def _changed(before, after) -> dict:
  return {path_str(p): not np.array_equal(_bits(a), _bits(b)) for (p, a), b in
          zip(jax.tree_util.tree_flatten_with_path(before)[0], jax.tree.leaves(after))}


def test_frozen_adapters_under_lora():
  """With LoRA the optimizer updates the adapters: a pattern over their paths freezes them (layer 0's), and one
  that matches base weights only is refused (they are frozen by LoRA already)."""
  section = lora.lora_defaults()
  section.rank = 2
  params = lora.add_adapters(init_params(CFG, jax.random.key(0)), section, jax.random.key(1))
  changed = _changed(params, _sft_steps(params, _optimizer(lr=1e-2, frozen="layers_0/.*_lora_")).params)
  adapters = {p: c for p, c in changed.items() if p.endswith(("_lora_a", "_lora_b"))}
  assert len(adapters) == 16
  assert not any(c for p, c in adapters.items() if p.startswith("layers_0/"))
  assert all(c for p, c in adapters.items() if p.startswith("layers_1/"))
  assert not any(c for p, c in changed.items() if p not in adapters)       # the base, as LoRA keeps it
  with pytest.raises(ConfigError, match=r"matches none .*with LoRA: the adapters.*_lora_a"):
    _sft_steps(params, _optimizer(frozen="final_norm"))


def test_frozen_leaves_beside_logra_sketches():
  """Under LoGRA the norms freeze while the sketched kernels and the embedding train; freezing a sketched
  kernel is refused."""
  params = init_params(CFG, jax.random.key(0))
  opt = _optimizer(name="logra", logra_rank=2, lr=1e-2, frozen="final_norm|attn_norm")
  changed = _changed(params, _sft_steps(params, opt).params)
  assert not any(c for p, c in changed.items() if "norm/" in p and ("final_norm" in p or "attn_norm" in p))
  assert changed["layers_0/attn/qkv"] and changed["layers_1/mlp/down"] and changed["embedding"]
  assert changed["layers_0/mlp_norm/scale"]                  # a norm the pattern leaves to AdamW (and its decay)
  with pytest.raises(ConfigError, match=r"layers_0/attn/qkv.*LoGRA trains on sketches"):
    _sft_steps(params, _optimizer(name="logra", logra_rank=2, frozen="attn/qkv$"))


# ------------------------------------------------------------------------------- the real trainer, resumed

class _Interrupted(Exception):
  pass


@register_reward("test_frozen_digits")
def _make_digits_reward(task, executor):
  """The number of digits in the completion: an untrained policy's groups have reward variance (the task's
  verifier gives them all 0, and zero advantages would leave the RL steps nothing to update)."""
  del task, executor

  def reward_fn(batch):
    r = np.array([sum(c.isdigit() for c in text) for text in batch.completions], np.float64)
    return RewardOutput(rewards=r, correct=r > 2, components={}, failures={})
  return reward_fn


def _moe_config():
  """The main job's test preset on a 1-layer MoE (4 experts, top 2): 2 SFT then 2 RL steps, every step
  checkpointed, the router frozen in both stages; RL samples from an FP4 copy of the experts, replays the
  sampler's experts, combine weights and FP4 rounding (TRACE), and adds the load-balancing loss."""
  c = get_config("test")
  c.model.update(num_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
  c.data.num_train, c.data.num_test = 64, 0        # no held-out split: no evaluation to compile
  c.sft.steps, c.sft.optimizer.lr, c.sft.optimizer.warmup_steps = 2, 1e-2, 0
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 2, 4, 2, 3
  c.rl.optimizer.lr = 1e-2
  c.rl.reward.name, c.rl.reward.timeout_s = "test_frozen_digits", 0.0     # inline: no worker process
  c.rl.replay_routing, c.rl.moe.replay_weights, c.rl.moe.aux_loss_coef = True, True, 0.01   # MoE stability
  c.model.expert_quant, c.rl.moe.trace = "nvfp4", True                     # FP4 experts, TRACE rounding
  c.rl.sync.kind, c.rl.sync.quantizer = "dense", "nvfp4_experts"            # sampled from an FP4 copy
  for stage in ("sft", "rl"):
    c[stage].optimizer.frozen = "moe/router$"
    c[stage].optimizer.weight_decay = 0.1          # it would move the router, were the router in the optimizer
  c.checkpoint.every = 1
  validate(c)
  return c


def test_a_frozen_router_stays_bit_identical_through_sft_rl_and_a_resume(tmp_path, monkeypatch):
  from rlkit.train.run import run
  config = _moe_config()
  initial, saved = [], {}
  init = sft_stage.init_train_state
  monkeypatch.setattr(sft_stage, "init_train_state",
                      lambda params, *a, **k: initial.append(jax.device_get(params)) or init(params, *a, **k))
  save = stages.save

  def recording_save(ctx, state, global_step, meta, force):
    saved.setdefault(ctx.workdir, {})[global_step] = jax.device_get(state["train"].params)
    save(ctx, state, global_step, meta, force)

  def save_then_stop(ctx, state, global_step, meta, force):
    recording_save(ctx, state, global_step, meta, force)
    if global_step == 3:                           # inside the RL stage, after its first step
      raise _Interrupted()

  with fast_compile():
    monkeypatch.setattr(stages, "save", recording_save)
    run(config, str(tmp_path / "ref"))
    monkeypatch.setattr(stages, "save", save_then_stop)
    with pytest.raises(_Interrupted):
      run(config, str(tmp_path / "cut"))
    monkeypatch.setattr(stages, "save", recording_save)
    run(config, str(tmp_path / "cut"))
  reference = read_metrics(str(tmp_path / "ref" / "metrics.jsonl"))
  resumed = read_metrics(str(tmp_path / "cut" / "metrics.jsonl"))
  assert without_timings(resumed) == without_timings(reference)
  assert all(r["grad_norm"] > 0 for r in reference if "grad_norm" in r)
  rl_rows = [r for r in reference if r["stage"] == "rl" and "grad_norm" in r]
  assert rl_rows and all(r["moe/flip_rate"] == 0.0 for r in rl_rows)          # experts and weights replayed
  assert all(r["moe/aux_loss"] > 0 and r["moe/load_cv"] >= 0 and r["moe/peak_load"] >= 1
             and 0 <= r["moe/cold_fraction"] <= 1 for r in rl_rows)
  assert all(r["moe/codeword_mismatch"] < 0.01 for r in rl_rows)   # the trainer rounds as the FP4 rollout did
  start = initial[0]
  router = start["layers_0"]["moe"]["router"]
  for workdir, steps in saved.items():
    assert sorted(steps) == [1, 2, 3, 4], workdir                 # the cut run's step 4: after the resume
    for step, params in steps.items():
      np.testing.assert_array_equal(_bits(params["layers_0"]["moe"]["router"]), _bits(router),
                                    err_msg=f"{workdir} step {step}")
      changed = _changed(start, params)
      assert sum(changed.values()) == len(changed) - 1, (workdir, step, changed)   # every other leaf moved
