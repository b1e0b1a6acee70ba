"""rlkit.envs: pure-JAX control environments for embodied RL (gymnax-style reset / step; rlkit/envs/core.py).

  point_mass   a point mass on a plane (analytic; the tests' and quick experiments' environment)
  reacher      a two-link arm in MuJoCo MJX (real physics, jitted with the policy)

Tasks are `EnvParams` (goal region, tolerance and hold steps, gain, drift): a precision task is a small
`goal_radius` held for several `hold_steps`.
"""
from rlkit.envs.core import ENVS, Env, EnvParams, Progress, make_env, rollout, with_task  # noqa: F401 (the API)
from rlkit.envs import point_mass, reacher  # noqa: F401 (registers the environments)
