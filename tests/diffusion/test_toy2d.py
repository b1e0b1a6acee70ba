"""rlkit/diffusion/toy2d.py: the KL-regularised optimum in closed form equals a numerical tilt of the reference on a
grid (densities and log Z), is normalised, and maximises E_q[r] - beta KL(q || p) against perturbed mixtures."""
import numpy as np
import pytest

from rlkit.diffusion.toy2d import Mixture, QuadraticReward, ring, tilted

REWARD = QuadraticReward(center=np.array([1.5, 0.5]), precision=np.array([[1.0, 0.3], [0.3, 0.5]]),
                         linear=np.array([0.2, -0.4]))


def _grid(lo=-5.0, hi=5.0, n=801):
  xs = np.linspace(lo, hi, n)
  g = np.stack(np.meshgrid(xs, xs, indexing="ij"), -1)
  return g, (xs[1] - xs[0]) ** 2


@pytest.mark.parametrize("beta", [0.3, 1.0, 4.0])
def test_the_closed_form_optimum_equals_the_numerical_tilt(beta):
  p = ring()
  q, log_z = tilted(p, REWARD, beta)
  g, da = _grid()
  unnorm = np.exp(p.log_prob(g) + REWARD(g) / beta)
  z = unnorm.sum() * da
  np.testing.assert_allclose(log_z, np.log(z), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.exp(q.log_prob(g)), unnorm / z, atol=1e-6)
  assert np.exp(q.log_prob(g)).sum() * da == pytest.approx(1.0, abs=1e-6)
  assert q.weights.sum() == pytest.approx(1.0)


def test_the_optimum_beats_perturbed_mixtures_on_the_regularised_objective():
  p, beta = ring(), 0.5
  q, _ = tilted(p, REWARD, beta)
  g, da = _grid(n=401)                                 # a comparison: the coarser grid's error is far below the gaps

  def objective(m: Mixture) -> float:
    lq = m.log_prob(g)
    dens = np.exp(lq)
    return float((dens * (REWARD(g) - beta * (lq - p.log_prob(g)))).sum() * da)
  best = objective(q)
  rng = np.random.default_rng(0)
  for _ in range(5):
    w = q.weights * np.exp(0.3 * rng.standard_normal(q.weights.shape))
    other = Mixture(w / w.sum(), q.means + 0.1 * rng.standard_normal(q.means.shape), q.covs * 1.1)
    assert objective(other) < best
  samples = q.sample(rng, 20_000)                      # the sampler draws from the same mixture
  np.testing.assert_allclose(samples.mean(0), (q.weights[:, None] * q.means).sum(0), atol=0.05)
  with pytest.raises(ValueError, match="beta=0"):
    tilted(p, REWARD, 0)


def test_the_prompt_task_rewards_its_rare_mode_and_its_optimum_moves_mass_there():
  from rlkit.diffusion.toy2d import prompt_task
  task = prompt_task(seed=3, prompts=4, gamma=0.5)
  rng = np.random.default_rng(0)
  c, x = task.sample(rng, 4000)
  assert set(np.unique(c)) == {0, 1, 2, 3} and x.shape == (4000, 2)
  for k in range(4):
    p = task.mixtures[k]
    assert p.weights[0] == pytest.approx(0.1) and np.allclose(task.goals[k], p.means[0])
    q, _ = tilted(p, task.reward_of(k, hackable=False), beta=0.5)
    assert q.weights[0] > 0.9                                  # the optimum puts its mass on the rare mode
    r = task.reward_of(k)
    np.testing.assert_allclose(r(np.array([1.0, 2.0])) - task.reward_of(k, hackable=False)(np.array([1.0, 2.0])), 0.5)
