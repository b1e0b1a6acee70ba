"""LoRA on a flow expert (rlkit/embodied/flow_lora.py; flow_rl's `expert_lora`): adapters start the merged expert
at its base and reach only their target kernels; a flow_rl run with adapters on the timestep modules leaves the
expert's base weights bit-identical and changes the merged expert in the timestep modules alone."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.embodied import analysis, flow_lora
from rlkit.embodied.flow_rl_stage import flow_method
from rlkit.models.flow import TIMESTEP_MODULES, FlowConfig, init_flow
from rlkit.train import stages
from rlkit.train.run import run
from tests.embodied.embodied_config import embodied_config
from tests.fast_compile import fast_compile

GROUPS = {"timestep": TIMESTEP_MODULES}


def test_adapters_start_at_the_base_and_reach_only_their_targets():
  params = init_flow(FlowConfig(action_dim=2, horizon=2, hidden=16, blocks=1, time_dim=8), 4, jax.random.key(0))
  adapters = flow_lora.init_adapters(params, "timestep", 2, jax.random.key(1))
  assert set(adapters) == {"time_mlp_in/kernel", "time_mlp_out/kernel", "modulation_0/kernel", "modulation_out/kernel"}
  same = flow_lora.merge(params, adapters, 4.0, 2)
  for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  moved = {k: {"a": v["a"], "b": v["b"] + 1.0} for k, v in adapters.items()}
  shares = analysis.update_shares(params, flow_lora.merge(params, moved, 4.0, 2), GROUPS)
  assert shares["timestep"]["share"] == pytest.approx(1.0) and shares["other"]["share"] == 0.0
  with pytest.raises(ValueError, match="match no 2-D kernel"):
    flow_lora.init_adapters(params, "nothing_here", 2, jax.random.key(2))


def test_a_flow_rl_run_with_timestep_lora_moves_only_the_timestep_modules(tmp_path, monkeypatch):
  config = embodied_config()
  config.rl.expert_lora.update(rank=2, alpha=2.0, targets="timestep")
  config.rl.optimizer.lr = 1e-2                      # two iterations: large enough steps to see where they land
  saved = {}
  save = stages.save

  def recording_save(ctx, state, global_step, meta, force):
    saved[meta["stage"]] = jax.device_get(state["train"].params)
    save(ctx, state, global_step, meta, force)
  monkeypatch.setattr(stages, "save", recording_save)
  with fast_compile():
    run(config, str(tmp_path / "run"))
  bc, rl = saved["bc"], saved["rl"]
  method = flow_method(config.rl)
  for a, b in zip(jax.tree.leaves(rl["base"]["flow"]), jax.tree.leaves(bc)):   # the expert's base: bit-identical
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  merged = method.expert(jax.tree.map(jnp.asarray, rl))
  shares = analysis.update_shares(bc, merged, GROUPS)
  assert shares["timestep"]["share"] == pytest.approx(1.0) and shares["other"]["share"] == 0.0
  assert np.abs(analysis.shift_vector(bc, merged, GROUPS, "timestep")).max() > 0
