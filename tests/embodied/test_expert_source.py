"""`expert_path` (rlkit/embodied/expert_source.py): one behaviour-cloned expert starts another run's RL stage; the
expert is found in a flow_bc workdir and in a reinflow run's params, and wrong paths and shapes are refused."""
import dataclasses

import jax
import numpy as np
import pytest

from rlkit.core.errors import ConfigError
from rlkit.embodied.bc_stage import env_of, flow_config
from rlkit.embodied.expert_source import saved_expert
from rlkit.models.flow import init_flow
from rlkit.train.checkpoint import CheckpointReader
from rlkit.train.metrics import read_metrics
from rlkit.train.run import run
from tests.embodied.embodied_config import embodied_config
from tests.fast_compile import fast_compile


def _equal(a, b) -> bool:
  return jax.tree.structure(a) == jax.tree.structure(b) and all(
      np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_an_rl_run_starts_from_another_runs_expert(tmp_path):
  bc_run = embodied_config()
  bc_run.stages = ("bc",)
  with fast_compile():
    run(bc_run, str(tmp_path / "bc"))
  env, _ = env_of(bc_run.bc)
  fc = flow_config(bc_run.bc, env)
  fresh = init_flow(fc, env.obs_dim, jax.random.key(0))
  reader = CheckpointReader(str(tmp_path / "bc" / "checkpoints"))
  step = reader.latest_step()
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), fresh)
  cloned = reader.restore_params(step, target)
  reader.close()
  assert _equal(saved_expert(str(tmp_path / "bc"), fresh), cloned)
  assert _equal(saved_expert(str(tmp_path / "bc" / "checkpoints" / str(step)), fresh), cloned)

  rl_run = embodied_config()                     # RL alone, from the BC run's workdir
  rl_run.stages = ("rl",)
  rl_run.rl.expert_path = str(tmp_path / "bc")
  with fast_compile():
    run(rl_run, str(tmp_path / "rl"))
  rows = [r for r in read_metrics(str(tmp_path / "rl" / "metrics.jsonl")) if r.get("stage") == "rl"]
  assert [r["step"] for r in rows if "reward" in r] == [1, 2] and any("eval/success" in r for r in rows)
  moved = saved_expert(str(tmp_path / "rl"), fresh)     # a ReinFlow run's params hold the expert as "flow"
  assert jax.tree.structure(moved) == jax.tree.structure(cloned) and not _equal(moved, cloned)

  with pytest.raises(ConfigError, match="does not exist"):
    saved_expert(str(tmp_path / "nowhere"), fresh)
  wider = init_flow(dataclasses.replace(fc, hidden=2 * fc.hidden), env.obs_dim, jax.random.key(0))
  with pytest.raises(ConfigError, match="not a flow expert of this stage"):
    saved_expert(str(tmp_path / "bc"), wider)
  second = embodied_config()
  second.rl.expert_path = str(tmp_path / "bc")
  with fast_compile(), pytest.raises(ConfigError, match="only on a run's first stage"):
    run(second, str(tmp_path / "second"))
