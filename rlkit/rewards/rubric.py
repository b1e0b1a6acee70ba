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

Rubric format, one list per example in an extra field (default "rubric"), each item a dict:

  {"criterion": "states the sum", "points": 3, "group": "answer", "critical": true,
   "check": {"kind": "answer_correct"}}

`group` (str or int) is optional: an item without one is its own group. `critical` defaults to false; a
penalty cannot be critical. `dimension` (str or int) is the item's dimension for mode `dimensions`; once one item
has one, every positive item needs one (a penalty none). A failure clause is an item without points that names
the dimension it fails: {"criterion": "writes past the answer", "fails": "answer", "check": {...}}; at most one
per dimension, and the other modes ignore it (0 points). `check.kind` names an item judge in `ITEM_JUDGES`
(rlkit/rewards/rubric_judges.py: contains, not_contains, regex, answer_correct, lm), the other keys of `check` are
its parameters. `tags` (HealthBench's) is accepted and ignored. `parse_rubric` refuses anything else, naming the
example and item.

The registered reward "rubric" judges every item of every row in the executor's worker (judges run on model
output: a regex can backtrack for ever), aggregates with `aggregate`, and returns rewards = reward, components
{gain, penalty, gate, additive} (the additive proxy is logged in every mode) and `correct` = every critical
item met, or, in a rubric without a critical item, every positive item met (our choice: the critical items are
the rubric's definition of success; penalties do not enter it). A row whose judging raised or hung scores
`failure_reward`, is not correct, and its components are those of a completion that meets no item.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.executor import VerifierExecutor
from rlkit.rewards.lm_judge import DEFAULT_TEMPLATE, LMJudge
from rlkit.rewards.rubric_judges import ITEM_JUDGES
from rlkit.rewards.verifier import RewardFn, check_float, register_reward

MET = 0.5                   # a judgment above this counts as met (for `correct`); exact judges give 0 or 1


# ----------------------------------------------------------------------------------------------- rubric format

class ItemCheck(NamedTuple):
  kind: str
  judge: Callable[[Any, str, str, Mapping[str, Any]], float]
  params: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Rubric:
  """One example's parsed rubric: K items, groups numbered 0..M-1 in order of first appearance, and (ProRubric's
  released protocol) dimensions numbered 0..D-1 likewise: `dimensions[k]` is criterion k's, `failure_of[k]` the
  dimension whose failure clause item k is (-1: none). A failure clause has 0 points, so only mode
  `dimensions` reads it."""
  criteria: tuple[str, ...]
  points: tuple[float, ...]
  groups: tuple[int, ...]
  critical: tuple[bool, ...]
  checks: tuple[ItemCheck, ...]
  dimensions: tuple[int, ...] = ()
  failure_of: tuple[int, ...] = ()
  dimension_names: tuple[Any, ...] = ()

  @property
  def num_groups(self) -> int:
    return max(self.groups) + 1


_ITEM_KEYS = ("criterion", "points", "group", "critical", "check", "tags", "dimension")
_CLAUSE_KEYS = ("criterion", "fails", "check", "tags")


def _parse_check(check, fail) -> ItemCheck:
  if not isinstance(check, Mapping):
    fail(f"'check' is {check!r}", 'give a dict {"kind": <judge>, ...its parameters}')
  kind = check.get("kind")
  if not isinstance(kind, str) or kind not in ITEM_JUDGES:
    fail(f"check.kind is {kind!r}" if "kind" in check else "check has no 'kind'",
         f"set check.kind to one of {ITEM_JUDGES.names()}")
  spec = ITEM_JUDGES.get(kind)
  params = {key: value for key, value in check.items() if key != "kind"}
  missing = [key for key in spec.required if key not in params]
  if missing:
    fail(f"check of kind {kind!r} lacks parameter(s) {missing}", f"add them ({kind!r} takes "
         f"{sorted(spec.required)} and optionally {sorted(spec.optional)})")
  types = {**spec.required, **spec.optional}
  for key, value in params.items():
    if key not in types:
      fail(f"check of kind {kind!r} has unknown parameter {key!r}", f"use only {sorted(types)}")
    if not isinstance(value, types[key]) or (types[key] is not bool and isinstance(value, bool)):
      fail(f"check.{key} is {value!r}", f"give a {types[key].__name__}")
  problem = spec.validate(params) if spec.validate else None
  if problem:
    fail(problem, "fix the check's parameters")
  return ItemCheck(kind, spec.judge, params)


def _name(value, key: str, fail, fix: str):
  """A group or dimension name: a string or an int (bool refused)."""
  if isinstance(value, bool) or not isinstance(value, (str, int)):
    fail(f"{key!r} is {value!r}", fix)
  return value


def parse_rubric(items, where: str) -> Rubric:
  """Validates a rubric (the format in the module docstring). A ValueError names `where` (the example), the
  item index, the bad field and the fix."""
  if not isinstance(items, (list, tuple)) or not items:
    raise ValueError(f"{where}: the rubric must be a non-empty list of items, got {items!r:.80}.")
  criteria, points, groups, critical, checks, dimension_of, clause_of = [], [], [], [], [], [], []
  group_index: dict[Any, int] = {}
  for k, item in enumerate(items):
    def fail(problem: str, fix: str):
      raise ValueError(f"{where}, rubric item {k}: {problem}; {fix}.")

    if not isinstance(item, Mapping):
      fail(f"expected a dict, got {type(item).__name__}", "give each item criterion, points and check")
    clause = "fails" in item
    keys = _CLAUSE_KEYS if clause else _ITEM_KEYS
    unknown = sorted(set(item) - set(keys))
    if unknown:
      fail(f"unknown field(s) {unknown}" + (" in a failure clause" if clause else ""), f"use only {list(keys)}"
           + (" (a clause scores nothing itself: it zeroes the dimension it names)" if clause else ""))
    for key in ("criterion", "check") if clause else ("criterion", "points", "check"):
      if key not in item:
        fail(f"{key!r} is missing", f"give every item {key!r} (format: rlkit/rewards/rubric.py)")
    criterion, w = item["criterion"], item.get("points", 0.0)
    if not isinstance(criterion, str) or not criterion.strip():
      fail(f"'criterion' is {criterion!r}", "give a non-empty string saying what the item checks")
    if not clause and (isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w == 0):
      fail(f"'points' is {w!r}", "give a finite non-zero number (negative for a penalty)")
    group = item.get("group")
    if group is None:
      group = ("ungrouped", k)        # a key no str or int group can equal: its own singleton group
    else:
      _name(group, "group", fail, "give a string or an int, or leave it out for a group of one")
    is_critical = item.get("critical", False)
    if not isinstance(is_critical, bool):
      fail(f"'critical' is {is_critical!r}", "give true or false")
    if is_critical and w < 0:
      fail(f"a penalty ({w} points) is marked critical", "drop 'critical' (penalties are never gated)")
    dimension = item.get("dimension")
    if dimension is not None:
      _name(dimension, "dimension", fail, "give a string or an int")
      if w < 0:
        fail(f"a penalty ({w} points) has a dimension", "drop 'dimension': a dimension holds criteria; the "
             "released protocol's way to penalise is a failure clause, an item {\"fails\": <dimension>, ...}")
    fails = _name(item["fails"], "fails", fail, "name the dimension the clause fails") if clause else None
    checks.append(_parse_check(item["check"], fail))
    criteria.append(criterion)
    points.append(float(w))
    groups.append(group_index.setdefault(group, len(group_index)))
    critical.append(is_critical)
    dimension_of.append(dimension)
    clause_of.append(fails)
  if not any(w > 0 for w in points):
    raise ValueError(f"{where}: the rubric has no item with positive points, so no score can be normalised; "
                     "add at least one positive item.")
  names, dimensions, failure_of = _dimensions(dimension_of, clause_of, points, where)
  return Rubric(tuple(criteria), tuple(points), tuple(groups), tuple(critical), tuple(checks), dimensions,
                failure_of, names)


def _dimensions(dimension_of: list, clause_of: list, points: list, where: str):
  """(names, each item's dimension index, each item's clause target index; -1 for none) from the items' raw
  `dimension` / `fails` values. Dimensions are all or nothing: once any item has one, every positive item
  needs one, and each clause must name a dimension that holds criteria, one clause per dimension."""
  k = len(points)
  if all(d is None for d in dimension_of) and all(f is None for f in clause_of):
    return (), (-1,) * k, (-1,) * k
  names = tuple(dict.fromkeys(d for d in dimension_of if d is not None))
  loose = [j for j in range(k) if points[j] > 0 and dimension_of[j] is None]
  if loose:
    raise ValueError(f"{where}: rubric item(s) {loose} have no 'dimension' while the rubric has "
                     f"{'dimensions ' + str(list(names)) if names else 'failure clauses'}; give every positive "
                     "item a dimension (the released ProRubric protocol groups the whole checklist), or none.")
  seen: dict[Any, int] = {}
  for j, target in enumerate(clause_of):
    if target is None:
      continue
    if target not in names:
      raise ValueError(f"{where}, rubric item {j}: a failure clause of dimension {target!r}, which holds no "
                       f"criterion; name one of {list(names)}.")
    if target in seen:
      raise ValueError(f"{where}, rubric item {j}: dimension {target!r} already has a failure clause (item "
                       f"{seen[target]}); merge the two into one check (e.g. a regex alternation).")
    seen[target] = j
  index = {name: i for i, name in enumerate(names)}
  return (names, tuple(-1 if d is None else index[d] for d in dimension_of),
          tuple(-1 if f is None else index[f] for f in clause_of))


def pack_rubrics(rubrics: Sequence[Rubric]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """Stacks N rubrics into (points [N,K] float32, group_onehot [N,K,M] float32, critical [N,K] bool,
  valid [N,K] bool). Padded items have zero points, no group and are not critical: they contribute nothing."""
  n = len(rubrics)
  k_max = max((len(r.points) for r in rubrics), default=0)
  m_max = max((r.num_groups for r in rubrics), default=0)
  points = np.zeros((n, k_max), np.float32)
  onehot = np.zeros((n, k_max, m_max), np.float32)
  critical = np.zeros((n, k_max), bool)
  valid = np.zeros((n, k_max), bool)
  for i, r in enumerate(rubrics):
    k = len(r.points)
    points[i, :k] = r.points
    onehot[i, np.arange(k), r.groups] = 1.0
    critical[i, :k] = r.critical
    valid[i, :k] = True
  return points, onehot, critical, valid


def pack_dimensions(rubrics: Sequence[Rubric]) -> tuple[np.ndarray, np.ndarray]:
  """(dimension_onehot [N,K,D], clause_onehot [N,K,D]) float32: item k of row i is a criterion of dimension d /
  its failure clause. A rubric without dimensions (or padding) has zero rows: `require_dimensions` first."""
  n = len(rubrics)
  k_max = max((len(r.points) for r in rubrics), default=0)
  d_max = max((len(r.dimension_names) for r in rubrics), default=0)
  member = np.zeros((n, k_max, d_max), np.float32)
  clause = np.zeros((n, k_max, d_max), np.float32)
  for i, r in enumerate(rubrics):
    for k, (d, f) in enumerate(zip(r.dimensions, r.failure_of)):
      if d >= 0:
        member[i, k, d] = 1.0
      if f >= 0:
        clause[i, k, f] = 1.0
  return member, clause


def require_dimensions(rubric: Rubric, where: str) -> None:
  """What mode `dimensions` needs of a rubric: dimensions, and no penalty (the protocol has none)."""
  if not rubric.dimension_names:
    raise ValueError(f"{where}: mode 'dimensions' (ProRubric's released protocol) scores dimensions, and this "
                     "rubric has none; give every positive item a 'dimension' (2-5 of them in the protocol).")
  penalties = [k for k, w in enumerate(rubric.points) if w < 0]
  if penalties:
    raise ValueError(f"{where}: mode 'dimensions' (ProRubric's released protocol) has no penalties, and rubric "
                     f"item(s) {penalties} are; express each as a failure clause of the dimension it should "
                     "zero, or score this rubric with another mode.")


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
