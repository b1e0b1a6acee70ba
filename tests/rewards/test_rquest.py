"""R-Quest: question validity reasons, exact answers against the tasks' evaluator, what each fingerprint level
equates and separates (and a brute-force identity oracle), the memory bank (add, refresh, eviction, decay,
purity, exact round trip), the proposer / baseline / reject-head rewards, and the executor row."""
import functools
import io
import itertools

import numpy as np
import pytest

from rlkit.data.tasks import combine, evaluate_expression
from rlkit.models.tokenizer import DEFAULT_ALPHABET
from rlkit.rewards import question_checker as C
from rlkit.rewards import rquest as Q

GOOD = [("a=3,b=5:a*b+2", 17), ("x=2:x*x-1", 3), ("a=3, b=5 : (a+b)*2", 16), ("b=5,a=3:a-b", -2),
        ("a=10:a*100", 1000), ("a=1:a-1000", -999), ("q=7,z=2:(q-z)*(q+z)", 45)]
BAD = [("", "length"), ("a=1:" + "a+" * 30 + "1", "length"), ("a=3;a+1", "parse"), ("a=3:a+", "parse"),
       ("a=3:2a", "parse"), ("A=3:A+1", "parse"), ("ab=3:ab+1", "parse"), ("a=3:a/2", "parse"),
       ("a=-3:a+1", "parse"), ("a=3:a:a", "parse"), ("a=3,:a+1", "parse"), ("a=3,a=4:a+1", "rebound"),
       (":3+4", "arity"), ("3+4", "parse"), ("a=1,b=2,c=3:a+b+c", "arity"), ("a=3:a+b", "unbound"),
       ("a=3,b=5:a+1", "unused"), ("a=3,b=5:a+b-b", "unused"), ("a=3,b=5:a+b*0", "unused"),
       ("a=3:a-a+7", "unused"), ("a=3:a", "trivial"), ("a=3:(a)", "trivial"), ("a=3:a*1", "trivial"),
       ("a=3:a*a-a*a+a", "trivial"), ("a=3,b=5:a*b-b*a+b", "unused"), ("a=10:a*100+1", "range"),
       ("a=1:a-1002", "range"), ("a=30,b=50:a*b*a", "range")]


def fp(text, level="instance"):
  return C.fingerprint(text, level)


# ------------------------------------------------------------------------------------------------ validity

@pytest.mark.parametrize("text,answer", GOOD)
def test_valid_questions_have_their_exact_answer(text, answer):
  assert C.check_validity(text, max_value=1000, max_chars=48) == (True, "ok", answer)


@pytest.mark.parametrize("text,reason", BAD)
def test_invalid_questions_give_their_reason(text, reason):
  valid, got, answer = C.check_validity(text, max_value=1000, max_chars=48)
  assert (valid, got, answer) == (False, reason, None)
  assert reason in C.REASONS


def test_range_and_length_limits_are_parameters():
  assert C.check_validity("a=30,b=50:a*b*a", max_value=45000, max_chars=48) == (True, "ok", 45000)
  assert C.check_validity("a=3,b=5:a*b+2", max_value=1000, max_chars=12)[1] == "length"
  with pytest.raises(ValueError, match="max_value"):
    C.check_validity("a=3:a+1", max_value=-1, max_chars=48)
  with pytest.raises(ValueError, match="max_chars"):
    C.check_validity("a=3:a+1", max_value=10, max_chars=10_000)


def random_question(rng, atoms=5):
  """A random expression over a, b and small literals (tasks.combine adds the needed parentheses)."""
  names = ["a", "b"][:int(rng.integers(1, 3))]
  parts = [(str(rng.choice(names)) if rng.random() < 0.6 else str(int(rng.integers(0, 10))), 3)
           for _ in range(int(rng.integers(1, atoms + 1)))]
  while len(parts) > 1:
    i, j = rng.choice(len(parts), size=2, replace=False)
    joined = combine(parts[i], parts[j], "+-*"[int(rng.integers(3))])
    parts = [p for k, p in enumerate(parts) if k not in (i, j)] + [joined]
  values = {n: int(rng.integers(0, 20)) for n in names}
  return ",".join(f"{n}={v}" for n, v in values.items()) + ":" + parts[0][0], values, parts[0][0]


def test_answers_agree_with_the_tasks_evaluator_on_substituted_text():
  rng = np.random.default_rng(0)
  checked = 0
  for _ in range(300):
    text, values, body = random_question(rng)
    q = C.parse_question(text)
    substituted = "".join(str(values[c]) if c.isalpha() else c for c in body)
    assert C.evaluate(q.expression, dict(q.bindings)) == evaluate_expression(substituted)[0]
    valid, _, answer = C.check_validity(text, max_value=10 ** 9, max_chars=64)
    if valid:
      assert answer == evaluate_expression(substituted)[0]
      checked += 1
  assert checked > 50


def test_consensus_gates_validity():
  got = Q.consensus_valid([True, True, False], [0.25, 0.2, 1.0], tau_cons=0.25)
  np.testing.assert_array_equal(got, [True, False, False])


# ---------------------------------------------------------------------------------------------- fingerprints

@pytest.mark.parametrize("level", C.LEVELS)
@pytest.mark.parametrize("left,right", [
    ("a=3,b=5:a+b", "a=3,b=5:b+a"),                 # commuted
    ("a=3,b=5:2*(a+b)", "a=3,b=5:2*a+2*b"),         # distributed
    ("a=3,b=5:(a*b)*2+1", "a=3,b=5:1+b*(2*a)"),     # associativity, commutativity, constants moved
    ("x=3,y=5:x+y", "a=3,b=5:a+b"),                 # renamed consistently
    ("a=3,b=5:a*b-a", "b=5,a=3:a*b-a"),             # bindings in another order
    ("a=3,b=5:a-b", "a=5,b=3:b-a"),                 # renamed a<->b: the same question
    ("a=4:a*a+a", "z=4:z*(z+1)"),
])
def test_equivalent_questions_collide(left, right, level):
  assert fp(left, level) == fp(right, level)


def test_a_minus_b_and_b_minus_a_differ_as_instances_and_merge_as_skills():
  # With the same bindings, a-b (= -2) and b-a (= 2) are different questions ...
  assert fp("a=3,b=5:a-b", "instance") != fp("a=3,b=5:b-a", "instance")
  # ... but the same skill: b-a is a-b with the variables renamed.
  assert fp("a=3,b=5:a-b", "skill") == fp("a=3,b=5:b-a", "skill")


@pytest.mark.parametrize("level", C.LEVELS)
def test_sum_and_product_differ_even_with_equal_answers(level):
  assert C.check_validity("a=2,b=2:a+b")[2] == C.check_validity("a=2,b=2:a*b")[2] == 4
  assert fp("a=2,b=2:a+b", level) != fp("a=2,b=2:a*b", level)


def test_instance_level_separates_bound_values_and_skill_level_merges_them():
  practice = ["a=3,b=5:a*b+2", "a=4,b=6:a*b+2", "x=9,y=1:y*x+2", "a=4:a*a+2"]
  instances = {fp(t, "instance") for t in practice}
  skills = {fp(t, "skill") for t in practice[:3]}
  assert len(instances) == 4 and len(skills) == 1
  assert fp(practice[3], "skill") not in skills            # a*a is not a*b
  assert fp("a=3,b=5:a*b+2", "skill") != fp("a=3,b=5:a*b+3", "skill")   # coefficients are part of the skill
  assert fp("a=3:a+1", "skill") == fp("b=8:b+1", "skill")


def test_fingerprint_is_a_deterministic_64_bit_int_of_the_parsed_question():
  h = fp("a=3,b=5:a*b+2")
  assert isinstance(h, int) and 0 <= h < 2 ** 64
  assert h == fp("a=3,b=5:a*b+2") == C.fingerprint(C.parse_question("a=3,b=5:a*b+2"))
  assert fp("a=3,b=5:a*b+2", "instance") != fp("a=3,b=5:a*b+2", "skill")
  with pytest.raises(ValueError, match="level"):
    fp("a=3:a+1", "surface")
  with pytest.raises(ValueError, match="not a question"):
    fp("a=3;a+1")


def grid_key(text):
  """Brute-force skill identity: a polynomial of degree <= 9 per variable is fixed by its values on a
  10x10 grid; the key is the smallest value table over the renamings, as the fingerprint does."""
  q = C.parse_question(text)
  names = sorted(set(q.used) | {n for n, _ in q.bindings})
  tables = []
  for cols in itertools.permutations(range(2), len(names)):
    tables.append(tuple(C.evaluate(q.expression, {n: (i, j)[c] for n, c in zip(names, cols)})
                        for i in range(10) for j in range(10)))
  return min(tables)


def test_skill_fingerprints_match_a_brute_force_identity_oracle():
  rng = np.random.default_rng(1)
  texts = [random_question(rng, atoms=4)[0] for _ in range(400)]
  by_key, by_fp = {}, {}
  for t in texts:
    by_key.setdefault(grid_key(t), set()).add(t)
    by_fp.setdefault(fp(t, "skill"), set()).add(t)
  assert sorted(map(sorted, by_key.values())) == sorted(map(sorted, by_fp.values()))
  assert len(by_key) < len(texts) // 2           # plenty of collisions were there to be found


# ------------------------------------------------------------------------------------------------ memory bank

def arrays(bank):
  return [np.array(x) for x in bank]


def assert_same_bank(x, y):
  for a, b in zip(x, y):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def test_bank_add_and_contains_count_in_call_duplicates_once():
  bank = Q.bank_init(8)
  assert bank.hashes.dtype == np.uint64 and bank.steps.dtype == np.int64 and int(bank.cursor) == 0
  big = 2 ** 64 - 1
  bank = Q.bank_add(bank, [7, big, big, 3], step=0)
  assert int(bank.cursor) == 3
  np.testing.assert_array_equal(Q.bank_contains(bank, [3, 7, big, 5]), [True, True, True, False])
  np.testing.assert_array_equal(bank.hashes[:3], np.array([7, big, 3], np.uint64))
  np.testing.assert_array_equal(bank.valid, np.arange(8) < 3)
  assert (bank.hashes[3:] == 0).all() and (bank.steps[3:] == -1).all()


def test_bank_evicts_oldest_and_refresh_protects():
  bank = Q.bank_add(Q.bank_init(3), [1, 2, 3], step=0)
  evicted = Q.bank_add(bank, [4], step=1)
  np.testing.assert_array_equal(Q.bank_contains(evicted, [1, 2, 3, 4]), [False, True, True, True])
  refreshed = Q.bank_add(bank, [1], step=1)                 # 1 seen again: its step is now 1, it is newest
  assert int(refreshed.cursor) == 3 and refreshed.steps[refreshed.hashes == 1].tolist() == [1]
  after = Q.bank_add(refreshed, [4], step=2)                # so 2, the oldest last-seen, goes
  np.testing.assert_array_equal(Q.bank_contains(after, [1, 2, 3, 4]), [True, False, True, True])
  partial = Q.bank_add(Q.bank_add(Q.bank_init(4), [1, 2, 3], step=0), [1, 2], step=1)   # refresh, not re-add
  assert int(partial.cursor) == 3 and partial.hashes.tolist() == [3, 1, 2, 0]
  assert partial.steps.tolist() == [0, 1, 1, -1]
  flood = Q.bank_add(after, [10, 11, 12, 13], step=3)       # more than the capacity in one call: the last ones
  np.testing.assert_array_equal(flood.hashes, np.array([11, 12, 13], np.uint64))
  with pytest.raises(ValueError, match="before"):
    Q.bank_add(flood, [5], step=2)


def test_bank_functions_are_pure_and_the_arrays_are_the_whole_state():
  bank = Q.bank_add(Q.bank_init(4), [5, 6], step=0)
  before = arrays(bank)
  Q.bank_add(bank, [7, 8, 9], step=1)
  Q.bank_contains(bank, [5])
  assert_same_bank(bank, before)
  buffer = io.BytesIO()                                     # a serialise/restore round trip, as a checkpoint
  np.savez(buffer, **bank._asdict())
  buffer.seek(0)
  restored = Q.MemoryBank(**dict(np.load(buffer)))
  copied = Q.MemoryBank(*arrays(bank))
  for step, fps in enumerate([[7, 5], [8, 9, 10], [5]], start=1):
    bank, restored, copied = (Q.bank_add(b, fps, step) for b in (bank, restored, copied))
  assert_same_bank(bank, restored)
  assert_same_bank(bank, copied)
  assert bank.hashes.tolist() == [8, 9, 10, 5] and bank.steps.tolist() == [2, 2, 2, 3]


def test_bank_round_trips_through_an_orbax_checkpoint(tmp_path):
  import orbax.checkpoint as ocp
  bank = Q.bank_add(Q.bank_init(5), [2 ** 64 - 1, 3, 9], step=4)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "bank", bank)
  checkpointer.wait_until_finished()
  restored = checkpointer.restore(tmp_path / "bank", bank)
  assert isinstance(restored, Q.MemoryBank)
  assert_same_bank(bank, [np.asarray(x) for x in restored])


def test_bank_decay_and_duplicate_flags():
  bank = Q.bank_add(Q.bank_add(Q.bank_init(8), [1], step=0), [2], step=5)
  np.testing.assert_array_equal(Q.bank_contains(bank, [1, 2], now=6, max_age=3), [False, True])
  with pytest.raises(ValueError, match="both"):
    Q.bank_contains(bank, [1], now=6)
  np.testing.assert_array_equal(Q.duplicate_flags(bank, [3, 1, 3, 4, 4]), [False, True, True, False, True])
  np.testing.assert_array_equal(Q.duplicate_flags(bank, [3, 1, 3], within_batch=False), [False, True, False])


# ---------------------------------------------------------------------------------------------------- rewards

def test_frontier_and_rquest_reward_by_hand():
  np.testing.assert_allclose(Q.frontier(np.array([0.0, 0.25, 0.5, 0.75, 1.0])), [0, 0.5, 1, 0.5, 0])
  valid, agree, dup = np.array([1, 1, 0, 1, 0]), np.array([0.5, 1.0, 0.5, 0.25, 0.5]), np.array([0, 0, 0, 1, 1])
  np.testing.assert_allclose(Q.rquest_reward(valid, agree, dup), [1.0, 0.0, -0.5, 0.0, -0.5])
  np.testing.assert_allclose(Q.rquest_reward(valid.astype(bool), agree, dup.astype(bool), lam_dup=0.3, lam_inv=1.0),
                             [1.0, 0.0, -1.0, 0.2, -1.0])


def test_rquest_reward_jits_on_jax_arrays():
  import jax
  import jax.numpy as jnp
  valid, agree, dup = jnp.array([True, False]), jnp.array([0.75, 0.5]), jnp.array([1.0, 0.0])
  got = jax.jit(functools.partial(Q.rquest_reward, lam_dup=0.5, lam_inv=0.5))(valid, agree, dup)
  np.testing.assert_allclose(np.asarray(got), [0.0, -0.5], atol=1e-6)


def test_solver_agreement_ties_and_none():
  majority, agree = Q.solver_agreement([["3", "3", "4", None], ["4", "3", "3", "4"], [None, None], ["5"],
                                        [None, "2", "1"], []])
  assert majority == ["3", "4", None, "5", "2", None]       # a tie goes to the answer sampled first
  np.testing.assert_allclose(agree, [0.5, 0.5, 0.0, 1.0, 1 / 3, 0.0])


def test_surface_repetition_ranks_a_repeat_above_a_novel_question():
  texts = ["a=3,b=5:a*b+2", "x=7:x*x-9", "a=3,b=5:a*b+2", "a=3,b=5:a*b+3"]
  rep = Q.surface_repetition(texts)
  assert rep[0] == rep[2] > rep[1] == 0.0
  assert rep[3] > 0.0                                        # a one-character edit is a surface repeat
  np.testing.assert_allclose(rep, [2 / 3, 0, 2 / 3, 2 / 3])
  assert Q.surface_repetition(["a=1:a+1"]).tolist() == [0.0]
  # The baseline's blind spot: a renamed, commuted copy is far apart on the surface but the same question.
  assert Q.surface_repetition(["a=3,b=5:a+b", "x=3,y=5:y+x"]).tolist() == [0.0, 0.0]
  assert fp("a=3,b=5:a+b") == fp("x=3,y=5:y+x")
  np.testing.assert_allclose(Q.rzero_reward(np.array([0.5, 1.0]), rep[:2], lam_rep=0.5), [1 - 1 / 3, 0.0])


def test_reject_head_format_and_reward():
  assert [Q.parse_judgment(c) for c in ["V", " I\n", "VALID", "x", ""]] == [True, False, True, None, None]
  assert Q.judge_prompt("a=3:a+1") == "a=3:a+1?" and Q.judge_target(True) == "V" and Q.judge_target(False) == "I"
  np.testing.assert_array_equal(Q.reject_reward([True, False, None, True], [True, True, False, False]),
                                [1.0, 0.0, 0.0, 0.0])
  with pytest.raises(ValueError, match="judgments"):
    Q.reject_reward([True], [True, False])


def test_every_example_character_is_in_the_tokenizer_alphabet():
  texts = [t for t, _ in GOOD] + [t for t, _ in BAD]
  texts += [Q.judge_prompt(t) + Q.judge_target(True) + Q.judge_target(False) for t, _ in GOOD]
  assert set("".join(texts)) <= set(DEFAULT_ALPHABET)


# ----------------------------------------------------------------------------------------------- executor row

def test_analyse_question_in_the_executor_matches_direct_calls(executor):
  texts = [t for t, _ in GOOD] + [t for t, _ in BAD]
  row_fn = functools.partial(C.analyse_question, max_value=1000, max_chars=48)
  out = executor.map(row_fn, [(t,) for t in texts], fallback=C.ANALYSIS_FALLBACK)    # in the spawn worker
  assert not out.failed.any()
  got = C.unpack_analyses(out.values)
  for i, text in enumerate(texts):
    valid, reason, answer = C.check_validity(text, max_value=1000, max_chars=48)
    assert (bool(got["valid"][i]), got["reason"][i], int(got["answer"][i])) == (valid, reason, answer or 0)
    q = C.parse_question(text) if len(text) <= 48 else None
    if q is not None and len(set(q.used) | {n for n, _ in q.bindings}) <= 2:
      assert int(got["instance"][i]) == fp(text, "instance") and int(got["skill"][i]) == fp(text, "skill")
    else:
      assert got["instance"][i] == 0 and got["skill"][i] == 0
