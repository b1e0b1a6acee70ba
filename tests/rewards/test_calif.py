"""CALIF (DESIGN, methods/llm.md §2): each constraint kind, content length without boilerplate, the anchors'
arithmetic, the failure mode of the constraint-only reward that CALIF removes, data validation, and the
registered rewards end to end through the executor's worker."""
import numpy as np
import pytest

from rlkit.data.tasks import Arithmetic
from rlkit.rewards import REWARDS, check_reward_kwargs
from rlkit.rewards import calif
from tests.rewards import _verifiers as V


def parse(*items):
  return calif.parse_constraints(list(items), "test")


def check(completion, kind, **params):
  (constraint,) = parse({"kind": kind, **params})
  return calif.CONSTRAINTS.get(kind).check(completion, **constraint.params)


@pytest.mark.parametrize("completion,kind,params,expected", [
    ("42 BLUE", "keyword", {"word": "BLUE"}, True),
    ("42 blue.", "keyword", {"word": "BLUE"}, True),              # case-insensitive, punctuation is not a letter
    ("42 BLUEBERRY", "keyword", {"word": "BLUE"}, False),          # whole words only
    ("42", "keyword", {"word": "BLUE"}, False),
    ("use C++ here", "keyword", {"word": "C++"}, True),
    ("42", "forbidden_word", {"word": "RED"}, True),
    ("42 REDUCED", "forbidden_word", {"word": "RED"}, True),
    ("42 red", "forbidden_word", {"word": "RED"}, False),
    ("one two  three ", "max_words", {"n": 3}, True),
    ("one two three four", "max_words", {"n": 3}, False),
    ("", "max_words", {"n": 0}, True),
    ("one two three", "min_words", {"n": 3}, True),
    ("one two", "min_words", {"n": 3}, False),
    (" abcde\n", "max_chars", {"n": 5}, True),                      # surrounding whitespace is not counted
    ("abcdef", "max_chars", {"n": 5}, False),
    (" Answer: 42", "starts_with", {"marker": "Answer:"}, True),
    ("The Answer: 42", "starts_with", {"marker": "Answer:"}, False),
    ("42. Done\n", "ends_with", {"marker": "Done"}, True),
    ("Done. 42", "ends_with", {"marker": "Done"}, False),
    ("[42]", "wrapped", {"left": "[", "right": "]"}, True),
    ("[42", "wrapped", {"left": "[", "right": "]"}, False),
    ("42]", "wrapped", {"left": "[", "right": "]"}, False),
    ("*", "wrapped", {"left": "*", "right": "*"}, False),          # one character cannot be both ends
    ("**", "wrapped", {"left": "*", "right": "*"}, True),
])
def test_constraint_kinds(completion, kind, params, expected):
  assert check(completion, kind, **params) is expected


def test_only_length_bounding_kinds_say_so():
  bounding = {name for name in calif.CONSTRAINTS if calif.CONSTRAINTS.get(name).bounds_length}
  assert bounding == {"max_words", "max_chars"}
  assert calif.bounds_length(parse({"kind": "keyword", "word": "x"}, {"kind": "max_chars", "n": 9}))
  assert not calif.bounds_length(parse({"kind": "keyword", "word": "x"}, {"kind": "min_words", "n": 9}))
  assert not calif.bounds_length(())


def test_content_length_removes_boilerplate():
  keyword = parse({"kind": "keyword", "word": "BLUE"})
  assert calif.content_length("BLUE", keyword) == 0
  assert calif.content_length(" BLUE blue BLUE ", keyword) == 0               # padding with the keyword earns 0
  assert calif.content_length("42 BLUE", keyword) == 2
  assert calif.content_length("42 BLUEBERRY", keyword) == 11                    # not the whole word: content
  assert calif.content_length("42 BLUE", ()) == 6                              # non-whitespace characters
  markers = parse({"kind": "wrapped", "left": "<<", "right": ">>"}, {"kind": "starts_with", "marker": "A:"},
                  {"kind": "ends_with", "marker": "!"}, {"kind": "keyword", "word": "BLUE"})
  assert calif.content_length("  <<A: 42 BLUE ! >>", markers) == 5              # "A:", "!" are not at the ends
  assert calif.content_length("A: 42 !", markers) == 2
  assert calif.content_length("", markers) == 0
  # Markers count as content when their constraint does not hold: only a satisfied requirement is boilerplate.
  assert calif.content_length("<<42", parse({"kind": "wrapped", "left": "<<", "right": ">>"})) == 4


@pytest.mark.parametrize("items,match", [
    ([{"kind": "keyword", "word": "x"}, {"kind": "max_word", "n": 3}],
     r"example 4: constraint 1 \(.*\): unknown kind 'max_word'; valid kinds: max_words, .*keyword"),
    ([{"kind": "keyword"}], r"example 4: constraint 0 .*'keyword' takes params \['word'\]; missing \['word'\]"),
    ([{"kind": "wrapped", "left": "[", "right": "]", "side": 1}], r"constraint 0 .*unexpected \['side'\]"),
    ([{"kind": "max_words", "n": "3"}], r"constraint 0 .*param 'n' must be an integer >= 0, got '3'"),
    ([{"kind": "max_words", "n": True}], r"param 'n' must be an integer >= 0, got True"),
    ([{"kind": "max_chars", "n": -1}], r"param 'n' must be an integer >= 0, got -1"),
    ([{"kind": "keyword", "word": ""}], r"param 'word' must be a non-empty string"),
    ([{"word": "x"}], r"constraint 0 .*expected a dict with a string 'kind'"),
    ({"kind": "keyword", "word": "x"}, r"example 4: constraints must be a list"),
])
def test_parse_constraints_refuses_bad_items_naming_example_and_index(items, match):
  with pytest.raises(ValueError, match=match):
    calif.parse_constraints(items, "example 4")


def test_parse_constraints_normalises_integers():
  (c,) = parse({"kind": "max_words", "n": np.int64(3)})
  assert c == calif.Constraint("max_words", {"n": 3}) and type(c.params["n"]) is int


def anchors(sat, valid, task, content, ref, anchored, **kw):
  return calif.calif_reward(np.array(sat), np.array(valid), np.array(task), np.array(content), np.array(ref),
                            np.array(anchored), **kw)


def test_calif_reward_hand_computed():
  # Rows: half the constraints, task right, content 3 of ref 10; all constraints, content 20 (anchor capped);
  # no constraints (r_c = 1); padded slot ignored; length-bounded row (anchor 1 despite content 0).
  out = anchors(sat=[[1, 0], [1, 1], [0, 0], [1, 0], [1, 1]],
                valid=[[1, 1], [1, 1], [0, 0], [1, 0], [1, 1]],
                task=[1.0, 0.5, 1.0, 1.0, 1.0], content=[3, 20, 1, 1, 0], ref=[10, 10, 4, 0, 10],
                anchored=[True, True, True, True, False], rho=0.5)
  np.testing.assert_allclose(out["satisfaction"], [0.5, 1, 1, 1, 1])
  np.testing.assert_allclose(out["length_anchor"], [3 / 5, 1, 1 / 2, 1, 1])     # row 3: ref_len 0 is floored at 1
  np.testing.assert_allclose(out["task"], [1.0, 0.5, 1.0, 1.0, 1.0])
  np.testing.assert_allclose(out["reward"], [0.5 * 0.6, 0.5, 0.5, 1, 1])
  # ref_len 0 is floored at 1: content 1 / (0.25 * 1) caps at 1, content 0 gives 0.
  low = anchors([[1]] * 2, [[1]] * 2, [1.0, 1.0], [1, 0], [0, 0], [True, True], rho=0.25)
  np.testing.assert_allclose(low["length_anchor"], [1.0, 0.0])


def test_calif_reward_rho_alpha_beta_and_all_of():
  args = ([[1, 0, 1]], [[1, 1, 1]], [0.5], [4], [10], [True])
  np.testing.assert_allclose(anchors(*args, rho=1.0)["reward"], [2 / 3 * 0.5 * 0.4])
  np.testing.assert_allclose(anchors(*args, rho=0.8)["length_anchor"], [4 / 8])
  np.testing.assert_allclose(anchors(*args, rho=0.8, beta=0.0)["reward"], [2 / 3 * 0.5])
  np.testing.assert_allclose(anchors(*args, rho=0.8, alpha=0.0, beta=2.0)["reward"], [2 / 3 * 0.25])
  np.testing.assert_allclose(anchors(*args, all_of=True)["satisfaction"], [0.0])
  np.testing.assert_allclose(anchors([[1, 0]], [[1, 0]], [1.0], [9], [1], [True], all_of=True)["reward"], [1.0])
  np.testing.assert_allclose(anchors(np.zeros((1, 0)), np.zeros((1, 0), bool), [1.0], [9], [1], [True],
                                     all_of=True)["satisfaction"], [1.0])


# ----------------------------------------------------------------------------------------------------------
# Registered rewards, through the executor's worker

BLUE = [{"kind": "keyword", "word": "BLUE"}]


def blue_batch(completions, constraints=BLUE, ref_len=8.0, answer="42"):
  fields = [{"constraints": constraints, "base_prompt": "12+30=", **({} if ref_len is None else {"ref_len": ref_len})}
            for _ in completions]
  return V.make_batch(completions, [answer] * len(completions), prompts=["12+30= [include BLUE]"] * len(completions),
                      fields=fields)


def test_calif_end_to_end(executor):
  out = REWARDS.get("calif")(Arithmetic(), executor)(blue_batch(["42 BLUE", "BLUE", "", "41 BLUE", "42 BLUE BLUE 4"]))
  # content 2, 0, 0, 2, 3 against rho * ref_len = 4
  np.testing.assert_allclose(out.components["content_length"], [2, 0, 0, 2, 3])
  np.testing.assert_allclose(out.components["satisfaction"], [1, 1, 0, 1, 1])
  np.testing.assert_allclose(out.components["task"], [1, 0, 0, 0, 1])
  np.testing.assert_allclose(out.components["length_anchor"], [0.5, 0, 0, 0.5, 0.75])
  np.testing.assert_allclose(out.rewards, [0.5, 0, 0, 0, 0.75])
  np.testing.assert_array_equal(out.correct, [True, False, False, False, True])
  assert out.failures == {}
  # Without the task anchor, the length anchor alone still refuses the keyword-only answer.
  no_task = REWARDS.get("calif")(Arithmetic(), executor, alpha=0.0, rho=0.25)
  no_task = no_task(blue_batch(["42 BLUE", "BLUE", "41 BLUE"]))
  np.testing.assert_allclose(no_task.rewards, [1.0, 0.0, 1.0])


def test_constraint_only_reward_pays_the_degenerate_answers_calif_refuses(executor):
  """The failure mode: "BLUE" for [include BLUE] and "" for [max_words 3] satisfy every constraint and do no
  task. The constraint-only reward pays them fully; CALIF pays them nothing (neither is `correct`)."""
  max3 = [{"kind": "max_words", "n": 3}]
  batch = V.make_batch(["BLUE", "", "42"], ["42"] * 3,
                       fields=[{"constraints": BLUE, "ref_len": 8.0}, {"constraints": max3, "ref_len": 8.0},
                               {"constraints": max3, "ref_len": 8.0}])
  baseline = REWARDS.get("constraints")(Arithmetic(), executor)(batch)
  np.testing.assert_allclose(baseline.rewards, [1, 1, 1])
  np.testing.assert_array_equal(baseline.correct, [False, False, True])
  out = REWARDS.get("calif")(Arithmetic(), executor)(batch)
  np.testing.assert_allclose(out.components["satisfaction"], [1, 1, 1])
  np.testing.assert_allclose(out.components["content_length"], [0, 0, 2])
  np.testing.assert_allclose(out.components["task"], [0, 0, 1])
  # max_words bounds length: the short right answer "42" is not penalised by the anchor (2 / 4 would be 0.5).
  np.testing.assert_allclose(out.components["length_anchor"], [0, 1, 1])
  np.testing.assert_allclose(out.rewards, [0, 0, 1])
  np.testing.assert_array_equal(out.correct, [False, False, True])
  for name in ("satisfaction", "task", "length_anchor", "content_length"):
    np.testing.assert_allclose(baseline.components[name], out.components[name])


def test_the_additive_control_adds_the_verifier_where_calif_multiplies(executor):
  """r = r_c + a_task: "BLUE" (instruction only) and "42" (task only) each earn 1, "42 BLUE" 2, "41" 0; CALIF pays
  only "42 BLUE". Components and `correct` are those of the other constraint rewards."""
  batch = blue_batch(["42 BLUE", "BLUE", "42", "41", "41 BLUE"])
  out = REWARDS.get("constraints_plus_task")(Arithmetic(), executor)(batch)
  np.testing.assert_allclose(out.rewards, [2, 1, 1, 0, 1])
  np.testing.assert_array_equal(out.correct, [True, False, False, False, False])
  calif_out = REWARDS.get("calif")(Arithmetic(), executor, beta=0.0)(batch)
  np.testing.assert_allclose(calif_out.rewards, [1, 0, 0, 0, 0])
  for name in ("satisfaction", "task", "content_length"):
    np.testing.assert_allclose(out.components[name], calif_out.components[name])
  half = REWARDS.get("constraints_plus_task")(Arithmetic(), executor, task_weight=0.5)(batch)
  np.testing.assert_allclose(half.rewards, [1.5, 1, 0.5, 0, 1])
  failing = V.make_batch(["5", "zero"], ["5"] * 2, fields=[{"constraints": []}] * 2)
  out = REWARDS.get("constraints_plus_task")(V.MisbehavingTask(), executor, failure_reward=-1.0)(failing)
  np.testing.assert_allclose(out.rewards, [2, -1])       # no constraints: r_c = 1, and the task's 1
  assert out.failures == {"ZeroDivisionError": 1}


def test_rows_without_constraints_and_all_of(executor):
  batch = V.make_batch(["42", "42 BLUE"], ["42"] * 2,
                       fields=[{"constraints": [], "ref_len": 2.0},
                               {"constraints": BLUE + [{"kind": "ends_with", "marker": "!"}], "ref_len": 2.0}])
  mean = REWARDS.get("calif")(Arithmetic(), executor)(batch)
  np.testing.assert_allclose(mean.rewards, [1.0, 0.5])
  np.testing.assert_array_equal(mean.correct, [True, False])
  all_of = REWARDS.get("constraints")(Arithmetic(), executor, all_of=True)(batch)
  np.testing.assert_allclose(all_of.rewards, [1.0, 0.0])


def test_failing_rows_get_the_failure_reward_and_are_counted(executor):
  """The task's own code raises on one row and hangs on another."""
  fields = [{"constraints": [{"kind": "max_words", "n": 3}], "ref_len": 1.0}] * 3
  batch = V.make_batch(["5", "zero", "spin"], ["5"] * 3, fields=fields)
  for name in ("constraints", "calif"):
    out = REWARDS.get(name)(V.MisbehavingTask(), executor, failure_reward=-1.0)(batch)
    assert out.failures == {"ZeroDivisionError": 1, "timeout": 1}
    np.testing.assert_allclose(out.rewards, [1, -1, -1])
    np.testing.assert_array_equal(out.correct, [True, False, False])
    for value in out.components.values():
      np.testing.assert_allclose(value[1:], [0, 0])


def test_calif_refuses_missing_ref_len_unless_beta_is_zero(executor):
  batch = blue_batch(["42 BLUE"], ref_len=None)
  with pytest.raises(ValueError, match=r"reward 'calif': row 0 \(prompt '12\+30= \[include BLUE\]'\): no field "
                                       r"'ref_len'.*with_reference_lengths\(examples, generate\).*or set beta=0"):
    REWARDS.get("calif")(Arithmetic(), executor)(batch)
  out = REWARDS.get("calif")(Arithmetic(), executor, beta=0.0)(batch)
  np.testing.assert_allclose(out.rewards, [1.0])
  np.testing.assert_allclose(out.components["length_anchor"], [1.0])      # not computed without ref_len
  np.testing.assert_allclose(REWARDS.get("constraints")(Arithmetic(), executor)(batch).rewards, [1.0])
  with pytest.raises(ValueError, match=r"row 0 .*'ref_len' must be a finite number >= 0, got -1"):
    REWARDS.get("calif")(Arithmetic(), executor)(blue_batch(["42 BLUE"], ref_len=-1))


def test_rewards_refuse_bad_constraint_data_naming_the_row(executor):
  batch = V.make_batch(["42", "42"], ["42"] * 2, fields=[{"constraints": []}, {"constraints": [{"kind": "colour"}]}])
  with pytest.raises(ValueError, match=r"reward 'constraints': row 1 \(prompt 'p1'\): constraint 0 .*unknown kind "
                                       r"'colour'"):
    REWARDS.get("constraints")(Arithmetic(), executor)(batch)
  with pytest.raises(ValueError, match=r"reward 'constraints': row 0 .*no field 'rules'"):
    REWARDS.get("constraints")(Arithmetic(), executor, field="rules")(batch)


@pytest.mark.parametrize("name,kwargs,match", [
    ("calif", {"rho": 0.0}, "reward 'calif': rho must be > 0"),
    ("calif", {"beta": -1.0}, "reward 'calif': beta must be >= 0"),
    ("calif", {"alpha": "1"}, "reward 'calif': alpha must be a finite number"),
    ("calif", {"field": ""}, "reward 'calif': field must be a non-empty string"),
    ("constraints", {"all_of": 1}, "reward 'constraints': all_of must be a bool"),
    ("constraints", {"failure_reward": float("nan")}, "reward 'constraints': failure_reward must be a finite"),
    ("constraints", {"rho": 0.5}, r"reward 'constraints': unknown keyword\(s\) \['rho'\]"),
    ("constraints_plus_task", {"task_weight": 0.0}, r"reward 'constraints_plus_task': task_weight must be > 0"),
    ("constraints_plus_task", {"beta": 1.0}, r"reward 'constraints_plus_task': unknown keyword\(s\) \['beta'\]"),
])
def test_kwargs_are_validated(executor, name, kwargs, match):
  with pytest.raises(ValueError, match=match):
    REWARDS.get(name)(Arithmetic(), executor, **kwargs)


def test_registered_keywords():
  assert REWARDS.get("constraints").keywords == ("field", "all_of", "failure_reward")
  assert REWARDS.get("constraints_plus_task").keywords == ("field", "all_of", "task_weight", "failure_reward")
  assert REWARDS.get("calif").keywords == ("field", "rho", "alpha", "beta", "all_of", "failure_reward",
                                           "reference_role", "reference_max_new_tokens")
  check_reward_kwargs("calif", {"rho": 0.3, "beta": 0.0})


# ----------------------------------------------------------------------------------------------------------
# The reference policy's anchor


def test_with_reference_lengths_averages_samples_of_the_stripped_prompt():
  calls = []

  def generate(prompts):
    """Deterministic fake reference: a call-dependent number of x's per prompt, plus the keyword (boilerplate)."""
    calls.append(list(prompts))
    return [f"{'x' * (len(p) + len(calls))} BLUE" for p in prompts]

  examples = [{"prompt": "12+30= [include BLUE]", "answer": "42", "base_prompt": "12+30=", "constraints": BLUE},
              {"prompt": "1+2= [max 3 words]", "answer": "3", "base_prompt": "1+2=", "constraints": []}]
  out = calif.with_reference_lengths(examples, generate, samples=3)
  assert calls == [["12+30=", "1+2="]] * 3
  # example 0: 6 + (1, 2, 3) x's, BLUE removed -> 8; example 1: 4 + (1, 2, 3) x's plus "BLUE" (4) -> 10
  assert [ex["ref_len"] for ex in out] == [8.0, 10.0]
  assert out[0]["prompt"] == examples[0]["prompt"] and "ref_len" not in examples[0]      # copies
  assert calif.reference_content_lengths(examples, lambda ps: ["7" * 5] * len(ps)) == [5.0, 5.0]


def test_reference_lengths_refuse_bad_input():
  with pytest.raises(ValueError, match=r"example 0: needs a string field 'base_prompt'"):
    calif.reference_content_lengths([{"prompt": "1+2=", "constraints": []}], lambda ps: ps)
  with pytest.raises(ValueError, match=r"example 0: constraint 0 .*unknown kind"):
    calif.reference_content_lengths([{"base_prompt": "1+2=", "constraints": [{"kind": "x"}]}], lambda ps: ps)
  with pytest.raises(ValueError, match="generate must return 1 strings, one per prompt; sample 0 returned 0"):
    calif.reference_content_lengths([{"base_prompt": "1+2=", "constraints": []}], lambda ps: [])
  with pytest.raises(ValueError, match="samples must be an integer >= 1"):
    calif.reference_content_lengths([], lambda ps: ps, samples=0)


def test_the_reference_role_gives_ref_len_from_its_greedy_answers(executor):
  """With `reference_role`, rows without `ref_len` get the reference model's greedy content length on their
  base prompt (computed once per prompt), and the reward is CALIF's with those lengths."""
  import jax
  from rlkit.models.tokenizer import CharTokenizer
  from rlkit.models.transformer import Transformer, TransformerConfig, init_params
  from rlkit.rollout.texts import sample_texts
  from rlkit.train.models import Model
  tok = CharTokenizer()
  cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True, rope_theta=10_000.0)
  reference = Model(Transformer(cfg), init_params(cfg, jax.random.key(0)), tok, False)
  constraints = [{"kind": "keyword", "word": "BLUE"}]
  fields = [{"constraints": constraints, "base_prompt": p} for p in ("12+30=", "1+1=", "12+30=")]
  batch = V.make_batch(["42 BLUE", "2 BLUE", "42"], ["42", "2", "42"], fields=fields)
  out = REWARDS.get("calif")(Arithmetic(), executor, models={"reference": reference}, reference_role="reference",
                             reference_max_new_tokens=4)(batch)
  greedy = sample_texts(reference, ["12+30=", "1+1="], jax.random.key(0), max_new_tokens=4, greedy=True)
  parsed = calif.parse_constraints(constraints, "test")
  ref = [calif.content_length(greedy[0], parsed), calif.content_length(greedy[1], parsed)]
  ref_len = np.array([ref[0], ref[1], ref[0]], float)
  want = calif.calif_reward(np.array([[1.0], [1.0], [0.0]]), np.ones((3, 1), bool), np.ones(3),
                            np.array([2.0, 1.0, 2.0]), ref_len, np.ones(3, bool))
  np.testing.assert_allclose(out.rewards, want["reward"])
  assert ref[1] > 2 and out.components["length_anchor"][1] < 1      # the reference's length is used
  with pytest.raises(ValueError, match="reference_role='ref' is not a model of this run"):
    REWARDS.get("calif")(Arithmetic(), executor, models={}, reference_role="ref")
