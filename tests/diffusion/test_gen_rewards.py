"""rlkit/diffusion/gen_rewards.py, digits.py, gen_data.py: the digit classifier reaches a stated held-out accuracy;
digit_confidence is its log-probability of the class asked for; the toy2d reward is the task's exact one (its
hackable term off in true_reward) and its optimum draws come from the exact tilt; ink counts inked pixels; the
datasets say what they provide."""
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.diffusion import digits
from rlkit.diffusion.gen_data import GEN_DATA, toy2d_task
from rlkit.diffusion.gen_rewards import GEN_REWARDS
from rlkit.diffusion.sample_distance import mmd2
from rlkit.diffusion.toy2d import tilted
from tests.diffusion.gen_config import diffusion_config


def test_the_digit_classifier_is_accurate_on_held_out_digits():
  params, accuracy = digits.classifier()
  assert accuracy > 0.95, accuracy                    # measured 0.986 (scikit-learn 1.9.1, jax 0.10.2, CPU)
  assert digits.classifier() is digits.classifier()    # trained once per process
  x, y = digits.digit_arrays()
  assert x.shape == (1797, 64) and x.min() == -1.0 and x.max() == 1.0 and set(y) == set(range(10))
  train, held = digits.split()
  assert len(set(train) & set(held)) == 0 and len(train) + len(held) == 1797
  section = diffusion_config("digits_test").rl
  reward = GEN_REWARDS.get("digit_confidence").build(section.reward, section)
  r = np.asarray(reward.score(jnp.asarray(x[held[:64]]), jnp.asarray(y[held[:64]])))
  wrong = np.asarray(reward.score(jnp.asarray(x[held[:64]]), jnp.asarray((y[held[:64]] + 1) % 10)))
  assert np.all(r <= 0) and np.mean(r) > np.log(0.8) and np.mean(r > wrong) > 0.95
  ink = GEN_REWARDS.get("ink").build(section.reward, section)
  np.testing.assert_allclose(np.asarray(ink.score(jnp.asarray([[1.0, -1.0, 0.5, 0.0]]), jnp.zeros(1, int))), [0.5])
  data = GEN_DATA.get("digits")(section)
  assert (data.dim, data.conditions) == (64, 10)
  real = np.stack([x[y == c][:8] for c in range(10)])         # [C, 8, 64]: real digits of each class
  assert data.quality(real, 0)["class_accuracy"] >= 0.9


def test_the_toy2d_reward_and_its_exact_optimum():
  section = diffusion_config().rl
  section.reward.gamma, section.reward.beta = 0.5, 0.7
  data = GEN_DATA.get("toy2d")(section)
  reward = GEN_REWARDS.get("toy2d").build(section.reward, section)
  task = toy2d_task(section, 0.5)
  x = np.random.default_rng(0).normal(size=(16, 2)).astype(np.float32)
  cond = np.arange(16) % data.conditions
  exact = np.array([task.reward_of(c)(xi) for xi, c in zip(x, cond)])
  true = np.array([task.reward_of(c, hackable=False)(xi) for xi, c in zip(x, cond)])
  np.testing.assert_allclose(np.asarray(reward.score(jnp.asarray(x), jnp.asarray(cond))), exact, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(reward.reports["true_reward"](jnp.asarray(x), jnp.asarray(cond))), true,
                             rtol=1e-5)
  assert reward.optimum.shape == (data.conditions, 512, 2)
  c = 3
  q, _ = tilted(task.mixtures[c], task.reward_of(c, hackable=False), 0.7)
  rng = np.random.default_rng(1)
  assert mmd2(reward.optimum[c], q.sample(rng, 512)) < 0.02 < mmd2(reward.optimum[c], task.mixtures[c].sample(rng, 512))
  xs, cs = data.arrays(4000, 0)
  assert xs.shape == (4000, 2) and set(cs) == set(range(data.conditions))


@pytest.mark.parametrize("name,differentiable", [("toy2d", True), ("digit_confidence", True), ("ink", False)])
def test_rewards_say_whether_they_have_a_gradient(name, differentiable):
  assert GEN_REWARDS.get(name).differentiable is differentiable
