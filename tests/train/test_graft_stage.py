"""The `graft` stage in-process: two policies sample the same prompts, the policy's all-fail groups receive the
peer's successes (and the other way round), each trains with its own optimizer state, the peer is evaluated."""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.types import ROW_SOURCE
from rlkit.models.transformer import init_params
from rlkit.train import graft_stage, rl_stage
from rlkit.core.errors import ConfigError
from rlkit.train.config import base_config
from rlkit.train.models import Model
from rlkit.train.catalog import STAGES
from rlkit.train.stages import Context
import test_stages as ts   # the RL stage's test components (pytest's rootdir import: the same module object)


def _cfg(**overrides):
  cfg = graft_stage.graft_defaults()
  cfg.update(dict(steps=2, prompts_per_step=8, group_size=ts.GROUP, max_new_tokens=ts.MAX_NEW, ppo_epochs=1))
  cfg.reward.name, cfg.reward.timeout_s = "test_stages_digits", 0.0
  STAGES.get("graft").validate(ts.override(cfg, overrides), "graft")
  return cfg


def _run(cfg):
  config = base_config()
  config.data.max_prompt_len = 5
  config.eval.update(batch_size=8, max_new_tokens=ts.MAX_NEW, pass_k=0)
  rng = np.random.default_rng(0)
  source = [dict(ts.TASK.make_example(rng)) for _ in range(64)]
  evals = [dict(ts.TASK.make_example(rng)) for _ in range(8)]
  peer = Model(ts.MODEL, init_params(ts.MODEL.cfg, jax.random.key(7)), ts.TOK, True)
  logger = ts._Log()
  ctx = Context(config=config, model=ts.MODEL, tokenizer=ts.TOK, task=ts.TASK, train_source=source,
                eval_records=evals, logger=logger, checkpointer=ts._NoCkpt(), key=jax.random.key(1),
                put_batch=lambda b: b, models={"peer": peer})
  grafts, batches = [], []
  graft_rows, ppo_updates = graft_stage.graft_rows, rl_stage.ppo_updates

  def record_graft(own, own_rewards, other, other_rewards, group, k):
    out = graft_rows(own, own_rewards, other, other_rewards, group, k)
    grafts.append((own_rewards, other_rewards, out))
    return out

  def record_update(step_fn, train, batch, *a, **kw):
    batches.append(jax.device_get(batch))
    return ppo_updates(step_fn, train, batch, *a, **kw)

  with contextlib.ExitStack() as stack:
    stack.enter_context(ts._fast_compile())
    for module, name, fn in ((graft_stage, "graft_rows", record_graft), (rl_stage, "ppo_updates", record_update)):
      stack.callback(setattr, module, name, getattr(module, name))
      setattr(module, name, fn)
    stage = STAGES.get("graft")
    init = ts._initial_params()
    state = stage.init(ctx, cfg, jax.tree.map(jnp.copy, init))
    state = stage.run(ctx, cfg, state, 0, {"stage": "graft", "stage_index": 0, "offset": 0})
  return state, logger.rows, grafts, batches, init, peer


@pytest.fixture(scope="module")
def graft_run():
  return _run(_cfg())


def test_peer_successes_join_only_groups_the_policy_fails(graft_run):
  _, rows, grafts, batches, _, _ = graft_run
  group, k = ts.GROUP, 2
  rescued = 0
  for own_rewards, other_rewards, (samples, rewards, n) in grafts:
    own = np.asarray(own_rewards.correct).reshape(-1, group)
    source = samples.row_source.reshape(-1, group + k)
    peer_rows = source == ROW_SOURCE["peer"]
    assert not (peer_rows.any(1) & own.any(1)).any()               # never into a group with a success
    assert (np.asarray(rewards.correct).reshape(-1, group + k)[peer_rows]).all()   # only successes
    assert peer_rows.any(1).sum() == n
    rescued += n
  assert rescued > 0, "the fixture's seeds must produce at least one rescue to test"
  train_rows = [r for r in rows if "loss" in r]
  assert sum(r["graft/groups_rescued"] + r["peer/graft/groups_rescued"] for r in train_rows) == rescued


def test_peer_rows_carry_truncated_weights_of_the_two_policies_ratio(graft_run):
  _, _, _, batches, _, _ = graft_run
  seen = 0
  for b in batches:
    peer = (np.asarray(b.row_source) == ROW_SOURCE["peer"])[:, None] & np.asarray(b.loss_mask)
    ratio = np.exp(np.asarray(b.old_logp) - np.asarray(b.rollout_logp))
    np.testing.assert_allclose(np.asarray(b.token_weights)[peer], np.minimum(ratio, 2.0)[peer], rtol=1e-5)
    assert (np.asarray(b.advantages)[peer] > 0).all()                # positive_only
    seen += peer.sum()
  assert seen > 0


def test_both_policies_train_and_the_peer_is_evaluated(graft_run):
  state, rows, _, _, init, peer = graft_run
  moved = lambda a, b: max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))  # noqa
  assert moved(state["train"].params, init) > 0 and moved(state["peer"]["train"].params, peer.params) > 0
  assert int(state["peer"]["train"].step) == 2 and int(state["train"].step) == 2
  train_rows = [r for r in rows if "loss" in r]                      # (the loop logs evaluations apart)
  assert "peer/eval/accuracy" in train_rows[-1] and "peer/eval/accuracy" not in train_rows[0]
  assert "eval/accuracy" in rows[-1]                                   # the policy's own, by the loop
  assert "peer/reward" in train_rows[0] and "graft/rows" in train_rows[0] and "peer/loss" in train_rows[0]


def test_zero_rows_is_no_exchange_that_counts_the_groups_it_would_rescue():
  from types import SimpleNamespace
  own = SimpleNamespace(correct=np.array([0, 0, 0, 1, 0, 0]), rewards=None)     # groups of 2: fail, mixed, fail
  peer = SimpleNamespace(correct=np.array([1, 0, 1, 1, 0, 0]), rewards=None)
  samples = object()
  got = graft_stage.graft_rows(samples, own, object(), peer, 2, 0)
  assert got[0] is samples and got[1] is own and got[2] == 1     # only group 0: all-fail, and the peer solved it
  _cfg(**{"graft.rows": 0})                                       # a valid setting (the independent baseline)
  with pytest.raises(ConfigError, match="rows >= 0"):
    _cfg(**{"graft.rows": -1})


def test_graft_config_errors():
  with pytest.raises(ConfigError, match="augment='none'"):
    _cfg(augment="demonstration")
  with pytest.raises(ConfigError, match="geo_low"):
    _cfg(**{"graft.geo_low": 3.0})
  config = base_config()
  config.stages = ("graft",)
  config.graft = _cfg()
  from rlkit.train.config_checks import validate
  with pytest.raises(ConfigError, match="config.models.peer with trainable=True"):
    validate(config)
