"""Every stage kind, imported so that `STAGES` holds every registered kind: `sft` (sft_stage.py), `rl` and
`distill` (rl_stage.py), `graft` (graft_stage.py), `rquest` (rquest_stage.py), `reward_model`
(reward_model_stage.py), the embodied `flow_bc`, `flow_rl`, `acob` and `accrue` (rlkit/embodied/) and the generative
`gen_pretrain` and `gen_rl` (rlkit/diffusion/). Each stage module registers
its kind on import (`stages.register_stage`).

Who needs the complete registry (validation, the run, the config printer) imports `STAGES` from here; the
stage modules themselves import only `rlkit.train.stages`, so no module imports the catalog and the catalog
is in no import cycle. A stage kind of a method's own registers itself the same way; its module only needs
to be imported before the config is validated (as a config file or a test does).
"""
from __future__ import annotations

from rlkit.diffusion import gen_pretrain_stage, gen_rl_stage  # noqa: F401
from rlkit.embodied import accrue_stage, acob_stage, bc_stage, flow_rl_stage  # noqa: F401
from rlkit.train import graft_stage, reward_model_stage, rl_stage, rquest_stage, sft_stage  # noqa: F401
from rlkit.train.stages import STAGES


def stage_needs(config) -> set[str]:
  """The run-level sections the configured stages use (tokenizer, task, data, model)."""
  return {need for name in config.stages for need in STAGES.get(config[name].kind).needs}
