"""The elastic rule and the rollout/training simulation (rlkit/rollout/elastic.py): the rule's moves and bounds;
the simulation equals hand computations on deterministic workloads, never trains past the staleness bound, and
its elastic split moves toward the side that is short."""
import pytest

from rlkit.rollout.elastic import QueueRule, Workload, simulate


def test_the_rule_moves_one_device_toward_the_short_side_within_bounds():
  rule = QueueRule(devices=8, high=2.0, low=1.0)
  assert rule.decide(4, ready=200, batch=64) == 3           # samples pile up: the learner is short
  assert rule.decide(4, ready=10, batch=64) == 5            # the learner waits: rollout is short
  assert rule.decide(4, ready=64, batch=64) == 4
  assert rule.decide(7, ready=0, batch=64) == 7 and rule.decide(1, ready=999, batch=64) == 1
  with pytest.raises(ValueError, match="cannot hold"):
    QueueRule(devices=1)


def test_colocate_equals_the_hand_computation():
  w = Workload(batch=8, gen_mean_s=1.0, gen_sigma=0.0, train_s1=4.0, train_alpha=1.0, sync_s=0.5)
  r = simulate("colocate", 4, w, steps=3)
  step = 2 * 1.0 + 4.0 / 4 + 0.5                              # two samples per device, then train on four
  assert r.throughput == pytest.approx(8 / step)


def test_async_is_bounded_by_the_slower_side():
  rollout_bound = Workload(batch=1, gen_mean_s=1.0, gen_sigma=0.0, train_s1=0.25, train_alpha=0.0)
  r = simulate("async", 2, rollout_bound, steps=200, rollout=1, staleness=1)
  assert r.throughput == pytest.approx(1.0, rel=0.02)         # one device makes one sample a second
  learner_bound = Workload(batch=4, gen_mean_s=0.1, gen_sigma=0.0, train_s1=2.0, train_alpha=0.0)
  r = simulate("async", 8, learner_bound, steps=100, rollout=4, staleness=4)
  assert r.throughput == pytest.approx(4 / 2.0, rel=0.03) and r.learner_idle < 0.05


@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_no_sample_is_trained_past_the_bound(staleness):
  w = Workload(batch=16, gen_mean_s=1.0, gen_sigma=1.2, train_s1=8.0)
  r = simulate("async", 16, w, steps=30, staleness=staleness)
  assert r.staleness_max <= staleness
  assert simulate("elastic", 16, w, steps=30, staleness=staleness).staleness_max <= staleness


def test_the_elastic_split_follows_the_bottleneck():
  slow_rollout = Workload(batch=16, gen_mean_s=4.0, gen_sigma=0.3, train_s1=2.0, train_alpha=1.0)
  slow_learner = Workload(batch=16, gen_mean_s=0.2, gen_sigma=0.3, train_s1=32.0, train_alpha=1.0)
  assert simulate("elastic", 16, slow_rollout, steps=40, staleness=2).rollout_mean > 8
  assert simulate("elastic", 16, slow_learner, steps=40, staleness=2).rollout_mean < 8
  with pytest.raises(ValueError, match="not one of colocate, async, elastic"):
    simulate("ring", 4, slow_rollout)
