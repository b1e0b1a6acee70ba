"""rlkit/embodied/acob.py: chunk returns and TD targets equal their definitions, the Cal-QL floor only lifts
reference transitions, the gate and AUC read as stated, the actor loss is weighted flow matching plus beta times a
reference distance that is 0 at the reference, and dual ascent and the trip-wire move as the rules say."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.embodied import acob
from rlkit.models.flow import FlowConfig, cfm_loss, init_flow

CFG = FlowConfig(action_dim=2, horizon=3, hidden=16, blocks=1, time_dim=8)


def test_chunk_rewards_returns_and_td_targets():
  r = jnp.asarray([[1.0, 0.0, 2.0]])
  assert float(acob.chunk_rewards(r, 0.5)[0]) == pytest.approx(1.0 + 0.25 * 2.0)
  rc = jnp.asarray([1.0, 2.0, 3.0, 4.0])
  done = jnp.asarray([False, True, False, False])
  g = np.asarray(acob.mc_returns(rc, done, 0.9, 2))
  d = 0.81
  np.testing.assert_allclose(g, [1 + d * 2, 2, 3 + d * 4, 4], rtol=1e-6)
  y = acob.chunk_td_target(rc, jnp.full(4, 10.0), done, 0.9, 2)
  np.testing.assert_allclose(np.asarray(y), [1 + d * 10, 2, 3 + d * 10, 4 + d * 10], rtol=1e-6)
  floor = acob.calibrated_target(jnp.asarray([1.0, 5.0, 1.0]), jnp.asarray([3.0, 3.0, 3.0]),
                                 jnp.asarray([True, True, False]))
  np.testing.assert_array_equal(np.asarray(floor), [3.0, 5.0, 1.0])


def test_auc_and_the_gate():
  assert acob.auc([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0]) == 1.0
  assert acob.auc([0.5, 0.5], [1, 0]) == 0.5 and np.isnan(acob.auc([1.0], [1]))
  ok = acob.calibration_gate(0.01, 0.05, 0.9, eps_td=0.1, eps_cal=0.1, auc_min=0.8)
  bad = acob.calibration_gate(0.01, 0.2, float("nan"), eps_td=0.1, eps_cal=0.1, auc_min=0.8)
  assert ok["passed"] and not bad["passed"]
  assert not bad["calibration_error"]["passed"] and not bad["success_auc"]["passed"] and bad["td_error"]["passed"]


def test_the_actor_loss_is_weighted_flow_matching_plus_a_reference_distance():
  params = init_flow(CFG, 4, jax.random.key(0))
  k = jax.random.split(jax.random.key(1), 4)
  batch = {"obs": jax.random.normal(k[0], (6, 4)), "actions": jax.random.normal(k[1], (6, 3, 2)),
           "s": jax.random.uniform(k[2], (6,)), "eps": jax.random.normal(k[3], (6, 3, 2)),
           "weights": acob.weights(jnp.asarray([1.0, -1.0, 0.5, 3.0, -2.0, 0.0]), lam=1.0, w_max=5.0)}
  np.testing.assert_allclose(np.asarray(batch["weights"]), np.minimum(np.exp([1, -1, .5, 3, -2, 0]), 5.0), rtol=1e-6)
  loss, m = acob.actor_loss(params, params, CFG, batch, jnp.float32(2.0))
  fm = cfm_loss(params, CFG, batch["obs"], batch["actions"], batch["s"], batch["eps"])
  w = batch["weights"]
  assert float(m["acob/d_ref"]) == 0.0                                      # at the reference
  assert float(loss) == pytest.approx(float(jnp.sum(w * fm) / jnp.sum(w)), rel=1e-6)
  moved = jax.tree.map(lambda x: x + 0.05, params)
  loss2, m2 = acob.actor_loss(moved, params, CFG, batch, jnp.float32(2.0))
  assert float(m2["acob/d_ref"]) > 0 and float(loss2) == pytest.approx(float(m2["acob/weighted_fm"])
                                                                       + 2.0 * float(m2["acob/d_ref"]), rel=1e-5)
  binary = acob.weights(jnp.asarray([1.0, -1.0, 0.0]), 1.0, 5.0, binary=True)
  np.testing.assert_array_equal(np.asarray(binary), [1.0, 0.0, 0.0])


def test_dual_ascent_and_the_tripwire():
  assert acob.dual_update(0.5, d_ref=2.0, d_max=1.0, lr=0.1, beta_max=10.0) == pytest.approx(0.6)
  assert acob.dual_update(0.05, d_ref=0.0, d_max=1.0, lr=0.1, beta_max=10.0) == 0.0            # never negative
  assert acob.dual_update(9.99, d_ref=5.0, d_max=1.0, lr=1.0, beta_max=10.0) == 10.0           # capped
  assert acob.tripwire(0.3, reference_success=0.5, margin=0.1) and not acob.tripwire(0.45, 0.5, 0.1)
