"""On-policy distillation on the rl stage, in-process: the teacher is scored in the scoring phase (its sampled-
token log-probs, its whole or top-k distribution), the `opd` advantage is the teacher-student log-prob gap plus
λ times the RL advantage, the divergence terms train and report, every `distill` field changes what it should,
the `distill` stage kind defaults to OPD, and a teacher that is not a model of the run is refused."""
import numpy as np
import pytest

from rlkit.objectives.distill import DIVERGENCES
from rlkit.core.errors import ConfigError
from rlkit.train.config import base_config
from rlkit.train.config_checks import validate
from rlkit.train.catalog import STAGES
import test_stages as ts

OPD = {"advantage": "opd"}


def _adv(run):
  return np.asarray(run.batches[0].advantages)


def test_the_opd_advantage_is_the_teachers_log_prob_gap_on_the_sampled_tokens():
  run = ts.one_iteration(**OPD)
  b = run.batches[0]
  mask = np.asarray(b.loss_mask)
  gap = np.asarray(b.extras["teacher_logp"]) - np.asarray(b.old_logp)
  np.testing.assert_allclose(_adv(run), np.where(mask, gap, 0.0), atol=1e-6)
  assert np.abs(gap[mask]).min() > 0 and np.abs(run.delta).max() > 0   # a different teacher: a real signal


def test_reward_weight_adds_lambda_times_the_group_advantage():
  pure, mixed = ts.one_iteration(**OPD), ts.one_iteration(**OPD, **{"distill.reward_weight": 0.5})
  b = mixed.batches[0]
  mask = np.asarray(b.loss_mask)
  extra = _adv(mixed) - _adv(pure)
  per_row = np.array([row[m].mean() if m.any() else 0.0 for row, m in zip(extra, mask)])
  assert np.abs(per_row).max() > 0
  np.testing.assert_allclose(per_row.reshape(-1, ts.GROUP).mean(1), 0.0, atol=1e-5)   # group advantages sum to 0
  np.testing.assert_allclose(extra[mask], np.repeat(per_row, mask.sum(1)), atol=1e-6)   # constant along a row
  ref = ts.one_iteration(**OPD, **{"distill.reward_weight": 0.5, "distill.reward_advantage": "none"})
  assert not np.allclose(_adv(ref), _adv(mixed))                         # the estimator is the configured one


# Every distillation term in one update (one compile): each reports its own metric.
TERMS = {"loss_terms": {**{name: 1.0 for name in DIVERGENCES}, "opd": 1.0}}


def test_the_terms_train_on_the_teachers_whole_distribution_and_its_sampled_tokens():
  run, baseline = ts.one_iteration(**TERMS), ts.one_iteration()
  b = run.batches[0]
  assert b.extras["teacher_dist_logp"].shape == b.old_logp.shape + (ts.TOK.vocab_size,)
  assert "teacher_dist_ids" not in b.extras and "teacher_logp" in b.extras
  for name in DIVERGENCES:
    assert run.metrics[f"distill/{name}"] > 0
  assert run.metrics["distill/reverse_kl_sampled"] != 0 and not np.allclose(run.delta, baseline.delta)


def test_top_k_keeps_the_teachers_k_tokens_and_reports_their_mass():
  run, full = ts.one_iteration(**TERMS, **{"distill.top_k": 3}), ts.one_iteration(**TERMS)
  b = run.batches[0]
  assert b.extras["teacher_dist_logp"].shape == b.old_logp.shape + (3,) and b.extras["teacher_dist_ids"].shape[-1] == 3
  assert 0 < run.metrics["distill/teacher_mass"] < 1
  for name in DIVERGENCES:
    assert run.metrics[f"distill/{name}"] != full.metrics[f"distill/{name}"]


def test_beta_moves_the_jsd():
  a, b = ts.one_iteration(**TERMS), ts.one_iteration(**TERMS, **{"distill.beta": 0.9})
  assert a.metrics["distill/jsd"] != b.metrics["distill/jsd"] and not np.allclose(a.delta, b.delta)


def test_the_distill_stage_kind_defaults_to_opd_and_a_missing_teacher_is_refused():
  section = STAGES.get("distill").defaults()
  assert section.kind == "distill" and section.advantage == "opd" and section.distill.reward_weight == 0.0
  config = base_config()
  config.stages = ("distill",)
  config.distill = section
  with pytest.raises(ConfigError, match="distill.teacher='teacher'.*config.models has no such role"):
    validate(config)
  section.advantage = "group"                     # nothing reads the teacher: no model needed
  validate(config)
  section.distill.beta = 2.0
  with pytest.raises(ConfigError, match="beta in"):
    validate(config)
