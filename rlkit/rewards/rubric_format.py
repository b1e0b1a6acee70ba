"""The rubric format of rlkit's rubric rewards (rlkit/rewards/rubric.py): parsing one example's rubric, with errors
that name the example, item, field and fix, and packing a batch of parsed rubrics into the arrays the aggregation
reads.

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
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from rlkit.rewards.rubric_judges import ITEM_JUDGES


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
