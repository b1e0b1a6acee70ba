"""The generative stages from configs/diffusion.py (rlkit/diffusion/gen_pretrain_stage.py, gen_rl_stage.py): every
preset validates; pretraining on the 8x8 digits then DRaFT on the classifier's confidence runs in one launch; an
ART run (a drift check and a restoration every iteration) cut inside the RL stage resumes to the uninterrupted
one; bad configs fail naming the fix (each method's own runs: test_gen_methods.py)."""
import jax
import numpy as np
import pytest

from rlkit.core.errors import ConfigError
from rlkit.train.checkpoint import CheckpointReader
from rlkit.train.config_checks import validate
from rlkit.train.metrics import read_metrics, without_timings
from rlkit.train.run import run
from tests.diffusion.gen_config import diffusion_config
from tests.fast_compile import fast_compile
from tests.resume import cut_and_resume


@pytest.mark.parametrize("preset", ["toy2d", "digits", "test", "digits_test"])
def test_presets_validate(preset):
  config = diffusion_config(preset)
  validate(config)
  assert config.stages == ("pretrain", "rl") and config.rl.method == "art"


def _saved(workdir, *steps):
  """The params saved at each global step."""
  reader = CheckpointReader(str(workdir / "checkpoints"))
  try:
    return [jax.device_get(reader.restore_saved_params(s)) for s in steps]
  finally:
    reader.close()


def _changed(a, b) -> bool:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_draft_on_digits_pretrains_then_fine_tunes_on_the_classifier(tmp_path):
  """The digits_test preset (pretraining on the 8x8 digits, then DRaFT-1 on digit_confidence) in one run."""
  config = diffusion_config("digits_test")
  config.rl.method = "draft"
  with fast_compile():
    run(config, str(tmp_path))
  rows = read_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows if "eval/class_accuracy" in r] == [2, 4, 6]
  rl = [r for r in rows if r["stage"] == "rl" and "reward" in r]
  assert len(rl) == 2 and all(r["reward"] < 0 for r in rl)             # a log-probability
  assert [r["nfe"] for r in rl] == [80, 160]                           # 16 rows x (3 steps + 2 x 1 backward)
  assert _changed(*_saved(tmp_path, 4, 6))                               # the end of pretraining, of RL


def test_a_cut_art_run_resumes_to_the_uninterrupted_one(tmp_path, monkeypatch):
  """Pretraining then ART (the test preset: 4 + 2 steps, a drift check and a restoration every iteration), cut
  after the first RL iteration."""
  reference, resumed = cut_and_resume(diffusion_config(), tmp_path, monkeypatch, 5)
  assert without_timings(resumed) == without_timings(reference)
  rl = [r for r in reference if r["stage"] == "rl" and "reward" in r]
  assert [r["art/restorations"] for r in rl] == [1, 2] and all(r["art/alpha"] < 1 for r in rl)
  assert _changed(*_saved(tmp_path / "ref", 4, 6))


@pytest.mark.parametrize("change,match", [
    ({"method": "grpo"}, r"rl.method='grpo' is not a known generative RL method; choose one of: flow_grpo"),
    ({"reward.name": "aesthetic"}, r"rl.reward.name='aesthetic' is not a known generative reward"),
    ({"reward.name": "ink"}, r"scores digits samples, and rl.data='toy2d'; choose a reward of that data \(toy2d\)"),
    ({"group_size": 1, "method": "nft"}, r"needs at least 2 samples; set group_size >= 2"),
    ({"draft.k": 5, "method": "draft"}, r"draft.k=5 must be in \[0, rollout_steps=3\]"),
])
def test_bad_configs_name_the_fix(change, match):
  config = diffusion_config()
  for key, value in change.items():
    *path, last = key.split(".")
    section = config.rl
    for part in path:
      section = section[part]
    section[last] = value
  with pytest.raises(ConfigError, match=match):
    validate(config)


def test_draft_refuses_a_reward_without_a_gradient():
  config = diffusion_config("digits_test")
  config.rl.method, config.rl.reward.name = "draft", "ink"
  with pytest.raises(ConfigError, match="has no gradient .* choose a differentiable reward \\(digit_confidence, "
                                        "toy2d\\) or a method that only scores samples"):
    validate(config)
  config.rl.method = "flow_grpo"                # scoring alone needs no gradient
  validate(config)
