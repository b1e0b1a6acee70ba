"""SLCA-GRPO on the RL stage (methods/llm.md §10): the token estimator `rl.advantage=slca` and its config section
`rl.slca`. The maths is `rlkit.objectives.segments`; this module reads the reward's per-segment rewards and the
batch's segment ids and hands the token advantages to whichever policy loss and correction the stage runs.

The reward must return `segment_rewards` ([N, S], one column per `SEGMENT_KINDS` kind: the tool task's reward
puts execution in `tool_call` and preference in `summary`); a reward without them stops the run naming the
fix. GRPO on the same reward is `rl.advantage=group` (the scalar reward is the columns' sum)."""
from __future__ import annotations

import ml_collections

from rlkit.core.labels import SEGMENT_KINDS
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.objectives.segments import gate_rewards, segment_advantages
from rlkit.train.phases.advantages import TOKEN_ESTIMATORS, TokenEstimator


def slca_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kinds = "tool_call,summary"  # advantage=slca: the credited segment kinds (SEGMENT_KINDS), comma-separated;
                                 # the first is the execution kind the gate reads
  c.weights = "1.0,1.0"          # advantage=slca: one weight per kind, applied after normalisation
  c.scale = True                 # advantage=slca: z-score each kind within its group (GRPO); False: centre only
  c.gate = False                 # advantage=slca: hierarchical rewards: a row whose execution reward is below
                                 # gate_threshold gets 0 reward for every other kind
  c.gate_threshold = 1.0         # advantage=slca: the execution reward a row needs to be credited for the others
  return c


def parse(section, where: str = "slca") -> tuple[tuple[int, ...], tuple[float, ...]]:
  """(kind ids, weights) of an `rl.slca` section; ValueError naming the key and the fix."""
  names = [k.strip() for k in str(section.kinds).split(",") if k.strip()]
  if not names:
    raise ValueError(f"{where}.kinds={section.kinds!r} names no segment kind; give e.g. 'tool_call,summary' "
                     f"(kinds: {', '.join(SEGMENT_KINDS)}).")
  for name in names:
    if name not in SEGMENT_KINDS or name == "pad":
      raise ValueError(f"{where}.kinds: {name!r} is not a segment kind that holds tokens; choose from "
                       f"{', '.join(k for k in SEGMENT_KINDS if k != 'pad')}.")
  if len(set(names)) != len(names):
    raise ValueError(f"{where}.kinds={section.kinds!r} names a kind twice; name each once.")
  try:
    weights = tuple(float(w) for w in str(section.weights).split(","))
  except ValueError:
    raise ValueError(f"{where}.weights={section.weights!r} is not a comma-separated list of numbers.") from None
  if len(weights) != len(names):
    raise ValueError(f"{where}.weights={section.weights!r} gives {len(weights)} weight(s) for {len(names)} kind(s) "
                     f"({', '.join(names)}); give one per kind.")
  if any(w < 0 for w in weights):
    raise ValueError(f"{where}.weights={section.weights!r} has a negative weight; weights must be >= 0.")
  if section.gate and len(names) < 2:
    raise ValueError(f"{where}.gate=True gates the kinds after the first on it, and kinds={section.kinds!r} has "
                     "one; add the kinds to gate or set gate=False.")
  return tuple(SEGMENT_KINDS[n] for n in names), weights


def check(stage, name: str) -> None:
  parse(stage.slca, f"{name}.slca")


def _slca(arrays, batch, cfg, capacity, valid):
  if arrays.segment_rewards is None:
    raise ValueError("rl.advantage='slca' needs per-segment rewards, and this reward returned none "
                     "(RewardOutput.segment_rewards); use a reward that scores each segment kind (e.g. the tool "
                     "task's) or another advantage estimator.")
  kinds, weights = parse(cfg.slca)
  rewards = arrays.segment_rewards
  if cfg.slca.gate:
    rewards = gate_rewards(rewards, kinds, float(cfg.slca.gate_threshold))
  adv = segment_advantages(rewards, batch.segment_ids, kinds, weights, capacity, eps=cfg.adv_eps,
                           scale=bool(cfg.slca.scale), valid=valid)
  return adv, {}


TOKEN_ESTIMATORS.add("slca", TokenEstimator(_slca, needs_values=False))
RL_SECTIONS.add("slca", Section(slca_defaults, check, doc="SLCA-GRPO's per-segment credit (advantage=slca)"))
