"""MiMo-V2.6's advantage shaping on the RL stage: the token estimator `rl.advantage=gar` and its section `rl.gar`.
The maths is `rlkit.rewards.graders`; this module reads the reward's passing set (`correct`), the grader's
quality component, the responses' lengths and segment ids, and the reward's per-kind flags.

Order, per iteration: the length penalty is added to the successful rows' rewards; GAR turns the rewards into
advantages (quality-weighted redistribution over the passing rows, capped, re-centred); optionally the group's
reward std divides them (GRPO's scale; MiMo centres only); segment flags then mask or amplify the flagged
segments' tokens with each row's mass conserved. A reward marks a flagged segment kind with a component
`flag_<kind>` (1 where that row's segments of the kind are flagged: the tool task flags `tool_call` after a failed
call and `summary` without a stated value).
"""
from __future__ import annotations

import jax.numpy as jnp
import ml_collections

from rlkit.core.labels import SEGMENT_KINDS
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.rewards.graders import flag_weights, gar_advantages, length_penalties
from rlkit.train.phases.advantages import TOKEN_ESTIMATORS, TokenEstimator


def gar_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.quality = "quality"        # advantage=gar: the reward component read as the grader's quality f in (0, 1] of
                               # a passing row ("": 1 everywhere, GAR reduces to centred rewards)
  c.lam_cap = 2.0              # advantage=gar: the cap of GAR's redistribution factor lambda
  c.scale = False              # advantage=gar: divide by the group's reward std (GRPO); False: centre only (MiMo)
  c.length_coef = 0.0          # advantage=gar: the length penalty's coefficient (0: off)
  c.pass_rate_min = 0.5        # advantage=gar: the group pass rate from which successful rows are penalised
  c.anchor_quantile = 0.3      # advantage=gar: the quantile of the group's passing lengths that is the anchor
  c.flag_kinds = ""            # advantage=gar: segment kinds whose reward flags (components flag_<kind>) mask
                               # or amplify their tokens, comma-separated (e.g. "tool_call,summary"); "": none
  c.amplify = 2.0              # advantage=gar: the weight of a flagged token in a row of negative advantage
  return c


def flag_kinds(section, where: str = "gar") -> tuple[str, ...]:
  names = tuple(k.strip() for k in str(section.flag_kinds).split(",") if k.strip())
  for name in names:
    if name not in SEGMENT_KINDS or name == "pad":
      raise ValueError(f"{where}.flag_kinds: {name!r} is not a segment kind that holds tokens; choose from "
                       f"{', '.join(k for k in SEGMENT_KINDS if k != 'pad')}.")
  return names


def check(stage, name: str) -> None:
  g, where = stage.gar, f"{name}.gar"
  flag_kinds(g, where)
  for key, low, high in (("lam_cap", 0.0, float("inf")), ("anchor_quantile", 0.0, 1.0),
                         ("pass_rate_min", 0.0, 1.0)):
    value = float(getattr(g, key))
    if not low <= value <= high or (key == "lam_cap" and value <= 0):
      raise ValueError(f"{where}.{key}={value} is out of range; give a value in "
                       f"{'(0, inf)' if key == 'lam_cap' else f'[{low}, {high}]'}.")
  if float(g.length_coef) < 0 or float(g.amplify) < 1:
    raise ValueError(f"{where}: length_coef={g.length_coef} must be >= 0 and amplify={g.amplify} >= 1.")


def _component(arrays, name: str, why: str):
  if name not in arrays.components:
    raise ValueError(f"rl.advantage='gar' reads the reward component {name!r} ({why}), and this reward returns "
                     f"{sorted(arrays.components) or 'none'}; choose a reward that returns it or change rl.gar.")
  return arrays.components[name]


def _gar(arrays, batch, cfg, capacity, valid):
  g = cfg.gar
  if arrays.correct is None:
    raise ValueError("rl.advantage='gar' needs the reward's `correct` (the passing set GAR redistributes over), "
                     "and this reward returns none; use a reward with a notion of correct (e.g. code_tests).")
  rewards = arrays.rewards
  if float(g.length_coef) > 0:
    lengths = batch.loss_mask.sum(axis=1)
    rewards = rewards + length_penalties(lengths, arrays.correct, capacity, float(g.pass_rate_min),
                                         float(g.anchor_quantile), float(g.length_coef), valid)
  quality = _component(arrays, g.quality, "rl.gar.quality") if g.quality else jnp.ones_like(rewards)
  adv = gar_advantages(rewards, arrays.correct, quality, capacity, float(g.lam_cap), valid)
  if g.scale:
    std = jnp.repeat(jnp.reshape(rewards, (-1, capacity)).std(axis=1), capacity)
    adv = adv / (std + cfg.adv_eps)
  tokens = jnp.broadcast_to(adv[:, None], batch.loss_mask.shape)
  flagged = jnp.zeros(batch.loss_mask.shape, bool)
  for kind in flag_kinds(g):
    row = _component(arrays, f"flag_{kind}", "rl.gar.flag_kinds") > 0.5
    flagged = flagged | ((batch.segment_ids == SEGMENT_KINDS[kind]) & row[:, None])
  if flag_kinds(g):
    tokens = flag_weights(tokens, flagged, batch.loss_mask, float(g.amplify))
  return tokens, {}


TOKEN_ESTIMATORS.add("gar", TokenEstimator(_gar, needs_values=False))
RL_SECTIONS.add("gar", Section(gar_defaults, check, doc="MiMo-V2.6's GAR, length penalty and segment flags "
                                                        "(advantage=gar)"))
