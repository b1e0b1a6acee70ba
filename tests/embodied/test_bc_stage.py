"""The embodied stages from configs/embodied.py: no tokenizer, data or language model is built; `flow_bc` clones the
scripted controller (the point mass: eval/success well above a fresh expert's); BC then `flow_rl` (ReinFlow, FPO)
cut after a checkpoint resumes to the uninterrupted run's metrics (the acob stage: test_acob_stage.py)."""
import jax
import numpy as np
import pytest

from rlkit.embodied.bc_stage import env_of, flow_config
from rlkit.embodied.episodes import evaluate_policy
from rlkit.models.flow import init_flow, sample
from rlkit.train.metrics import read_metrics, without_timings
from rlkit.train.run import run
from tests.embodied.embodied_config import embodied_config as _config
from tests.fast_compile import fast_compile
from tests.resume import cut_and_resume


# Both -m slow: the default run resumes this config's ReinFlow run after a SIGKILL (tests/train/test_launch.py).
@pytest.mark.parametrize("method,cut", [pytest.param("fpo", 2, marks=pytest.mark.slow),
                                        pytest.param("reinflow", 5, marks=pytest.mark.slow)])
def test_a_cut_embodied_run_resumes_to_the_uninterrupted_one(tmp_path, monkeypatch, method, cut):
  """BC then RL (the test preset: 4 + 2 steps), cut after global step `cut` (inside BC, inside RL)."""
  config = _config()
  config.rl.method = method
  reference, resumed = cut_and_resume(config, tmp_path, monkeypatch, cut)
  assert without_timings(resumed) == without_timings(reference)
  assert [(r["stage"], r["step"]) for r in reference if "eval/success" in r] == [("bc", 2), ("bc", 4), ("rl", 6)]
  rl = [r for r in reference if r["stage"] == "rl" and "reward" in r]
  assert len(rl) == 2 and all(np.isfinite(r["loss"]) and np.isfinite(r["critic/loss"]) for r in rl)
  assert not (tmp_path / "ref" / "data").exists()                 # no task data was built


def test_behaviour_cloning_learns_the_scripted_point_mass_controller(tmp_path):
  config = _config(steps=120, batch_size=128, demo_envs=32, demo_steps=60, eval_every=0, eval_episodes=64,
                   sample_steps=4)
  config.stages = ("bc",)
  config.bc.flow.update(hidden=64, blocks=2, time_dim=16, horizon=2)
  config.bc.env_task = {"max_steps": 50}
  config.bc.optimizer.lr = 3e-3
  with fast_compile():
    run(config, str(tmp_path / "bc"))
  rows = [r for r in read_metrics(str(tmp_path / "bc" / "metrics.jsonl")) if "eval/success" in r]
  assert rows[-1]["eval/success"] >= 0.8, rows[-1]
  env, task = env_of(config.bc)                                   # the same evaluation of a fresh expert
  fc = flow_config(config.bc, env)
  fresh = init_flow(fc, env.obs_dim, jax.random.key(5))
  before = evaluate_policy(env, task, lambda obs, k: sample(fresh, fc, obs, k, 4), jax.random.key(6), 64, fc.horizon)
  assert before["eval/success"] <= 0.2 and before["eval/distance"] > 2 * rows[-1]["eval/distance"], before
