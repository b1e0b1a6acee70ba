"""rlkit/embodied/accrue.py: the residual actor starts at the base's chunk and stays within rho of it; memory
selection keeps the top returns or a uniform sample; stored tasks are sampled only when earlier than the current
one; mixed batches take the stated share from memory; the losses are their definitions."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.embodied import accrue

H, A, Z = 2, 2, 5


def test_the_residual_actor_starts_at_the_base_and_stays_near_it():
  actor = accrue.ResidualActor(hidden=16, rho=0.1)
  z, a0 = jax.random.normal(jax.random.key(0), (4, Z)), jax.random.normal(jax.random.key(1), (4, H, A))
  params = actor.init(jax.random.key(2), z, a0)["params"]
  np.testing.assert_array_equal(np.asarray(actor.apply({"params": params}, z, a0)), np.asarray(a0))
  moved = jax.tree.map(lambda x: x + 5.0, params)
  mu = actor.apply({"params": moved}, z, a0)
  assert 0 < float(jnp.abs(mu - a0).max()) <= 0.1 + 1e-6


def test_memory_selection_storage_and_sampling():
  np.testing.assert_array_equal(accrue.select_trajectories([1.0, 5.0, 3.0, 5.0], 2, "top_return"), [1, 3])
  picked = accrue.select_trajectories(np.arange(10.0), 4, "reservoir", jax.random.key(0))
  assert len(set(picked.tolist())) == 4 and picked.max() < 10
  with pytest.raises(ValueError, match="mode='best'"):
    accrue.select_trajectories([1.0], 1, "best")
  mem = accrue.empty_memory(tasks=3, per_task=2, length=4, shapes={"z": (Z,), "reward": ()})
  traj = {"z": np.ones((2, 4, Z)), "reward": np.full((2, 4), 7.0)}
  valid = np.ones((2, 4))
  valid[1, 2:] = 0
  mem = accrue.store(mem, 0, traj, valid)
  mem = accrue.store(mem, 1, {"z": np.full((1, 4, Z), 2.0), "reward": np.full((1, 4), 9.0)}, np.ones((1, 4)))
  none = accrue.sample_memory(mem, jax.random.key(1), 8, before=0)
  assert float(none["is_memory"].sum()) == 0.0
  first = accrue.sample_memory(mem, jax.random.key(2), 64, before=1)      # only task 0's six valid decisions
  assert np.all(np.asarray(first["reward"]) == 7.0) and np.all(np.asarray(first["is_memory"]) == 1.0)
  both = accrue.sample_memory(mem, jax.random.key(3), 256, before=2)
  share = float((np.asarray(both["reward"]) == 9.0).mean())
  assert abs(share - 4 / 10) < 0.1                                          # 4 of the 10 valid decisions


def test_a_mixed_batch_takes_its_share_from_memory():
  current = {"z": jnp.zeros((10, Z)), "reward": jnp.zeros(10)}
  memory_rows = {"z": jnp.ones((10, Z)), "reward": jnp.ones(10), "is_memory": jnp.ones(10)}
  batch = accrue.mixed_batch(current, memory_rows, 0.3)
  np.testing.assert_array_equal(np.asarray(batch["is_memory"]), [0] * 7 + [1] * 3)
  np.testing.assert_array_equal(np.asarray(batch["reward"]), [0] * 7 + [1] * 3)


def test_the_losses_are_their_definitions():
  actor, q = accrue.ResidualActor(hidden=8, rho=0.5), accrue.TwinQ(hidden=8)
  k = jax.random.split(jax.random.key(0), 8)
  n = 6
  batch = {"z": jax.random.normal(k[0], (n, Z)), "a": jax.random.normal(k[1], (n, H, A)),
           "a0": jax.random.normal(k[2], (n, H, A)), "z_next": jax.random.normal(k[3], (n, Z)),
           "a0_next": jax.random.normal(k[4], (n, H, A)), "reward": jnp.arange(n, dtype=jnp.float32),
           "done": jnp.asarray([0, 1, 0, 0, 1, 0], jnp.float32), "mc": jnp.full(n, 2.0),
           "is_memory": jnp.asarray([0, 0, 0, 1, 1, 1], jnp.float32),
           "success": jnp.asarray([1, 1, 1, 0, 1, 1], jnp.float32)}
  ap = actor.init(k[5], batch["z"], batch["a0"])["params"]
  qp = q.init(k[6], batch["z"], batch["a"])["params"]
  loss, m = accrue.critic_loss(qp, qp, ap, batch, q=q, actor=actor, gamma_h=0.9, critic_mc=0.5)
  q1, q2 = q.apply({"params": qp}, batch["z"], batch["a"])
  qn = jnp.minimum(*q.apply({"params": qp}, batch["z_next"], batch["a0_next"]))     # mu = a0 at init
  y = batch["reward"] + 0.9 * (1 - batch["done"]) * qn
  td = jnp.mean((q1 - y) ** 2 + (q2 - y) ** 2)
  mc = jnp.mean(((q1 - 2.0) ** 2 + (q2 - 2.0) ** 2)[3:])
  assert float(loss) == pytest.approx(float(td + 0.5 * mc), rel=1e-5)
  # TD3's target smoothing: the noise moves the target actor's chunks, so the target y.
  noise = 0.3 * jax.random.normal(k[7], batch["a"].shape)
  smoothed, _ = accrue.critic_loss(qp, qp, ap, {**batch, "target_noise": noise}, q=q, actor=actor, gamma_h=0.9,
                                   critic_mc=0.5)
  y = batch["reward"] + 0.9 * (1 - batch["done"]) * jnp.minimum(*q.apply({"params": qp}, batch["z_next"],
                                                                          batch["a0_next"] + noise))
  assert float(smoothed) == pytest.approx(float(jnp.mean((q1 - y) ** 2 + (q2 - y) ** 2) + 0.5 * mc), rel=1e-5)
  loss, m = accrue.actor_loss(ap, qp, batch, q=q, actor=actor, lambda_ref=1.0, lambda_bc=2.0)
  bc = jnp.mean(jnp.sum((batch["a0"] - batch["a"]) ** 2, axis=(1, 2))[4:])        # memory rows that succeeded
  assert float(m["accrue/ref"]) == 0.0 and float(m["accrue/bc"]) == pytest.approx(float(bc), rel=1e-5)
  q_mu, _ = q.apply({"params": qp}, batch["z"], batch["a0"])
  assert float(loss) == pytest.approx(float(-q_mu.mean() + 2.0 * bc), rel=1e-5)
