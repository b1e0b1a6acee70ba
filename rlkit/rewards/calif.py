"""CALIF: constraint rewards for instruction following that cannot be earned by dropping the task.

DESIGN, ../shared/methods/llm.md §2: the method is our own proposal, not a paper's. A reward for verifiable
constraints alone pays "BLUE" for "12+30= [include BLUE]": satisfying the rules and doing nothing else. CALIF
multiplies satisfaction by anchors that are already at hand, the task's own verifier and the frozen pre-RL
reference policy, so satisfaction never pays for itself (a multiplicative gate, not an additive penalty):

  r_c    = mean_c sat_c over the row's constraints (all_of: min_c sat_c); 1 for a row with no constraints
  a_task = task.verify(completion, answer) in [0, 1]
  a_len  = min(1, content_len / (rho * max(ref_len, 1))); 1 on a row with a length-bounding constraint
  r      = r_c * a_task**alpha * a_len**beta

`content_len` is the number of non-whitespace characters left once every constraint's boilerplate (the
required keyword's occurrences, required markers) is removed, so padding with the keyword earns nothing.
`ref_len` is the content length of the reference policy's answers to the prompt *without* the constraint,
averaged over samples (a single sample is noisy). Only the data builder knows how it worded a constraint, so an
example carries that prompt as its field `base_prompt` ("12+30=" for "12+30= [include BLUE]");
`with_reference_lengths(examples, generate)` samples it and writes the field `ref_len` before training.
`max_words` and `max_chars` legitimately shorten answers, and the length anchor would fight them: rows with
one of those are not length-anchored.

Rewards (registry `REWARDS`, rlkit/rewards/verifier.py), the arms of the spec's experiment:
  constraints             r = r_c                                  (a) the constraint-only baseline
  calif                   r = r_c * a_task**alpha * a_len**beta    (b) CALIF
  constraints_plus_task   r = r_c + task_weight * a_task           the additive control: the same verifier
                                                                   added, not multiplied (GR3's contrast)
Arm (c), constraint + KL to the reference, is `constraints` with the trainer's `rl.kl_beta > 0`: no code here.
`correct` is the task verifier accepting AND every constraint holding (the instruction was followed and the
task done), for all three. Components: `satisfaction` (r_c), `task` (a_task), `length_anchor` (a_len before the
power; 1 where it does not apply or `ref_len` is absent, which only `calif` with beta > 0 refuses) and
`content_length`. A row whose host code raises or hangs gets `failure_reward`, components 0, and is counted.

Constraints are an example's field (`constraints` by default): a list of {"kind": ..., **params}, e.g.
[{"kind": "keyword", "word": "BLUE"}, {"kind": "max_words", "n": 3}]. Kinds (registry `CONSTRAINTS`):
  keyword word | forbidden_word word   whole word, case-insensitive, present / absent
  max_words n | min_words n             whitespace-separated words, at most / at least n
  max_chars n                           characters, at most n
  starts_with marker | ends_with marker | wrapped left right
Surrounding whitespace is ignored by every kind: a detokenizer's leading space is not the model's wording.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from rlkit.core.registry import Registry, closest_first
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.executor import VerifierExecutor
from rlkit.rewards.verifier import RewardFn, check_float, register_reward

REF_LEN_FIELD = "ref_len"
BASE_PROMPT_FIELD = "base_prompt"
DEFAULT_RHO = 0.5

Span = tuple[int, int]


class ConstraintKind(NamedTuple):
  """One constraint family. `params` maps each parameter to its type: str (non-empty) or int (>= 0)."""
  params: dict[str, type]
  check: Callable[..., bool]                     # check(completion, **params) -> satisfied
  boilerplate: Callable[..., list[Span]]         # boilerplate(completion, **params) -> spans that are not content
  bounds_length: bool = False                    # True: the kind shortens answers, so no length anchor


class Constraint(NamedTuple):
  """A validated constraint of one example (see `parse_constraints`); plain data, so it pickles cheaply."""
  kind: str
  params: dict[str, Any]


CONSTRAINTS: Registry[ConstraintKind] = Registry("constraint")


def _no_boilerplate(completion: str, **params) -> list[Span]:
  return []


def _word_pattern(word: str) -> re.Pattern:
  # Lookarounds rather than \b, so a word that starts or ends with punctuation ("C++") is still whole.
  return re.compile(r"(?<!\w)" + re.escape(word) + r"(?!\w)", re.IGNORECASE)


def _keyword_spans(completion: str, word: str) -> list[Span]:
  return [m.span() for m in _word_pattern(word).finditer(completion)]


def _stripped_bounds(completion: str) -> Span:
  """[start, end) of the completion without its surrounding whitespace."""
  start = len(completion) - len(completion.lstrip())
  return start, max(start, len(completion.rstrip()))


def _starts_with(completion: str, marker: str) -> bool:
  return completion.strip().startswith(marker)


def _ends_with(completion: str, marker: str) -> bool:
  return completion.strip().endswith(marker)


def _wrapped(completion: str, left: str, right: str) -> bool:
  text = completion.strip()
  return len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right)


def _prefix_span(completion: str, marker: str) -> list[Span]:
  start, _ = _stripped_bounds(completion)
  return [(start, start + len(marker))] if _starts_with(completion, marker) else []


def _suffix_span(completion: str, marker: str) -> list[Span]:
  _, end = _stripped_bounds(completion)
  return [(end - len(marker), end)] if _ends_with(completion, marker) else []


def _wrapper_spans(completion: str, left: str, right: str) -> list[Span]:
  if not _wrapped(completion, left, right):
    return []
  return _prefix_span(completion, left) + _suffix_span(completion, right)


CONSTRAINTS.add("keyword", ConstraintKind(
    {"word": str}, lambda c, word: bool(_keyword_spans(c, word)), _keyword_spans))
CONSTRAINTS.add("forbidden_word", ConstraintKind(
    {"word": str}, lambda c, word: not _keyword_spans(c, word), _no_boilerplate))
CONSTRAINTS.add("max_words", ConstraintKind(
    {"n": int}, lambda c, n: len(c.split()) <= n, _no_boilerplate, bounds_length=True))
CONSTRAINTS.add("min_words", ConstraintKind({"n": int}, lambda c, n: len(c.split()) >= n, _no_boilerplate))
CONSTRAINTS.add("max_chars", ConstraintKind(
    {"n": int}, lambda c, n: len(c.strip()) <= n, _no_boilerplate, bounds_length=True))
CONSTRAINTS.add("starts_with", ConstraintKind({"marker": str}, _starts_with, _prefix_span))
CONSTRAINTS.add("ends_with", ConstraintKind({"marker": str}, _ends_with, _suffix_span))
CONSTRAINTS.add("wrapped", ConstraintKind({"left": str, "right": str}, _wrapped, _wrapper_spans))


def parse_constraints(items: Any, where: str) -> tuple[Constraint, ...]:
  """Validates an example's constraint list ([{"kind": ..., **params}]); raises a ValueError naming `where`
  (the example), the constraint's index and what is wrong (unknown kind, missing/extra/wrong-typed param)."""
  if not isinstance(items, (list, tuple)):
    raise ValueError(f"{where}: constraints must be a list of {{'kind': ..., **params}}, got "
                     f"{type(items).__name__}.")
  return tuple(_parse_constraint(item, f"{where}: constraint {j} ({item!r})") for j, item in enumerate(items))


def _parse_constraint(item: Any, where: str) -> Constraint:
  if not isinstance(item, Mapping) or not isinstance(item.get("kind"), str):
    raise ValueError(f"{where}: expected a dict with a string 'kind'.")
  kind = item["kind"]
  if kind not in CONSTRAINTS:
    raise ValueError(f"{where}: unknown kind {kind!r}; valid kinds: {', '.join(closest_first(kind, CONSTRAINTS))}.")
  spec = CONSTRAINTS.get(kind).params
  given = {k: v for k, v in item.items() if k != "kind"}
  missing, extra = [k for k in spec if k not in given], sorted(set(given) - set(spec))
  if missing or extra:
    raise ValueError(f"{where}: {kind!r} takes params {list(spec)}" + (f"; missing {missing}" if missing else "")
                     + (f"; unexpected {extra}" if extra else "") + ".")
  params = {}
  for name, param_type in spec.items():
    value = given[name]
    if param_type is int:
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{where}: param {name!r} must be an integer >= 0, got {value!r}.")
      value = int(value)
    elif not isinstance(value, str) or not value:     # an empty word or marker would match every completion
      raise ValueError(f"{where}: param {name!r} must be a non-empty string, got {value!r}.")
    params[name] = value
  return Constraint(kind, params)


def bounds_length(constraints: Sequence[Constraint]) -> bool:
  """True if any constraint legitimately shortens answers (then the length anchor is not applied)."""
  return any(CONSTRAINTS.get(c.kind).bounds_length for c in constraints)


def content_length(completion: str, constraints: Sequence[Constraint]) -> int:
  """Non-whitespace characters of `completion` outside every constraint's boilerplate spans. Spans are found
  on the original text and merged, so removing one constraint's text cannot create or hide another's."""
  is_boilerplate = np.zeros(len(completion), bool)
  for c in constraints:
    for start, end in CONSTRAINTS.get(c.kind).boilerplate(completion, **c.params):
      is_boilerplate[start:end] = True
  return sum(1 for ch, skip in zip(completion, is_boilerplate) if not skip and not ch.isspace())


def calif_reward(sat, valid, task_score, content_len, ref_len, length_anchored, *, rho: float = DEFAULT_RHO,
                 alpha: float = 1.0, beta: float = 1.0, all_of: bool = False) -> dict[str, np.ndarray]:
  """The CALIF reward of N rows (host-side numpy; see the module docstring for the maths).

  :param sat: [N, C] constraint satisfied (0/1), padded where `valid` is False.
  :param valid: [N, C] bool, which of the C slots are real constraints of the row.
  :param task_score: [N] the task verifier's score in [0, 1].
  :param content_len: [N] content length of the completion (`content_length`).
  :param ref_len: [N] the reference policy's content length for the row's example.
  :param length_anchored: [N] bool, False where the length anchor does not apply (a length-bounding constraint).
  :returns: {"reward", "satisfaction" (r_c), "task" (a_task), "length_anchor" (a_len, before the beta power)},
    each [N] float64.
  """
  valid = np.asarray(valid, bool)
  sat = np.asarray(sat, np.float64) * valid
  if sat.ndim != 2 or sat.shape != valid.shape:
    raise ValueError(f"calif_reward: sat and valid must be [N, C] of one shape, got {sat.shape}, {valid.shape}.")
  count = valid.sum(-1)
  if all_of:
    satisfaction = np.where(valid, sat, 1.0).min(-1, initial=1.0)
  else:
    satisfaction = np.where(count > 0, sat.sum(-1) / np.maximum(count, 1), 1.0)
  task = np.asarray(task_score, np.float64)
  scale = rho * np.maximum(np.asarray(ref_len, np.float64), 1.0)
  anchor = np.minimum(1.0, np.asarray(content_len, np.float64) / scale)
  anchor = np.where(np.asarray(length_anchored, bool), anchor, 1.0)
  return {"reward": satisfaction * task ** alpha * anchor ** beta, "satisfaction": satisfaction,
          "task": task, "length_anchor": anchor}


# ----------------------------------------------------------------------------------------------------------
# The frozen reference policy's content length: computed once per example, before training.


def reference_content_lengths(examples: Sequence[Mapping[str, Any]], generate: Callable[[list[str]], list[str]],
                              *, samples: int = 2, field: str = "constraints") -> list[float]:
  """The mean content length of `samples` reference answers to each example's `base_prompt` (the prompt without
  the constraint wording). `generate(prompts) -> completions` is any callable, typically rlkit's sampler around
  the frozen reference model; it is called `samples` times on all the prompts. The constraints' boilerplate is
  removed from the reference answers too, so both sides of the ratio count the same thing."""
  if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
    raise ValueError(f"reference_content_lengths: samples must be an integer >= 1, got {samples!r}.")
  prompts, constraints = [], []
  for i, example in enumerate(examples):
    if not isinstance(example.get(BASE_PROMPT_FIELD), str):
      raise ValueError(f"example {i}: needs a string field {BASE_PROMPT_FIELD!r}, its prompt without the constraint "
                       "wording (the data builder that adds the constraint to the prompt must keep it).")
    if field not in example:
      raise ValueError(f"example {i}: has no field {field!r} (its constraints; [] for none).")
    prompts.append(example[BASE_PROMPT_FIELD])
    constraints.append(parse_constraints(example[field], f"example {i}"))
  totals = np.zeros(len(prompts))
  for s in range(samples):
    completions = list(generate(list(prompts)))
    if len(completions) != len(prompts) or not all(isinstance(c, str) for c in completions):
      raise ValueError(f"reference_content_lengths: generate must return {len(prompts)} strings, one per prompt; "
                       f"sample {s} returned {len(completions)} item(s).")
    totals += [content_length(c, cs) for c, cs in zip(completions, constraints)]
  return (totals / samples).tolist()


def with_reference_lengths(examples: Sequence[Mapping[str, Any]], generate: Callable[[list[str]], list[str]],
                           *, samples: int = 2, field: str = "constraints") -> list[dict]:
  """Copies of `examples`, each with the field `ref_len` from `reference_content_lengths`."""
  lengths = reference_content_lengths(examples, generate, samples=samples, field=field)
  return [{**example, REF_LEN_FIELD: length} for example, length in zip(examples, lengths)]


# ----------------------------------------------------------------------------------------------------------
# Rewards


def score_row(task, completion: str, answer: str, constraints: tuple[Constraint, ...],
              num_slots: int) -> tuple[float, ...]:
  """One row, run in the executor's worker: (task score, content length, sat_1..sat_C, 0-padding to
  `num_slots` constraints so every row of a call has one width)."""
  score = float(task.verify(completion, answer))
  if not 0.0 <= score <= 1.0:     # a multiplicative anchor outside [0, 1] would amplify instead of gate
    raise ValueError(f"task verifier returned {score}, outside [0, 1]")
  flags = [float(CONSTRAINTS.get(c.kind).check(completion, **c.params)) for c in constraints]
  return (score, float(content_length(completion, constraints)), *flags, *[0.0] * (num_slots - len(flags)))


def _row_where(reward: str, batch: RewardBatch, i: int) -> str:
  return f"reward {reward!r}: row {i} (prompt {batch.prompts[i][:60]!r})"


def _reference_lengths(reward: str, batch: RewardBatch, required: bool) -> tuple[np.ndarray, np.ndarray]:
  """([N] ref_len, 0 where absent; [N] bool present). Refuses a missing one when `required`."""
  ref_len, present = np.zeros(len(batch)), np.zeros(len(batch), bool)
  for i, fields in enumerate(batch.fields):
    value = fields.get(REF_LEN_FIELD)
    if value is None:
      if required:
        raise ValueError(f"{_row_where(reward, batch, i)}: no field {REF_LEN_FIELD!r}, the frozen reference "
                         "policy's content length, which the length anchor needs while beta > 0. Add it to the "
                         "examples with rlkit.rewards.calif.with_reference_lengths(examples, generate) (each needs "
                         f"{BASE_PROMPT_FIELD!r}), or set beta=0.")
      continue
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
      raise ValueError(f"{_row_where(reward, batch, i)}: {REF_LEN_FIELD!r} must be a finite number >= 0, got "
                       f"{value!r}.")
    ref_len[i], present[i] = value, True
  return ref_len, present


def reference_lengths_from(model, max_new_tokens: int) -> Callable[[RewardBatch, Sequence], dict]:
  """A cache of the frozen reference model's greedy content lengths by base prompt: fills `ref_len` for rows
  whose example lacks it. Greedy, so a prompt's value does not depend on when it is first seen (a resumed run
  recomputes the same values)."""
  from rlkit.rollout.texts import sample_texts
  cache: dict[str, float] = {}

  def fill(batch: RewardBatch, constraints: Sequence) -> dict[int, float]:
    todo = {}
    for i, fields in enumerate(batch.fields):
      if fields.get(REF_LEN_FIELD) is None:
        base = fields.get(BASE_PROMPT_FIELD)
        if not isinstance(base, str):
          raise ValueError(f"{_row_where('calif', batch, i)}: no string field {BASE_PROMPT_FIELD!r} (the prompt "
                           "without the constraint wording), which the reference model answers for the length "
                           "anchor; the data builder that adds the constraint must keep it.")
        if base not in cache:
          todo.setdefault(base, constraints[i])
    if todo:
      answers = sample_texts(model, list(todo), jax.random.key(0), max_new_tokens=max_new_tokens, greedy=True)
      cache.update({base: float(content_length(a, cs)) for (base, cs), a in zip(todo.items(), answers)})
    return {i: cache[f[BASE_PROMPT_FIELD]] for i, f in enumerate(batch.fields) if f.get(REF_LEN_FIELD) is None}
  return fill


def _make_constraint_reward(reward: str, task, executor: VerifierExecutor, *, field: str, all_of: bool,
                            failure_reward: float, rho: float, alpha: float, beta: float,
                            ref_len_required: bool, reference=None, task_weight: float = 0.0) -> RewardFn:
  """The shared body of the constraint rewards: `calif_reward`'s product, plus `task_weight * a_task` (only the
  additive control sets it, with alpha = beta = 0)."""
  if not isinstance(field, str) or not field:
    raise ValueError(f"reward {reward!r}: field must be a non-empty string, got {field!r}.")
  if not isinstance(all_of, bool):
    raise ValueError(f"reward {reward!r}: all_of must be a bool, got {all_of!r}.")
  failure_reward = check_float(reward, "failure_reward", failure_reward)
  row_fn = functools.partial(score_row, task)    # one object for every call: sent to the worker once

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    constraints = []
    for i, fields in enumerate(batch.fields):
      if field not in fields:     # an error, not "no constraints": a misspelt field would make every r_c 1
        raise ValueError(f"{_row_where(reward, batch, i)}: no field {field!r} (the example's constraint list; "
                         "[] for an example without constraints).")
      constraints.append(parse_constraints(fields[field], _row_where(reward, batch, i)))
    slots = max((len(cs) for cs in constraints), default=0)
    rows = [(c, a, cs, slots) for c, a, cs in zip(batch.completions, batch.answers, constraints)]
    out = executor.map(row_fn, rows, fallback=[0.0] * (2 + slots))
    valid = np.array([[j < len(cs) for j in range(slots)] for cs in constraints], bool).reshape(len(batch), slots)
    ref_len, has_ref = _reference_lengths(reward, batch, ref_len_required and reference is None)
    if reference is not None:
      for i, length in reference(batch, constraints).items():
        ref_len[i], has_ref[i] = length, True
    anchored = has_ref & ~np.array([bounds_length(cs) for cs in constraints], bool)
    parts = calif_reward(out.values[:, 2:], valid, out.values[:, 0], out.values[:, 1], ref_len, anchored,
                         rho=rho, alpha=alpha, beta=beta, all_of=all_of)
    all_satisfied = (np.where(valid, out.values[:, 2:], 1.0) > 0.5).all(-1)
    correct = (out.values[:, 0] > 0.5) & all_satisfied & ~out.failed
    ok = ~out.failed
    components = {name: np.where(ok, parts[name], 0.0) for name in ("satisfaction", "task", "length_anchor")}
    components["content_length"] = np.where(ok, out.values[:, 1], 0.0)
    rewards = np.where(ok, parts["reward"] + task_weight * parts["task"], failure_reward)
    return RewardOutput(rewards=rewards, correct=correct, components=components, failures=out.failures)
  return reward_fn


@register_reward("constraints")
def make_constraints(task, executor: VerifierExecutor, *, field: str = "constraints", all_of: bool = False,
                     failure_reward: float = 0.0) -> RewardFn:
  """r = r_c, the constraint-only baseline (arm (a); with `rl.kl_beta > 0`, arm (c)). It still scores the task
  and, where examples carry `ref_len`, the length anchor at the default rho, so the arms log the same things."""
  return _make_constraint_reward("constraints", task, executor, field=field, all_of=all_of,
                                 failure_reward=failure_reward, rho=DEFAULT_RHO, alpha=0.0, beta=0.0,
                                 ref_len_required=False)


@register_reward("constraints_plus_task")
def make_constraints_plus_task(task, executor: VerifierExecutor, *, field: str = "constraints", all_of: bool = False,
                               task_weight: float = 1.0, failure_reward: float = 0.0) -> RewardFn:
  """r = r_c + task_weight * a_task: the additive control of CALIF's product (the task's verifier added, not
  multiplied), so dropping the task still earns r_c and following the instruction alone still earns a_task.
  Components as `calif`'s (the length anchor is logged where examples carry `ref_len`, never applied)."""
  task_weight = check_float("constraints_plus_task", "task_weight", task_weight)
  if task_weight <= 0:
    raise ValueError(f"reward 'constraints_plus_task': task_weight must be > 0 (0 is the reward 'constraints'), "
                     f"got {task_weight!r}.")
  return _make_constraint_reward("constraints_plus_task", task, executor, field=field, all_of=all_of,
                                 failure_reward=failure_reward, rho=DEFAULT_RHO, alpha=0.0, beta=0.0,
                                 ref_len_required=False, task_weight=task_weight)


@register_reward("calif", role_kwargs=("reference_role",))
def make_calif(task, executor: VerifierExecutor, *, models, field: str = "constraints", rho: float = DEFAULT_RHO,
               alpha: float = 1.0, beta: float = 1.0, all_of: bool = False, failure_reward: float = 0.0,
               reference_role: str = "", reference_max_new_tokens: int = 8) -> RewardFn:
  """r = r_c * a_task**alpha * a_len**beta (arm (b)). While beta > 0 it needs each example's `ref_len`, or
  `reference_role`: the frozen reference model (config.models) whose greedy answer to the example's
  `base_prompt` gives it, computed in the trainer when a prompt is first seen."""
  rho = check_float("calif", "rho", rho)
  if rho <= 0:
    raise ValueError(f"reward 'calif': rho must be > 0, got {rho!r}.")
  alpha, beta = check_float("calif", "alpha", alpha), check_float("calif", "beta", beta)
  for key, value in (("alpha", alpha), ("beta", beta)):
    if value < 0:
      raise ValueError(f"reward 'calif': {key} must be >= 0, got {value!r}.")
  reference = None
  if reference_role:
    if reference_role not in models:
      raise ValueError(f"reward 'calif': reference_role={reference_role!r} is not a model of this run (roles: "
                       f"{', '.join(models) or 'none'}); declare it in config.models (the frozen pre-RL policy).")
    reference = reference_lengths_from(models[reference_role], reference_max_new_tokens)
  return _make_constraint_reward("calif", task, executor, field=field, all_of=all_of, failure_reward=failure_reward,
                                 rho=rho, alpha=alpha, beta=beta, ref_len_required=beta > 0, reference=reference)

