"""A two-link planar arm simulated by MuJoCo MJX (the `mujoco-mjx` package, pinned with its `mujoco`): the
physics environment of the embodied experiments.

The model (REACHER_XML, ours; the scales of dm_control's reacher): two capsule links of 0.12 and 0.11 m on hinge
joints about z in the horizontal plane (no gravity acts, no contacts: the constraint solver never runs), joint
damping and armature, a motor per joint (gear 0.05, unclamped: `action_gain` and `drift` act as written). One
control step is SUBSTEPS MuJoCo steps of 0.01 s (semi-implicit Euler, MuJoCo's default). Observation: cos and sin
of both angles, both velocities, the fingertip, goal - fingertip ([10]). The fingertip is computed from the angles
(the links' lengths), which the tests check against MuJoCo's own site position. The start: the shoulder angle
uniform on the circle, the elbow in [-2, 2], at rest; the default goal region is the disk the fingertip reaches
(radius 0.2 about the base).

MJX runs through XLA, so the environment jits and vmaps with the policy; the tests compare it with C MuJoCo
stepping the same model (`mujoco.mj_step`), and benchmarks/envs.py times both.
"""
from __future__ import annotations

import contextlib
import functools
import io

import flax.struct
import jax
import jax.numpy as jnp

from rlkit.envs.core import ENVS, Env, EnvParams, Progress

Array = jax.Array

LINKS = (0.12, 0.11)      # shoulder to elbow, elbow to fingertip (m)
SUBSTEPS = 2
REACHER_XML = f"""
<mujoco model="rlkit_reacher">
  <option timestep="0.01" gravity="0 0 0"/>
  <default>
    <joint type="hinge" axis="0 0 1" damping="0.01" armature="0.002"/>
    <geom type="capsule" size="0.01" density="1000" contype="0" conaffinity="0"/>
    <motor gear="0.05" ctrllimited="false"/>
  </default>
  <worldbody>
    <body name="upper" pos="0 0 0">
      <joint name="shoulder"/>
      <geom fromto="0 0 0 {LINKS[0]} 0 0"/>
      <body name="lower" pos="{LINKS[0]} 0 0">
        <joint name="elbow"/>
        <geom fromto="0 0 0 {LINKS[1]} 0 0"/>
        <site name="fingertip" pos="{LINKS[1]} 0 0" size="0.005"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder"/>
    <motor joint="elbow"/>
  </actuator>
</mujoco>
"""


def mjx_module():
  """`mujoco.mjx`, imported quietly (it prints that its optional `warp` backend is absent)."""
  with contextlib.redirect_stdout(io.StringIO()):
    from mujoco import mjx
  return mjx


@functools.lru_cache(maxsize=1)
def models():
  """(the C MuJoCo model, its MJX copy, an MJX data template) of REACHER_XML, built once."""
  import mujoco
  mjx = mjx_module()
  mj = mujoco.MjModel.from_xml_string(REACHER_XML)
  with jax.ensure_compile_time_eval():              # concrete arrays even when first called inside a jit
    mx = mjx.put_model(mj)
    return mj, mx, mjx.make_data(mx)


def fingertip(qpos: Array) -> Array:
  """The fingertip's (x, y) of joint angles [..., 2] (forward kinematics of the two links)."""
  a, b = qpos[..., 0], qpos[..., 0] + qpos[..., 1]
  return jnp.stack([LINKS[0] * jnp.cos(a) + LINKS[1] * jnp.cos(b), LINKS[0] * jnp.sin(a) + LINKS[1] * jnp.sin(b)], -1)


@flax.struct.dataclass
class ReacherState:
  qpos: Array      # [2] joint angles
  qvel: Array      # [2]
  progress: Progress


def mjx_steps(qpos: Array, qvel: Array, ctrl: Array, n: int = SUBSTEPS) -> tuple[Array, Array]:
  """`n` MJX steps of the arm from (qpos, qvel) under constant `ctrl`: the new (qpos, qvel)."""
  mjx = mjx_module()
  _, mx, template = models()
  d = template.replace(qpos=qpos, qvel=qvel, ctrl=ctrl)
  for _ in range(n):
    d = mjx.step(mx, d)
  return d.qpos, d.qvel


class Reacher(Env):
  name = "reacher"
  action_dim = 2
  obs_dim = 10

  def default_params(self) -> EnvParams:
    return EnvParams(goal_center=jnp.zeros(2, jnp.float32), goal_spread=0.2, goal_radius=0.02, hold_steps=1,
                     action_gain=1.0, drift=jnp.zeros(2, jnp.float32), ctrl_cost=0.01, max_steps=100)

  def _reset(self, key, params, progress):
    k1, k2 = jax.random.split(key)
    qpos = jnp.stack([jax.random.uniform(k1, (), minval=-jnp.pi, maxval=jnp.pi),
                      jax.random.uniform(k2, (), minval=-2.0, maxval=2.0)])
    return ReacherState(qpos, jnp.zeros(2, jnp.float32), progress)

  def _advance(self, state, force, params):
    qpos, qvel = mjx_steps(state.qpos, state.qvel, force)
    return state.replace(qpos=qpos.astype(jnp.float32), qvel=qvel.astype(jnp.float32))

  def _observe(self, state, params):
    tip = fingertip(state.qpos)
    return jnp.concatenate([jnp.cos(state.qpos), jnp.sin(state.qpos), state.qvel, tip, state.progress.goal - tip])

  def effector(self, state):
    return fingertip(state.qpos)

  def scripted(self, obs: Array) -> Array:
    """Jacobian-transpose control toward the goal with velocity damping, from the observation (blind to the
    drift): demonstrations for BC."""
    c1, c2, s1, s2, qvel, err = obs[..., 0], obs[..., 1], obs[..., 2], obs[..., 3], obs[..., 4:6], obs[..., 8:10]
    c12, s12 = c1 * c2 - s1 * s2, s1 * c2 + c1 * s2
    l1, l2 = LINKS
    jt_e = jnp.stack([(-l1 * s1 - l2 * s12) * err[..., 0] + (l1 * c1 + l2 * c12) * err[..., 1],
                      -l2 * s12 * err[..., 0] + l2 * c12 * err[..., 1]], -1)
    return jnp.clip(300.0 * jt_e - 0.2 * qvel, -1.0, 1.0)


ENVS.add("reacher", Reacher)
