"""The asynchronous collector in the trainer (rlkit/train/async_collect.py): one-step-off-policy GRPO with partial
rollouts, elastic workers and workers dying at random trains within the staleness bound on every sample exactly
once, and a run killed mid-iteration resumes to the uninterrupted metrics (the pool's queue, cursor and size are
in the checkpoint); the same collector on Ray actors; every field acts; settings checked by name. (Staleness 0,
the synchronous case, is tests/rollout/test_async_rollout.py's.)"""
import pytest

from configs.grpo_arith import get_config
from rlkit.core.errors import ConfigError
from rlkit.train import async_collect, stages
from rlkit.train.metrics import read_metrics, without_timings
from rlkit.train.rl_stage import validate
from tests.fast_compile import fast_compile


def _config(**fields):
  c = get_config("test")
  c.stages = ("rl",)
  c.rl.collector = "async"
  c.rl.eval_every = 0
  c.eval.num_examples = 0
  c.checkpoint.every = 1
  c.rl.async_rollout.update(fields)
  return c


def _rl_rows(path):
  return [r for r in read_metrics(str(path / "metrics.jsonl")) if "loss" in r]


class _Interrupted(Exception):
  pass


def test_off_policy_partial_rollouts_resume_to_the_uninterrupted_run(tmp_path, monkeypatch):
  from rlkit.train.run import run
  config = _config(prefetch=1, max_staleness=1, chunk_tokens=2, items_per_call=4, workers=1, elastic=True,
                   max_workers=3,          # the pool grows while the learner waits: its size is resumed too
                   fault_rate=0.3,         # and workers die at random: replaced, their samples requeued ...
                   max_attempts=8)         # ... and (0.3^8) never dropped
  with fast_compile():
    run(config, str(tmp_path / "ref"))
    save, call = stages.save, async_collect.AsyncCollector.__call__
    saved = []

    def save_and_mark(ctx, state, global_step, meta, force):
      save(ctx, state, global_step, meta, force)
      saved.append(global_step)

    def dies_in_iteration_three(self, *args, **kwargs):
      if saved == [1, 2]:              # iteration 3 starts with a queue of prefetched, half-sampled groups
        raise _Interrupted()
      return call(self, *args, **kwargs)
    monkeypatch.setattr(stages, "save", save_and_mark)
    monkeypatch.setattr(async_collect.AsyncCollector, "__call__", dies_in_iteration_three)
    with pytest.raises(_Interrupted):
      run(config, str(tmp_path / "cut"))
    monkeypatch.setattr(async_collect.AsyncCollector, "__call__", call)
    run(config, str(tmp_path / "cut"))
  rows = _rl_rows(tmp_path / "ref")
  assert [r["collect/async_staleness_max"] for r in rows][1:] == [1, 1, 1]   # trained one version behind
  assert rows[0]["collect/async_submitted"] == 32          # its own batch and one ahead
  assert [r["collect/async_workers"] for r in rows] == [2, 3, 3, 3]      # 1 worker grew to max_workers
  assert all(r["collect/async_delivered"] == 16 and r["collect/async_dropped_failed"] == 0 for r in rows)
  assert sum(r["collect/async_crashes"] for r in rows) > 0                # workers died; none doubled or lost
  assert sum(r["collect/async_replaced"] for r in rows) == sum(r["collect/async_crashes"] for r in rows)
  assert without_timings(_rl_rows(tmp_path / "cut")) == without_timings(rows)


def test_the_trainer_runs_on_ray_workers(tmp_path):
  pytest.importorskip("ray")
  import ray
  from rlkit.train.run import run
  config = _config(backend="ray", workers=1, num_cpus=0.5, prefetch=1, max_staleness=1)
  config.rl.steps = 2
  try:
    with fast_compile():
      run(config, str(tmp_path))
  finally:
    ray.shutdown()
  rows = _rl_rows(tmp_path)
  assert len(rows) == 2 and all(r["collect/async_delivered"] == 16 for r in rows)


@pytest.mark.parametrize("fields,match", [({"backend": "threads"}, "backend"),
                                          ({"stale": "keep"}, "stale='keep'"),
                                          ({"prefetch": 2, "max_staleness": 1}, "prefetch=2"),
                                          ({"workers": 0}, "workers=0"),
                                          ({"fault_rate": 1.0}, "fault_rate=1.0")])
def test_settings_are_checked_by_name(fields, match):
  with pytest.raises(ConfigError, match=match):
    validate(_config(**fields).rl, "rl")


def test_every_async_field_acts():
  """Each field of rl.async_rollout flips what the scheduler is built with (pool_arguments), what the elastic
  step decides (elastic_workers), or, for prefetch and elastic themselves, the runs above."""
  from rlkit.rollout.distribution import SamplingConfig
  from rlkit.train.rl_config import rl_defaults
  sampling = SamplingConfig(max_new_tokens=16)

  def built(**fields):
    a = rl_defaults().async_rollout
    a.update(fields)
    factory, kwargs = async_collect.pool_arguments(a, None, sampling, seed=3)
    return factory.args + (factory.keywords,), kwargs

  base = built()
  flips = {"backend": "ray", "workers": 3, "items_per_call": 2, "chunk_tokens": 4, "max_staleness": 2,
           "stale": "drop", "timeout_s": 5.0, "max_attempts": 1, "fault_rate": 0.5}
  for key, value in flips.items():
    assert built(**{key: value}) != base, key
  ray = built(backend="ray")
  for key, value in {"address": "auto", "num_cpus": 0.5}.items():
    assert built(backend="ray", **{key: value}) != ray, key
  a = _config().rl.async_rollout
  assert async_collect.elastic_workers(a, 2, ready=20, n=16) == 2
  for key, value, want in (("elastic_low", 1.5, 3), ("elastic_high", 1.2, 1), ("max_workers", 1, 1)):
    flipped = _config(**{key: value}).rl.async_rollout
    assert async_collect.elastic_workers(flipped, 2, ready=20, n=16) == want, key
