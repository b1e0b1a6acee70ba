"""Rubric rewards: per-item checks on a completion, aggregated additively (HealthBench) or by ProRubric.

ProRubric is our design (DESIGN, ../shared/methods/llm.md §1), not a paper's method: it targets the *false
credit* of flat rubric scores, where a completion collects points for criteria that only count once the
decision that licenses them is right. Item k has points w_k (negative: a penalty), a group g(k) of items that
must succeed together, a `critical` flag, and a judgment p_k in [0, 1] (1: met). With Z = Σ_{w_k>0} w_k:

  additive  = Σ_k w_k p_k / Z                            HealthBench's per-example score (0/1 p, unclipped)
  s_j       = Π_{k∈j, w_k>0} p_k                         soft AND over a group's positive items (log space)
  gain      = Σ_j (Σ_{k∈j, w_k>0} w_k) s_j / Z
  gate      = λ + (1-λ) Π_{k critical} p_k               λ = gate_floor; λ=0 is a hard gate, λ=1 no gate
  penalty   = Σ_{w_k<0} w_k p_k / Z                      never gated: failing the gate must not escape it
  reward    = gate · gain + penalty

Modes (`MODES`) switch the two structures on and off: `additive` (singleton groups, no gate: reward ==
additive), `grouped` (gate ≡ 1), `gated` (singleton groups), `gated_grouped` (both). HealthBench's benchmark
number is the mean of the per-example scores clipped to [0, 1] (`healthbench_score`; simple-evals
healthbench_eval.py, `calculate_score` and `_compute_clipped_stats`).

Mode `dimensions` is ProRubric's *released* protocol (Estrellajer/ProRubric; ../shared/methods/primary-sources.md),
beside our design, not part of it: the checklist is grouped offline into dimensions d (2-5 in the release), each
with an optional failure clause c_d (a check that, when it fires, zeroes the dimension). A dimension scores only
if all of its criteria hold and its clause does not fire; its weight is the sum of its criteria's points:

  held_d    = Π_{k∈d} p_k · (1 - p_{c_d})                all-or-nothing for 0/1 judgments (soft AND otherwise)
  reward    = Σ_d W_d held_d / Σ_d W_d,  W_d = Σ_{k∈d} w_k   the weighted share of dimensions held

No critical gate and no penalty items: the protocol as we read it has neither (its way to zero a dimension is the
clause), so a rubric scored by this mode may not hold a penalty.

The rubric format (criteria, points, groups, critical items, dimensions and failure clauses, item checks) and its
parser are in rlkit/rewards/rubric_format.py.

The registered reward "rubric" judges every item of every row in the executor's worker (judges run on model
output: a regex can backtrack for ever), aggregates with `aggregate`, and returns rewards = reward, components
{gain, penalty, gate, additive} (the additive proxy is logged in every mode) and `correct` = every critical
item met, or, in a rubric without a critical item, every positive item met (our choice: the critical items are
the rubric's definition of success; penalties do not enter it). A row whose judging raised or hung scores
`failure_reward`, is not correct, and its components are those of a completion that meets no item.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.executor import VerifierExecutor
from rlkit.rewards.lm_judge import DEFAULT_TEMPLATE, LMJudge
from rlkit.rewards.rubric_format import (ItemCheck, Rubric, pack_dimensions, pack_rubrics, parse_rubric,
                                          require_dimensions)
from rlkit.rewards.rubric_judges import ITEM_JUDGES
from rlkit.rewards.verifier import RewardFn, check_float, register_reward

MET = 0.5                   # a judgment above this counts as met (for `correct`); exact judges give 0 or 1


# ----------------------------------------------------------------------------------------------- aggregation

class AggregationMode(NamedTuple):
  grouped: bool     # soft AND over each group's positive items (else each item is its own group)
  gated: bool       # gain multiplied by the softened critical gate (else gate ≡ 1)
  dimensions: bool = False   # ProRubric's released protocol: the gain is the weighted share of dimensions held


MODES: Registry[AggregationMode] = Registry("rubric aggregation mode")
MODES.add("additive", AggregationMode(grouped=False, gated=False))
MODES.add("grouped", AggregationMode(grouped=True, gated=False))
MODES.add("gated", AggregationMode(grouped=False, gated=True))
MODES.add("gated_grouped", AggregationMode(grouped=True, gated=True))
MODES.add("dimensions", AggregationMode(grouped=False, gated=False, dimensions=True))


def _soft_and(p, membership, eps: float):
  """Π_{k in set m} p_k for each set m of membership [N,K,M], as a sum of logs. A p below eps makes its set's
  product exactly 0 (instead of a floor of eps leaking credit through every failed group)."""
  log_p = jnp.log(jnp.maximum(p, eps))
  product = jnp.exp(jnp.einsum("nk,nkm->nm", log_p, membership))
  below = jnp.einsum("nk,nkm->nm", (p < eps).astype(p.dtype), membership)
  return jnp.where(below > 0, 0.0, product)


def aggregate(p, points, group_onehot, critical, *, mode: str = "gated_grouped", gate_floor=0.0,
              eps: float = 1e-6, dimensions=None) -> dict[str, jnp.ndarray]:
  """Rubric scores of N rows from item judgments p [N,K] in [0,1] (the module docstring's maths).

  Pure jnp, no loop over items; jit with `mode` (and `eps`) static, `gate_floor` may be traced. Mode
  `dimensions` also needs `dimensions` = (dimension_onehot, clause_onehot) [N,K,D] (`pack_dimensions`); the
  other modes ignore it. Returns [N] arrays: reward, gain (ungated), penalty (<= 0), gate, additive
  (HealthBench's score, in every mode).
  """
  structure = MODES.get(mode)
  p = jnp.asarray(p)
  dtype = jnp.result_type(p.dtype, jnp.float32)
  p = p.astype(dtype)
  points = jnp.asarray(points, dtype)
  group_onehot = jnp.asarray(group_onehot, dtype)
  positive = jnp.where(points > 0, points, 0.0)
  total = positive.sum(-1)
  z = jnp.where(total > 0, total, 1.0)          # a row of padding only scores 0, not NaN
  flat_gain = (p * positive).sum(-1) / z
  penalty = (p * jnp.where(points < 0, points, 0.0)).sum(-1) / z
  if structure.dimensions:
    if dimensions is None:
      raise ValueError("aggregate: mode 'dimensions' needs dimensions=(dimension_onehot, clause_onehot), "
                       "from pack_dimensions(rubrics).")
    member, clause = (jnp.asarray(x, dtype) for x in dimensions)
    criteria = (points > 0).astype(dtype)[..., None] * member
    held = _soft_and(p, criteria, eps) * _soft_and(1.0 - p, clause, eps)   # every criterion, and no clause
    gain = (held * jnp.einsum("nk,nkd->nd", positive, member)).sum(-1) / z
  elif structure.grouped:
    membership = (points > 0).astype(dtype)[..., None] * group_onehot
    group_points = jnp.einsum("nk,nkm->nm", positive, group_onehot)
    gain = (_soft_and(p, membership, eps) * group_points).sum(-1) / z
  else:
    gain = flat_gain                            # singleton groups: s_j = p_k exactly
  if structure.gated:
    all_critical = _soft_and(p, jnp.asarray(critical, dtype)[..., None], eps)[..., 0]   # 1 with none
    gate = gate_floor + (1.0 - gate_floor) * all_critical
  else:
    gate = jnp.ones_like(gain)
  return {"reward": gate * gain + penalty, "gain": gain, "penalty": penalty, "gate": gate,
          "additive": flat_gain + penalty}


# What host-side callers use (the reward once per batch, a task's eval hook once per row): eagerly, each of
# aggregate's ~30 ops is dispatched (and compiled per new shape) on its own.
jitted_aggregate = jax.jit(aggregate, static_argnames=("mode", "eps"))


def healthbench_score(per_example_scores):
  """HealthBench's benchmark number: the mean per-example (additive) score, clipped to [0, 1] after the mean."""
  return jnp.clip(jnp.mean(jnp.asarray(per_example_scores)), 0.0, 1.0)


# ----------------------------------------------------------------------------------------------- the reward

def judge_rubric_row(task, checks: Sequence[ItemCheck], width: int, completion: str, answer: str):
  """One row in the executor's worker: every item's judgment, zero-padded to `width` items."""
  scores = [0.0] * width
  for k, check in enumerate(checks):
    if ITEM_JUDGES.get(check.kind).in_process:
      continue                                # filled in by the reward's judge model
    score = float(check.judge(task, completion, answer, check.params))
    if not 0.0 <= score <= 1.0:               # NaN fails this too
      raise ValueError(f"rubric item {k}: judge {check.kind!r} returned {score}, outside [0, 1]")
    scores[k] = score
  return scores[0] if width == 1 else scores  # the executor takes a bare float for a one-value row


def _batch_rubrics(batch: RewardBatch, field: str, dimensions: bool) -> list[Rubric]:
  parsed: dict[int, Rubric] = {}              # rows of one example share its list: parse it once per call
  rubrics = []
  for i, (fields, prompt) in enumerate(zip(batch.fields, batch.prompts)):
    where = f"reward 'rubric': row {i}'s example (prompt {prompt[:40]!r})"
    if field not in fields:
      raise ValueError(f"{where} has no {field!r} field (its fields: {sorted(fields)}); give every example a "
                       f"{field!r} list of rubric items, or set the reward's `field` kwarg to the field that "
                       "holds them.")
    items = fields[field]
    if id(items) not in parsed:
      parsed[id(items)] = parse_rubric(items, where)
      if dimensions:
        require_dimensions(parsed[id(items)], where)
    rubrics.append(parsed[id(items)])
  return rubrics


def _model_judgments(p, rubrics, batch: RewardBatch, judge, template: str) -> None:
  """Fills p [N, K] in place with the judge model's judgments of every "lm" item."""
  cells, texts = [], []
  for i, rubric in enumerate(rubrics):
    for k, check in enumerate(rubric.checks):
      if ITEM_JUDGES.get(check.kind).in_process:
        question = check.params.get("question", rubric.criteria[k])
        cells.append((i, k))
        texts.append(template.format(prompt=batch.prompts[i], completion=batch.completions[i], criterion=question))
  if cells:
    rows, cols = np.array(cells).T
    p[rows, cols] = judge(texts)


@register_reward("rubric", role_kwargs=("judge_role",))
def make_rubric_reward(task, executor: VerifierExecutor, *, models, mode: str = "gated_grouped",
                       gate_floor: float = 0.0, field: str = "rubric", failure_reward: float = 0.0,
                       judge_role: str = "", judge_template: str = DEFAULT_TEMPLATE, judge_yes: str = "Y",
                       judge_no: str = "N", judge_batch_size: int = 64, judge_max_len: int = 512) -> RewardFn:
  """Rubric reward: each example's rubric (its `field`) judged item by item and aggregated by `mode`.

  Items of kind "lm" are judged by the model of role `judge_role` (config.models): P(judge_yes) against
  P(judge_no) after `judge_template` filled with the row's prompt, completion and the item's question."""
  if mode not in MODES:
    raise ValueError(f"reward 'rubric': mode must be one of {MODES.names()}, got {mode!r}.")
  gate_floor = check_float("rubric", "gate_floor", gate_floor)
  failure_reward = check_float("rubric", "failure_reward", failure_reward)
  if not 0.0 <= gate_floor <= 1.0:
    raise ValueError(f"reward 'rubric': gate_floor must be in [0, 1] (0: hard gate, 1: no gate), got {gate_floor}.")
  if not isinstance(field, str) or not field:
    raise ValueError(f"reward 'rubric': field must be the name of an example field, got {field!r}.")
  judge_row = functools.partial(judge_rubric_row, task)   # one object: the executor sends it to its worker once
  judge = None
  if judge_role:
    if judge_role not in models:
      raise ValueError(f"reward 'rubric': judge_role={judge_role!r} is not a model of this run (roles: "
                       f"{', '.join(models) or 'none'}); declare it in config.models.")
    judge = LMJudge(models[judge_role], yes=judge_yes, no=judge_no, batch_size=judge_batch_size,
                    max_len=judge_max_len)

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    n = len(batch)
    if n == 0:
      empty = np.zeros(0, np.float64)
      return RewardOutput(empty, np.zeros(0, bool), {k: empty for k in ("gain", "penalty", "gate", "additive")}, {})
    rubrics = _batch_rubrics(batch, field, MODES.get(mode).dimensions)
    points, onehot, critical, _ = pack_rubrics(rubrics)
    width = points.shape[1]
    rows = [(r.checks, width, c, a) for r, c, a in zip(rubrics, batch.completions, batch.answers)]
    out = executor.map(judge_row, rows, fallback=np.zeros(width))
    p = out.values.reshape(n, width).copy()
    if any(ITEM_JUDGES.get(c.kind).in_process for r in rubrics for c in r.checks):
      if judge is None:
        raise ValueError("reward 'rubric': a rubric has items of kind 'lm', which a judge model decides; set the "
                         "reward's judge_role to a role of config.models (reward.kwargs.judge_role).")
      _model_judgments(p, rubrics, batch, judge, judge_template)
    dims = pack_dimensions(rubrics) if MODES.get(mode).dimensions else None
    parts = {name: np.asarray(value, np.float64)
             for name, value in jitted_aggregate(p, points, onehot, critical, mode=mode, gate_floor=gate_floor,
                                                 dimensions=dims).items()}
    met = p > MET
    has_critical = critical.any(-1)
    required = np.where(has_critical[:, None], critical, points > 0)
    correct = np.all(met | ~required, axis=-1) & ~out.failed
    rewards = np.where(out.failed, failure_reward, parts["reward"])
    components = {name: parts[name] for name in ("gain", "penalty", "gate", "additive")}
    return RewardOutput(rewards=rewards, correct=correct, components=components, failures=out.failures)
  return reward_fn
