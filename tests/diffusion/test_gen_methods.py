"""The methods of the `gen_rl` stage (rlkit/diffusion/gen_methods.py, gen_art.py) on configs/diffusion.py's test
preset, each from one pretrained generator read from another run's workdir (`expert_path`): every method changes
it and logs the reward, its exact NFE count and on toy2d the true reward and the distance to the exact optimum;
Flow-GRPO's and DanceGRPO's ratio is 1 on the first minibatch of every iteration (before its first update: the
sampler's log-densities and the trainer's agree); ART without restoration measures its drift and never restores
(with restoration, and a resume: test_gen_stages.py); DanceGRPO's noise is its constant sigma."""
import jax
import numpy as np
import pytest

from rlkit.diffusion.gen_methods import GEN_METHODS, constant_sigma_level
from rlkit.diffusion.gen_rl_stage import method_setup
from rlkit.diffusion.sde import sigma_at
from rlkit.train.checkpoint import CheckpointReader
from rlkit.train.config_checks import validate
from rlkit.train.metrics import read_metrics
from rlkit.train.run import run
from rlkit.train.steps import init_train_state
from tests.diffusion.gen_config import diffusion_config
from tests.fast_compile import fast_compile


def _params(workdir):
  reader = CheckpointReader(str(workdir / "checkpoints"))
  try:
    return jax.device_get(reader.restore_saved_params(reader.latest_step()))
  finally:
    reader.close()


def _changed(a, b) -> bool:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A gen_pretrain run of the test preset (toy2d): the workdir every method's RL run starts from."""
  config = diffusion_config()
  config.stages = ("pretrain",)
  workdir = tmp_path_factory.mktemp("pretrain")
  with fast_compile():
    run(config, str(workdir))
  return workdir


# NFEs of one iteration of the test preset (16 rows, K = 3 steps): flow_grpo 16 x (3 + 3 x 3 trained steps),
# dance_grpo 16 x (3 + 3 x 1) (int(3 x 0.6) = 1 step trained), nft 16 x 3 + 4 x 32 (2 draws per row).
@pytest.mark.parametrize("method,nfe", [("flow_grpo", 192), ("dance_grpo", 96), ("nft", 176)])
def test_each_method_moves_the_pretrained_generator(tmp_path, pretrained, method, nfe):
  config = diffusion_config()
  config.stages = ("rl",)
  config.rl.method = method
  config.rl.expert_path = str(pretrained)
  validate(config)
  with fast_compile():
    run(config, str(tmp_path))
  assert _changed(_params(tmp_path), _params(pretrained))
  rows = read_metrics(str(tmp_path / "metrics.jsonl"))
  train = [r for r in rows if "reward" in r]
  assert [r["step"] for r in train] == [1, 2]
  assert [r["nfe"] for r in train] == [nfe, 2 * nfe]
  assert all(np.isfinite(r[k]) for r in train for k in ("reward", "true_reward", "opt_mmd", "loss"))
  assert train[0]["reward"] == pytest.approx(train[0]["true_reward"], abs=1e-5)      # gamma = 0: no hack
  assert {"eval/reward", "eval/true_reward", "eval/opt_mmd", "eval/mmd"} <= set(rows[-1])
  if method != "nft":          # the clipped ratio: 1 before the iteration's first update (the stage's first too)
    for r in train:
      assert r["first_ratio"] == pytest.approx(1.0, abs=1e-6) and r["first_clip_frac"] == 0.0


def test_art_without_restoration_measures_the_drift_and_never_restores(pretrained):
  """`art.restore=False` (the no-restoration arm) on the test preset, whose thresholds restore at every check."""
  config = diffusion_config()
  config.rl.art.restore = False
  setup, _ = method_setup(config.rl)
  art = GEN_METHODS.get("art")
  ref = jax.tree.map(jax.numpy.asarray, _params(pretrained))
  own, _ = art.init(ref, setup, jax.random.key(0))
  state = {"train": init_train_state(jax.tree.map(jax.numpy.copy, ref), setup.tx), "ref": ref, "method": own}
  iteration = art.build(setup)
  with fast_compile():
    for step in range(2):
      state, out = iteration(state, jax.numpy.arange(4), jax.random.key(step))
      assert out.metrics["art/restorations"] == 0 and out.metrics["art/alpha"] == 1.0
      assert out.metrics["art/drift"] > 0
  assert _changed(state["train"].params, ref)


def test_dance_grpo_noise_is_a_constant_sigma():
  s = np.linspace(0.0, 0.9, 10)
  np.testing.assert_allclose(np.asarray(sigma_at(s, 0.1, constant_sigma_level(s, 0.1, 0.3))), 0.3, rtol=1e-6)
