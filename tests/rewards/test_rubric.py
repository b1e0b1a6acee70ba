"""Rubric rewards: additive mode is HealthBench's score, ProRubric's equivalences and limits (singleton groups,
gate floor 1, hard gate, ungated penalties, padding, jit), the released protocol's dimensions (all or nothing,
failure clauses, weights, the weighted share, malformed dimensions), rubric validation, and the reward end to
end."""
import jax
import numpy as np
import pytest

from rlkit.data.tasks import Arithmetic
from rlkit.rewards import REWARDS
from rlkit.rewards import rubric as R
from tests.rewards import _verifiers as V


def item(points, kind="contains", group=None, critical=None, **params):
  check = {"kind": kind, **({"text": "x"} if kind == "contains" and not params else params)}
  out = {"criterion": f"worth {points}", "points": points, "check": check}
  if group is not None:
    out["group"] = group
  if critical is not None:
    out["critical"] = critical
  return out


def parsed(*rubric_items):
  return [R.parse_rubric(items, f"example {i}") for i, items in enumerate(rubric_items)]


def packed(*rubric_items):
  """pack_rubrics of one parsed rubric per argument (a list of items)."""
  return R.pack_rubrics(parsed(*rubric_items))


def agg(p, arrays, mode, dimensions=None, **kw):
  points, onehot, critical, _ = arrays
  return {k: np.asarray(v) for k, v in R.aggregate(np.asarray(p, np.float32), points, onehot, critical,
                                                   mode=mode, dimensions=dimensions, **kw).items()}


def random_rubric(rng, k, groups=3):
  """k items: about a third penalties, positives in `groups` groups (each group also their dimension), the
  first item critical."""
  out = []
  for j in range(k):
    w = float(rng.choice([-2.0, -0.5, 0.5, 1.0, 3.0])) if j else 3.0
    group = int(rng.integers(groups)) if w > 0 else None
    out.append(dict(item(w, group=group, critical=(j == 0) or None), **({"dimension": group} if w > 0 else {})))
  return out


# ----------------------------------------------------------------------------------------------- HealthBench

def test_additive_is_healthbench_per_example_score():
  """simple-evals' own test case (7, 5, 10, -6 with the second unmet: 11/22), a penalty that takes the score
  below 0 (not clipped per example), and a perfect score."""
  arrays = packed([item(7), item(5), item(10), item(-6)], [item(2), item(-5)], [item(1), item(1)])
  p = [[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 0, 0]]
  out = agg(p, arrays, "additive")
  np.testing.assert_allclose(out["additive"], [0.5, -2.5, 1.0], rtol=1e-6)
  np.testing.assert_allclose(out["reward"], out["additive"], rtol=1e-6)
  np.testing.assert_allclose(out["penalty"], [-6 / 22, -2.5, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(out["gate"], 1.0)


def test_healthbench_score_clips_the_mean_not_each_example():
  assert float(R.healthbench_score([0.5, -2.5, 1.0])) == 0.0            # mean -1/3
  np.testing.assert_allclose(float(R.healthbench_score([1.0, 0.5, -0.3])), 0.4, rtol=1e-6)
  assert float(R.healthbench_score([1.0, 1.0])) == 1.0


# ----------------------------------------------------------------------------------------------- ProRubric

def test_prorubric_hand_computed():
  """Decision (3, critical), two advice items in one group (0.5 each), a penalty (-1); Z = 4. Advice half met:
  the group's soft AND is 0, so gain = 3/4 where additive credits 3.5/4."""
  arrays = packed([item(3, critical=True), item(0.5, group="advice"), item(0.5, group="advice"), item(-1)])
  out = agg([[1, 1, 0, 1]], arrays, "gated_grouped")
  np.testing.assert_allclose([out[k][0] for k in ("gain", "gate", "penalty", "reward", "additive")],
                             [0.75, 1.0, -0.25, 0.5, 0.625], rtol=1e-6)
  soft = agg([[1, 0.5, 0.5, 0]], arrays, "grouped")                    # soft AND: 0.5 * 0.5
  np.testing.assert_allclose(soft["gain"], [(3 + 1.0 * 0.25) / 4], rtol=1e-6)
  np.testing.assert_allclose(soft["additive"], [(3 + 0.5) / 4], rtol=1e-6)


def test_grouped_with_singleton_groups_equals_additive_for_any_p():
  rng = np.random.default_rng(0)
  rubrics = [[dict(it, group=j) for j, it in enumerate(random_rubric(rng, 6))] for _ in range(8)]
  arrays = packed(*rubrics)
  p = rng.uniform(size=(8, 6))
  p[rng.uniform(size=p.shape) < 0.3] = 0.0
  p[rng.uniform(size=p.shape) < 0.3] = 1.0
  grouped, additive = agg(p, arrays, "grouped"), agg(p, arrays, "additive")
  np.testing.assert_allclose(grouped["reward"], additive["reward"], rtol=1e-5, atol=1e-6)
  # and with real groups the soft AND gives strictly less credit on fractional judgments
  real = packed(*[[dict(it, group=0) if it["points"] > 0 else it for it in r] for r in rubrics])
  assert np.all(agg(p, real, "grouped")["gain"] < additive["gain"] - 1e-3)


def test_penalties_are_not_gated():
  arrays = packed([item(3, critical=True), item(1, group=0), item(1, group=0), item(-2), item(-1)])
  met = np.array([[1, 1, 1, 1, 0]], np.float32)
  failed_gate = met.copy()
  failed_gate[0, 0] = 0
  for mode in ("gated", "gated_grouped"):
    a, b = agg(met, arrays, mode), agg(failed_gate, arrays, mode)
    assert a["gate"][0] == 1.0 and b["gate"][0] == 0.0
    np.testing.assert_array_equal(a["penalty"], b["penalty"])
    np.testing.assert_allclose(b["penalty"], [-2 / 5], rtol=1e-6)
    np.testing.assert_allclose(b["reward"], b["penalty"], rtol=1e-6)      # hard gate: only the penalty is left


def test_gate_floor_one_is_no_gate():
  rng = np.random.default_rng(1)
  arrays = packed(*[random_rubric(rng, 5) for _ in range(6)])
  p = rng.uniform(size=(6, 5))
  for gated, ungated in (("gated", "additive"), ("gated_grouped", "grouped")):
    np.testing.assert_allclose(agg(p, arrays, gated, gate_floor=1.0)["reward"], agg(p, arrays, ungated)["reward"],
                               rtol=1e-6)
  assert np.any(agg(p, arrays, "gated")["gate"] < 0.9)                   # the floor, not the data, did it


def test_hard_gate_zeroes_gain_and_floor_softens_it():
  arrays = packed([item(2, critical=True), item(1), item(1)])
  p = [[0, 1, 1]]
  hard = agg(p, arrays, "gated")
  np.testing.assert_allclose([hard["gain"][0], hard["gate"][0], hard["reward"][0]], [0.5, 0.0, 0.0], atol=1e-7)
  soft = agg(p, arrays, "gated", gate_floor=0.25)
  np.testing.assert_allclose([soft["gate"][0], soft["reward"][0]], [0.25, 0.125], rtol=1e-6)
  # a fractional critical judgment scales the gain: gate = 0.25 + 0.75 * 0.6
  np.testing.assert_allclose(agg([[0.6, 1, 1]], arrays, "gated", gate_floor=0.25)["gate"], [0.7], rtol=1e-6)


@pytest.mark.parametrize("mode", sorted(R.MODES.names()))
def test_padding_changes_nothing(mode):
  """A short rubric scored alone, and stacked with a longer one (padded with zero-point items, whatever p the
  padding slots hold), gets the same scores."""
  rng = np.random.default_rng(2)
  short, long = random_rubric(rng, 3, groups=2), random_rubric(rng, 7, groups=4)
  p_short = rng.uniform(size=(1, 3))
  alone = agg(p_short, packed(short), mode, R.pack_dimensions(parsed(short)), gate_floor=0.1)
  arrays = packed(short, long)
  assert arrays[0].shape == (2, 7) and arrays[3].tolist()[0] == [True] * 3 + [False] * 4
  p = rng.uniform(size=(2, 7))
  p[0, :3] = p_short
  stacked = agg(p, arrays, mode, R.pack_dimensions(parsed(short, long)), gate_floor=0.1)
  for name, value in alone.items():
    np.testing.assert_allclose(stacked[name][:1], value, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", sorted(R.MODES.names()))
def test_jit_equals_eager(mode):
  rng = np.random.default_rng(3)
  rubrics = parsed(*[random_rubric(rng, 6) for _ in range(5)])
  points, onehot, critical, _ = R.pack_rubrics(rubrics)
  dims = R.pack_dimensions(rubrics)
  p = rng.uniform(size=(5, 6)).astype(np.float32)
  jitted = jax.jit(R.aggregate, static_argnames=("mode",))(p, points, onehot, critical, mode=mode, gate_floor=0.2,
                                                           dimensions=dims)
  eager = R.aggregate(p, points, onehot, critical, mode=mode, gate_floor=0.2, dimensions=dims)
  assert set(eager) >= {"reward", "gain", "penalty", "gate", "additive"}
  for name in eager:
    np.testing.assert_allclose(jitted[name], eager[name], rtol=1e-6, atol=1e-7, err_msg=name)


# ----------------------------------------------------------------------------------------------- dimensions

def clause(dimension, text="x"):
  return {"criterion": f"fails {dimension}", "fails": dimension, "check": {"kind": "contains", "text": text}}


def dim(points, dimension, **kw):
  return dict(item(points, **kw), dimension=dimension)


# decision (3) alone in "answer" with a failure clause; two style items (1 + 2) in "style"; Z = 6
DIMENSIONED = [dim(3, "answer", critical=True), dim(1, "style"), dim(2, "style"), clause("answer")]


def dims_score(p, rubrics=(DIMENSIONED,)):
  rubrics = parsed(*rubrics)
  return agg(p, R.pack_rubrics(rubrics), "dimensions", R.pack_dimensions(rubrics))


def test_dimensions_are_all_or_nothing_and_a_failure_clause_zeroes_its_dimension():
  p = [[1, 1, 1, 0],     # everything holds, no clause: 1
       [1, 1, 0, 0],     # style half met: nothing for style (additive would credit 1/6 of it)
       [1, 1, 1, 1],     # the clause fires: the answer's 3 points go, style stays
       [0, 1, 1, 0],     # the decision fails: style still counts (no gate in the protocol)
       [0, 0, 0, 1]]
  out = dims_score(p)
  np.testing.assert_allclose(out["reward"], [1.0, 0.5, 0.5, 0.5, 0.0], rtol=1e-6)
  np.testing.assert_allclose(out["additive"], [1.0, 4 / 6, 1.0, 0.5, 0.0], rtol=1e-6)   # clauses score nothing
  np.testing.assert_array_equal(out["gate"], 1.0)
  np.testing.assert_array_equal(out["penalty"], 0.0)
  soft = dims_score([[1, 0.5, 0.8, 0.25]])      # soft AND: style 0.4, answer 1 - 0.25
  np.testing.assert_allclose(soft["reward"], [(3 * 0.75 + 3 * 0.4) / 6], rtol=1e-6)


def test_dimension_weights_are_the_sums_of_their_criteria_points():
  rubric = [dim(1, "a"), dim(2, "a"), dim(3, "a"), dim(4, "b"), dim(0.5, "c"), dim(0.5, "c")]   # W = 6, 4, 1
  for held, share in (((1, 1, 1, 0, 0, 1), 6 / 11), ((0, 1, 1, 1, 1, 1), 5 / 11), ((1, 1, 1, 1, 0, 0), 10 / 11)):
    np.testing.assert_allclose(dims_score([held], [rubric])["reward"], [share], rtol=1e-6)


def test_the_score_is_the_weighted_share_of_dimensions_met():
  """Against a loop over dimensions, on random rubrics (2-5 dimensions, some with a clause) and 0/1 judgments."""
  rng = np.random.default_rng(4)
  rubrics, expected, ps = [], [], []
  for _ in range(20):
    d = int(rng.integers(2, 6))
    items = [dim(float(rng.choice([0.5, 1.0, 3.0])), int(rng.integers(d))) for _ in range(8)]
    names = sorted({it["dimension"] for it in items})
    clauses = [clause(n) for n in names if rng.uniform() < 0.5]
    rubric = items + clauses
    p = (rng.uniform(size=len(rubric)) < 0.7).astype(float)
    weight = {n: sum(it["points"] for it in items if it["dimension"] == n) for n in names}
    met = {n: all(p[k] for k, it in enumerate(items) if it["dimension"] == n)
           and not any(p[len(items) + j] for j, c in enumerate(clauses) if c["fails"] == n) for n in names}
    expected.append(sum(weight[n] for n in names if met[n]) / sum(weight.values()))
    rubrics.append(rubric)
    ps.append(p)
  width = max(len(r) for r in rubrics)
  p = np.array([np.pad(x, (0, width - len(x))) for x in ps])
  np.testing.assert_allclose(dims_score(p, rubrics)["reward"], expected, rtol=1e-6)


def test_the_other_modes_ignore_dimensions_and_failure_clauses():
  plain = [item(3, critical=True), item(1), item(2)]
  p = np.array([[1, 1, 0, 1], [0, 1, 1, 1], [1, 0.5, 0.3, 0.2]], np.float32)
  for mode in ("additive", "gated", "grouped", "gated_grouped"):
    with_dims, without = agg(p, packed(DIMENSIONED), mode), agg(p[:, :3], packed(plain), mode)
    for name in with_dims:
      np.testing.assert_allclose(with_dims[name], without[name], rtol=1e-6, err_msg=f"{mode} {name}")


def test_dimensions_mode_needs_the_dimension_arrays():
  with pytest.raises(ValueError, match=r"mode 'dimensions' needs dimensions=\(dimension_onehot, clause_onehot\)"):
    agg([[1, 1, 1, 0]], packed(DIMENSIONED), "dimensions")


@pytest.mark.parametrize("bad, message", [
    ([dim(1, "a"), item(2)], r"^e: rubric item\(s\) \[1\] have no 'dimension' while the rubric has dimensions "
                             r"\['a'\]; give every positive item a dimension"),
    ([item(1), clause("a")], r"^e: rubric item\(s\) \[0\] have no 'dimension' while the rubric has failure clauses"),
    ([dim(1, "a"), clause("b")], r"^e, rubric item 1: a failure clause of dimension 'b', which holds no criterion; "
                                 r"name one of \['a'\]"),
    ([dim(1, "a"), clause("a"), clause("a", "y")], r"^e, rubric item 2: dimension 'a' already has a failure clause "
                                                   r"\(item 1\); merge the two"),
    ([dim(1, "a"), dict(clause("a"), points=1)], r"^e, rubric item 1: unknown field\(s\) \['points'\] in a failure "
                                                 r"clause; use only \['criterion', 'fails', 'check', 'tags'\]"),
    ([dim(1, "a"), dict(clause("a"), fails=["a"])], r"^e, rubric item 1: 'fails' is \['a'\]; name the dimension"),
    ([dim(1, "a"), dim(1, True)], r"^e, rubric item 1: 'dimension' is True; give a string or an int"),
    ([dim(1, "a"), dim(-1, "a")], r"^e, rubric item 1: a penalty \(-1 points\) has a dimension; drop 'dimension'"),
    ([dim(1, "a"), {"fails": "a", "check": {"kind": "answer_correct"}}], r"^e, rubric item 1: 'criterion' is missing"),
])
def test_malformed_dimensions_are_refused_naming_the_item(bad, message):
  with pytest.raises(ValueError, match=message):
    R.parse_rubric(bad, "e")


def test_dimensions_are_numbered_in_order_of_first_appearance():
  rubric = R.parse_rubric([dim(1, "b"), clause("a"), dim(1, "a"), dim(1, 7), dim(1, "b")], "e")
  assert rubric.dimension_names == ("b", "a", 7)
  assert rubric.dimensions == (0, -1, 1, 2, 0) and rubric.failure_of == (-1, 1, -1, -1, -1)
  assert rubric.points[1] == 0.0 and not rubric.critical[1]
  assert R.parse_rubric([item(1)], "e").dimension_names == ()


# ----------------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("bad, message", [
    ({"criterion": "c", "check": {"kind": "answer_correct"}}, r"'points' is missing; give every item"),
    (item(0), r"'points' is 0; give a finite non-zero number"),
    (item(float("inf")), r"'points' is inf"),
    (dict(item(1), criterion=""), r"'criterion' is ''"),
    (item(1, kind="contians"), r"check.kind is 'contians'; set check.kind to one of \['answer_correct', "
                               r"'contains', 'lm', 'not_contains', 'regex'\]"),
    ({"criterion": "c", "points": 1, "check": {"kind": "not_contains"}},
     r"check of kind 'not_contains' lacks parameter\(s\) \['text'\]"),
    (item(1, text="a", case_sensitive="no"), r"check.case_sensitive is 'no'; give a bool"),
    (item(1, kind="regex", pattern="("), r"check.pattern '\(' is not a valid regular expression"),
    (item(-1, critical=True), r"a penalty \(-1 points\) is marked critical"),
    (dict(item(1), critcal=True), r"unknown field\(s\) \['critcal'\]"),
    (item(1, group=[1]), r"'group' is \[1\]"),
])
def test_bad_rubric_items_name_the_example_and_the_item(bad, message):
  with pytest.raises(ValueError, match=r"^example 3 \(prompt '12\+3='\), rubric item 1: " + message):
    R.parse_rubric([item(2), bad], "example 3 (prompt '12+3=')")


def test_a_rubric_needs_a_positive_item():
  with pytest.raises(ValueError, match=r"^example 0: the rubric has no item with positive points"):
    R.parse_rubric([item(-1), item(-2)], "example 0")
  with pytest.raises(ValueError, match=r"^example 0: the rubric must be a non-empty list"):
    R.parse_rubric([], "example 0")


def test_groups_are_numbered_and_ungrouped_items_stand_alone():
  rubric = R.parse_rubric([item(1, group="a"), item(1), item(1, group=7), item(1, group="a"), item(1)], "e")
  assert rubric.groups == (0, 1, 2, 0, 3) and rubric.num_groups == 4


def test_reward_kwargs_are_checked(executor):
  make = REWARDS.get("rubric")
  with pytest.raises(ValueError, match=r"reward 'rubric': mode must be one of \['additive', 'dimensions', "
                                       r"'gated', 'gated_grouped', 'grouped'\], got 'gear'"):
    make(Arithmetic(), executor, mode="gear")
  with pytest.raises(ValueError, match=r"reward 'rubric': gate_floor must be in \[0, 1\]"):
    make(Arithmetic(), executor, gate_floor=1.5)
  with pytest.raises(ValueError, match=r"reward 'rubric': unknown keyword\(s\) \['floor'\]"):
    make(Arithmetic(), executor, floor=0.5)


# ----------------------------------------------------------------------------------------------- end to end

ARITHMETIC_RUBRIC = [
    {"criterion": "the sum is right", "points": 3, "critical": True, "check": {"kind": "answer_correct"}},
    {"criterion": "explains", "points": 1, "group": "why", "check": {"kind": "contains", "text": "because"}},
    {"criterion": "names 12", "points": 1, "group": "why", "check": {"kind": "regex", "pattern": r"\b12\b"}},
    {"criterion": "hedges", "points": -1, "check": {"kind": "contains", "text": "maybe", "case_sensitive": False}},
]
GREETING_RUBRIC = [   # no critical item: correct = both positive items met
    {"criterion": "greets", "points": 2, "check": {"kind": "contains", "text": "hi"}},
    {"criterion": "stays", "points": 2, "check": {"kind": "not_contains", "text": "bye"}},
]


def test_rubric_reward_end_to_end(executor):
  """Z = 5 for the arithmetic rubric: row 0 meets everything; row 1 fails the critical sum (hard gate, 0 where
  additive gives 0.4); row 2 is right but hedges (0.6 - 0.2); row 3 fails the gate, half the 'why' group and
  hedges (only the penalty is left)."""
  completions = ["15 because 12+3", "14 because 12+3", "15 Maybe", "14 maybe because", "hi", "hi bye"]
  fields = [{"rubric": ARITHMETIC_RUBRIC}] * 4 + [{"rubric": GREETING_RUBRIC}] * 2
  batch = V.make_batch(completions, ["15"] * 6, fields=fields)
  out = REWARDS.get("rubric")(Arithmetic(), executor)(batch)
  np.testing.assert_allclose(out.rewards, [1.0, 0.0, 0.4, -0.2, 1.0, 0.5], atol=1e-6)
  np.testing.assert_allclose(out.components["additive"], [1.0, 0.4, 0.4, 0.0, 1.0, 0.5], atol=1e-6)
  np.testing.assert_allclose(out.components["gain"], [1.0, 0.4, 0.6, 0.0, 1.0, 0.5], atol=1e-6)
  np.testing.assert_allclose(out.components["penalty"], [0, 0, -0.2, -0.2, 0, 0], atol=1e-6)
  np.testing.assert_array_equal(out.components["gate"], [1, 0, 1, 0, 1, 1])
  np.testing.assert_array_equal(out.correct, [True, False, True, False, True, False])
  assert out.failures == {} and out.rewards.dtype == np.float64
  additive = REWARDS.get("rubric")(Arithmetic(), executor, mode="additive")(batch)
  np.testing.assert_allclose(additive.rewards, out.components["additive"], atol=1e-6)


def test_rubric_reward_failures_and_missing_field(executor):
  rubric = [{"criterion": "right", "points": 1, "critical": True, "check": {"kind": "answer_correct"}}]
  batch = V.make_batch(["5", "zero"], ["5", "5"], fields=[{"rubric": rubric}] * 2)
  out = REWARDS.get("rubric")(V.MisbehavingTask(), executor, failure_reward=-1.0)(batch)
  np.testing.assert_allclose(out.rewards, [1.0, -1.0])
  np.testing.assert_array_equal(out.correct, [True, False])
  assert out.failures == {"ZeroDivisionError": 1}

  reward_fn = REWARDS.get("rubric")(Arithmetic(), executor)
  batch = V.make_batch(["15", "15"], ["15"] * 2, prompts=["12+3=", "7+8="],
                       fields=[{"rubric": ARITHMETIC_RUBRIC}, {"rubrics": ARITHMETIC_RUBRIC}])
  with pytest.raises(ValueError, match=r"reward 'rubric': row 1's example \(prompt '7\+8='\) has no 'rubric' field "
                                       r"\(its fields: \['rubrics'\]\)"):
    reward_fn(batch)
  batch = V.make_batch(["15"], ["15"], prompts=["12+3="], fields=[{"rubric": [{"criterion": "c", "check": {}}]}])
  with pytest.raises(ValueError, match=r"row 0's example \(prompt '12\+3='\), rubric item 0: 'points' is missing"):
    reward_fn(batch)


SUM_RUBRIC = [   # the released protocol's shape: two dimensions, the answer's with a failure clause
    {"criterion": "the sum is right", "points": 3, "dimension": "answer", "critical": True,
     "check": {"kind": "answer_correct"}},
    {"criterion": "explains", "points": 1, "dimension": "why", "check": {"kind": "contains", "text": "because"}},
    {"criterion": "names 12", "points": 1, "dimension": "why", "check": {"kind": "regex", "pattern": r"\b12\b"}},
    {"criterion": "hedges", "fails": "answer", "check": {"kind": "contains", "text": "maybe", "case_sensitive": False}},
]


def test_dimensions_reward_end_to_end(executor):
  """Z = 5: row 0 holds both dimensions; row 1 misses the sum (the 'why' dimension still counts: no gate); row 2
  is right but hedges (the clause zeroes the answer) and half-explains; row 3 is right and explains only."""
  completions = ["15 because 12+3", "14 because 12+3", "15 maybe because", "15 because"]
  batch = V.make_batch(completions, ["15"] * 4, fields=[{"rubric": SUM_RUBRIC}] * 4)
  out = REWARDS.get("rubric")(Arithmetic(), executor, mode="dimensions")(batch)
  np.testing.assert_allclose(out.rewards, [1.0, 0.4, 0.0, 0.6], atol=1e-6)
  np.testing.assert_allclose(out.components["gain"], out.rewards, atol=1e-6)
  np.testing.assert_allclose(out.components["additive"], [1.0, 0.4, 0.8, 0.8], atol=1e-6)
  np.testing.assert_array_equal(out.correct, [True, False, True, True])     # every critical item met
  gated = REWARDS.get("rubric")(Arithmetic(), executor, mode="gated")(batch)   # the clause is inert there
  np.testing.assert_allclose(gated.rewards, [1.0, 0.0, 0.8, 0.8], atol=1e-6)


def test_dimensions_reward_refuses_a_rubric_it_cannot_score(executor):
  reward_fn = REWARDS.get("rubric")(Arithmetic(), executor, mode="dimensions")
  batch = V.make_batch(["15"], ["15"], prompts=["12+3="], fields=[{"rubric": ARITHMETIC_RUBRIC}])
  with pytest.raises(ValueError, match=r"row 0's example \(prompt '12\+3='\): mode 'dimensions' \(ProRubric's "
                                       r"released protocol\) scores dimensions, and this rubric has none"):
    reward_fn(batch)
  with_penalty = SUM_RUBRIC + [{"criterion": "rude", "points": -1, "check": {"kind": "contains", "text": "!"}}]
  batch = V.make_batch(["15"], ["15"], prompts=["12+3="], fields=[{"rubric": with_penalty}])
  with pytest.raises(ValueError, match=r"mode 'dimensions' \(ProRubric's released protocol\) has no penalties, and "
                                       r"rubric item\(s\) \[4\] are; express each as a failure clause"):
    reward_fn(batch)
