"""rlkit/envs: the point mass follows its closed form, the MJX reacher equals C MuJoCo stepping the same model,
and the shared step counts held steps, ends and resets episodes, and vmaps over keys and over tasks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.envs import ENVS, make_env, rollout, with_task
from rlkit.envs import reacher as R
from rlkit.envs.point_mass import PointMass


def test_the_point_mass_follows_its_closed_form():
  """Damping 0, constant force f = gain * a + drift from rest: x_n = x0 + dt^2 f n (n + 1) / 2."""
  env = PointMass(dt=0.1, damping=0.0)
  params = with_task(env.default_params(), action_gain=2.0, drift=[0.1, -0.3], max_steps=1000, goal_center=[5.0, 5.0],
                     goal_spread=0.0)
  _, state = env.reset(jax.random.key(0), params)
  x0, a = np.asarray(state.pos), jnp.asarray([0.5, 3.0])          # 3.0 clips to 1
  step = jax.jit(env.step)
  for _ in range(12):
    _, state, *_ = step(jax.random.key(1), state, a, params)
  f = 2.0 * np.array([0.5, 1.0]) + np.array([0.1, -0.3])
  np.testing.assert_allclose(np.asarray(state.pos), x0 + 0.01 * f * 12 * 13 / 2, rtol=1e-5)


def test_the_mjx_reacher_equals_c_mujoco_on_the_same_model():
  import mujoco
  env, params = make_env("reacher", drift=[0.2, -0.1], action_gain=1.5)
  _, state = env.reset(jax.random.key(3), params)
  controls = np.asarray(jax.random.uniform(jax.random.key(4), (20, 2), minval=-1.0, maxval=1.0))
  step = jax.jit(env.step)
  mj = R.models()[0]
  data = mujoco.MjData(mj)
  data.qpos[:], data.qvel[:] = np.asarray(state.qpos), np.asarray(state.qvel)
  for a in controls:
    _, state, *_ = step(jax.random.key(5), state, jnp.asarray(a), params)
    data.ctrl[:] = 1.5 * a + np.array([0.2, -0.1])
    for _ in range(R.SUBSTEPS):
      mujoco.mj_step(mj, data)
  np.testing.assert_allclose(np.asarray(state.qpos), data.qpos, atol=1e-4)
  np.testing.assert_allclose(np.asarray(state.qvel), data.qvel, atol=1e-3)
  mujoco.mj_forward(mj, data)
  np.testing.assert_allclose(np.asarray(R.fingertip(jnp.asarray(data.qpos))), data.site_xpos[0][:2], atol=1e-6)
  assert float(np.abs(data.qvel).max()) > 0.1                       # the arm really moved


def test_a_precision_task_succeeds_only_after_holding_and_then_resets():
  env, params = make_env("point_mass", goal_radius=0.05, hold_steps=4, goal_spread=0.0, max_steps=50)
  _, state = env.reset(jax.random.key(0), params)
  state = state.replace(pos=state.progress.goal + 0.01)             # at the goal, at rest
  step = jax.jit(env.step)
  flags = []
  for i in range(4):
    _, state, reward, done, info = step(jax.random.key(i), state, jnp.zeros(2), params)
    flags.append((bool(done), bool(info["success"]), int(info["steps"])))
  assert flags == [(False, False, 1), (False, False, 2), (False, False, 3), (True, True, 4)]
  sparse = with_task(params, sparse=1)
  _, state = env.reset(jax.random.key(0), sparse)
  state = state.replace(pos=state.progress.goal + 0.01)
  rewards = []
  for i in range(4):
    _, state, reward, _, _ = step(jax.random.key(i), state, jnp.zeros(2), sparse)
    rewards.append(float(reward))
  assert rewards == [0.0, 0.0, 0.0, 1.0]                          # sparse: 1 at the completing step only
  assert int(state.progress.t) == 0 and int(state.progress.hold) == 0           # a fresh episode


def test_episodes_truncate_at_max_steps():
  env, params = make_env("point_mass", max_steps=7, goal_center=[9.0, 9.0], goal_spread=0.0)
  _, out = rollout(env, params, lambda obs, key: jnp.zeros(2), jax.random.key(0), 15)
  np.testing.assert_array_equal(np.flatnonzero(np.asarray(out["done"])), [6, 13])
  assert not np.asarray(out["success"]).any()


@pytest.mark.parametrize("name", ["point_mass", "reacher"])
def test_a_batch_of_tasks_and_keys_vmaps(name):
  """One params pytree with a leading task axis: each task's goal is its own (goal_spread 0), and a policy that
  pushes toward the goal gets closer in every task."""
  env, base = make_env(name, goal_spread=0.0)
  centers = jnp.asarray([[0.1, 0.1], [-0.1, 0.12], [0.15, -0.05]])
  tasks = jax.vmap(lambda c: with_task(base, goal_center=c))(centers)
  toward = (lambda o, k: jnp.clip(5.0 * o[-2:], -1, 1)) if name == "point_mass" else (lambda o, k: jnp.zeros(2))
  run = jax.jit(jax.vmap(lambda p, k: rollout(env, p, toward, k, 20)))
  final, out = run(tasks, jax.random.split(jax.random.key(0), 3))
  np.testing.assert_allclose(np.asarray(final.progress.goal), np.asarray(centers), atol=1e-6)
  assert out["obs"].shape == (3, 20, env.obs_dim)
  if name == "point_mass":
    assert np.all(np.asarray(out["distance"][:, -1]) < np.asarray(out["distance"][:, 0]))


def test_task_fields_are_checked_and_every_env_is_registered():
  assert {"point_mass", "reacher"} <= set(ENVS.names())
  with pytest.raises(ValueError, match=r"Unknown task field\(s\) \['goal'\]"):
    make_env("point_mass", goal=[0.0, 0.0])


def test_the_env_benchmark_runs_both_engines(capsys):
  """benchmarks/envs.py at a tiny size: each side steps the arm (the timings themselves come from its full run)."""
  import json
  from benchmarks import envs as bench
  (line,) = bench.main(["--batch", "2", "--steps", "5", "--reps", "1"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == line
  assert line["mjx_env_steps_s"] > 0 and line["c_mujoco_steps_s"] > 0 and line["c_threads"] >= 1
