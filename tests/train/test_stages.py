"""The RL stage in-process: every stage-level switch changes what one iteration does (no dead flags)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.data.tasks import make_task
from rlkit.models.tokenizer import CharTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.train.config import rl_defaults
from rlkit.train.stages import STAGES, Context

TOK = CharTokenizer()
MODEL = Transformer(TransformerConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=48,
                                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                                      tie_word_embeddings=True, rope_theta=10_000.0))
TASK = make_task("arithmetic", ops="+", min_digits=1, max_digits=1)


class _Log:
  def __init__(self):
    self.rows = []

  def log(self, step, stage, metrics, show=()):
    self.rows.append(dict(metrics, step=step, stage=stage))

  def start_stage(self, *a, **k):
    pass

  def advance(self, n=1):
    pass

  def close_bar(self):
    pass


class _NoCkpt:
  def should_save(self, step):
    return False

  def save(self, *a):
    pass


def _one_iteration(**overrides):
  import ml_collections
  config = ml_collections.ConfigDict({"seed": 0, "data": {"max_prompt_len": 5},
                                      "eval": {"batch_size": 8, "max_new_tokens": 3, "pass_k": 0}})
  rng = np.random.default_rng(0)
  source = [dict(TASK.make_example(rng)) for _ in range(64)]
  cfg = rl_defaults()
  # verifier_format gives 0.1 to any completion that starts with a number, so even an untrained model's
  # groups have reward variance and every switch has something to act on.
  cfg.update(dict(steps=1, prompts_per_step=8, group_size=4, max_new_tokens=3, reward="verifier_format"))
  cfg.update(overrides)
  params = init_params(MODEL.cfg, jax.random.key(0))
  ctx = Context(config=config, model=MODEL, tokenizer=TOK, task=TASK, train_source=source, eval_records=[],
                logger=_Log(), checkpointer=_NoCkpt(), key=jax.random.key(1), put_batch=lambda b: b)
  stage = STAGES.get("rl")
  # The step donates its state, so the stage gets its own copy of the initial parameters.
  state = stage.init(ctx, cfg, jax.tree.map(jnp.copy, params))
  state = stage.run(ctx, cfg, state, 0, {"stage": "rl", "stage_index": 0, "offset": 0})
  delta = np.concatenate([np.ravel(a - b) for a, b in zip(jax.tree.leaves(state["train"].params),
                                                          jax.tree.leaves(params))])
  return ctx.logger.rows[0], delta


FLIPS = {
    "temperature": 0.5, "top_k": 3, "top_p": 0.5, "reward": "verifier", "advantage": "rloo",
    "ppo_epochs": 2, "minibatches": 2, "micro_batches": 2, "kl_beta": 0.5, "dynamic_sampling": True,
    "overlong_cache": 2, "adv_eps": 10.0,
}


@pytest.fixture(scope="module")
def baseline():
  metrics, delta = _one_iteration()
  assert metrics["informative_groups"] > 0, "the baseline must have reward variance to test the switches"
  return metrics, delta


@pytest.mark.parametrize("field", sorted(FLIPS))
def test_every_rl_stage_switch_changes_the_iteration(baseline, field):
  metrics, delta = _one_iteration(**{field: FLIPS[field]})
  base_metrics, base_delta = baseline
  if field == "micro_batches":   # same maths by design: only the memory profile may differ
    np.testing.assert_allclose(delta, base_delta, atol=1e-6)
    return
  changed_update = not np.allclose(delta, base_delta, atol=1e-9)
  changed_metrics = any(not np.isclose(metrics[k], base_metrics.get(k, np.nan))
                        for k in ("reward", "loss", "entropy", "kl", "sampling_rounds", "response_len")
                        if k in metrics)
  assert changed_update or changed_metrics, field


def test_mismatch_is_logged_and_tiny_on_policy(baseline):
  metrics, _ = baseline
  assert 0 <= metrics["mismatch/mean"] < 1e-4 and metrics["mismatch/max"] < 1e-3
