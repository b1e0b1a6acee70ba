"""Process verifiers: the ProcessBench metric, TIPS rewards (outcome-only RL of a step verifier) and the verdict
text an LM verifier writes.

ProcessBench (FOUND: Zheng et al. 2024, https://huggingface.co/papers/2412.06559; official code
github.com/QwenLM/ProcessBench `code/run_eval.py` and `code/run_eval_prm_rlhflow.py` at e802463, and
`code/run_eval_prm_trl.py`, which is only on pull-request commit 05769fa and the one script that prints the
headline average): every sample carries `label` = the 0-based index of the earliest wrong step, or -1 when every
step is correct. A prediction counts only on an exact index match. Per subset

    acc_err = 100 * mean(pred == label | label != -1)      acc_cor = 100 * mean(pred == label | label == -1)
    F1 = 2 * acc_err * acc_cor / (acc_err + acc_cor)        headline F1 = plain mean of the subset F1s.

Degenerate cases. The official scripts take `np.mean` of an empty class, which is NaN (with a RuntimeWarning),
and so is the F1 and the headline mean: we return that NaN explicitly (an F1 cannot be measured without both
classes). With both classes present and no match at all, the official 0/0 is NaN too, by accident of float
division; we define F1 = 0 there (the limit of the harmonic mean: a verifier that matches nothing scores the
worst value, it does not drop out of a mean). The official code keeps an unparsable prediction as None, which
never equals a label; our `MALFORMED` = -2 plays that part.

TIPS (DESIGN, ../shared/methods/llm.md §3; the paper is not available to us): a verifier writes one verdict per
step; the final verdict is *derived*, "incorrect" iff some step is flagged, and the RL reward is
1[final verdict == outcome label], where the outcome label only says whether the solution's final answer is
right. The ProcessBench prediction is the first flagged step (or -1). Verdict text: one character per step,
'+' (step correct) or '-' (step wrong), e.g. "++-+" flags step 2 of 4. A *worked* verdict writes the verifier's
own check before each character: the step undone and the number it must give back, "38+14=52:55-28+10=38:38+"
(for "55-14=38-10=28": step 0 does not check out, step 1 does). Only the verdict characters count, so both
forms grade alike; the worked form lets a small model compute before it judges (the synthetic chains'
`sft_target="checks"`, experiments/tips).

Rewards (registry `REWARDS`; the process match needs the step count, so the example's `answer` is
"<label>/<number of steps>", see `parse_answer`):

  tips_outcome   r = 1[derived verdict == outcome]       (malformed: -format_penalty)   correct = process match
  step_labels    r = 1[predicted_index == label]         (malformed: -format_penalty)   correct = process match

`correct` is the exact ProcessBench match in both, so the logged accuracy is the process accuracy, whatever the
reward pays for.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.executor import VerifierExecutor
from rlkit.rewards.verifier import RewardFn, check_float, register_reward

NO_ERROR = -1     # ProcessBench's label for a solution whose every step is correct
MALFORMED = -2    # the prediction of a verdict that does not parse: never equals a label (>= -1)
STEP_OK, STEP_WRONG = "+", "-"
_WORKED_STEP = r"\d+[+-]\d+=-?\d+:\d+([+-])"     # a worked verdict's check: "38+14=52:55", then the verdict
_WORKED = re.compile(f"(?:{_WORKED_STEP})+")

# ----------------------------------------------------------------------------------------------------------
# ProcessBench metric (host numpy). Everything is computed from four counts per subset, so several processes can
# add their counts before dividing and get a one-process run's numbers.

_COUNT_KEYS = ("num_err", "hits_err", "num_cor", "hits_cor")


def _as_indices(name: str, values) -> np.ndarray:
  values = np.asarray(values)
  if values.ndim != 1 or not (np.issubdtype(values.dtype, np.integer) or values.size == 0) \
      or values.dtype == np.bool_:
    raise ValueError(f"ProcessBench: {name} must be a 1-d array of integer step indices, got {values.dtype} "
                     f"of shape {values.shape}.")
  return values.astype(np.int64)


def _check_pred_label(pred, label) -> tuple[np.ndarray, np.ndarray]:
  pred, label = _as_indices("pred", pred), _as_indices("label", label)
  if pred.shape != label.shape:
    raise ValueError(f"ProcessBench: pred has {pred.size} rows, label has {label.size}.")
  if np.any(label < NO_ERROR):
    raise ValueError(f"ProcessBench: labels must be -1 (no error) or a 0-based step index, got "
                     f"{int(label.min())}.")
  return pred, label


def _metrics_from_counts(num_err: float, hits_err: float, num_cor: float, hits_cor: float) -> dict:
  acc_err = 100.0 * hits_err / num_err if num_err else float("nan")     # official: np.mean([]) = nan
  acc_cor = 100.0 * hits_cor / num_cor if num_cor else float("nan")
  if np.isnan(acc_err) or np.isnan(acc_cor):
    f1 = float("nan")
  elif acc_err + acc_cor == 0:
    f1 = 0.0                                                           # our choice (module docstring)
  else:
    f1 = 2.0 * acc_err * acc_cor / (acc_err + acc_cor)
  return {"acc_err": float(acc_err), "acc_cor": float(acc_cor), "f1": float(f1),
          "num_err": int(num_err), "num_cor": int(num_cor)}


def processbench_f1(pred, label) -> dict:
  """ProcessBench scores of one subset: {acc_err, acc_cor (percent), f1, num_err, num_cor}.

  `pred`, `label`: [N] integer step indices, -1 = "no error" (a prediction may be any integer, e.g. MALFORMED).
  An empty class gives NaN accuracy and F1; no match in either class gives F1 = 0 (module docstring).
  """
  pred, label = _check_pred_label(pred, label)
  match, err = pred == label, label != NO_ERROR
  return _metrics_from_counts(err.sum(), (match & err).sum(), (~err).sum(), (match & ~err).sum())


def _headline(per_subset: Mapping[str, dict]) -> dict:
  metrics: dict = {}
  for subset in sorted(per_subset):
    metrics.update({f"{subset}/{key}": value for key, value in per_subset[subset].items()})
  # Plain mean, as the official script's np.mean: one NaN subset makes the headline NaN.
  metrics["f1"] = float(np.mean([m["f1"] for m in per_subset.values()])) if per_subset else float("nan")
  return metrics


def processbench_metrics(subsets: Sequence[str], pred, label) -> dict:
  """Per subset `<subset>/acc_err`, `/acc_cor`, `/f1`, `/num_err`, `/num_cor`, and `f1` = the plain mean of the
  subset F1s (the ProcessBench headline). `subsets`: [N] the subset name of every row."""
  pred, label = _check_pred_label(pred, label)
  subsets = np.asarray(list(subsets), object)
  if subsets.shape != pred.shape:
    raise ValueError(f"ProcessBench: subsets has {subsets.size} rows, pred has {pred.size}.")
  return _headline({s: processbench_f1(pred[subsets == s], label[subsets == s]) for s in set(subsets.tolist())})


def processbench_counts(subset: str, pred: int, label: int) -> dict[str, float]:
  """One row's contribution to `processbench_from_counts`: add these dicts key by key over rows (and
  processes), then divide once. Keys `<subset>/num_err`, `/hits_err`, `/num_cor`, `/hits_cor`."""
  (pred,), (label,) = _check_pred_label([pred], [label])
  err, hit = float(label != NO_ERROR), float(pred == label)
  return {f"{subset}/num_err": err, f"{subset}/hits_err": err * hit,
          f"{subset}/num_cor": 1.0 - err, f"{subset}/hits_cor": (1.0 - err) * hit}


def processbench_from_counts(totals: Mapping[str, float]) -> dict:
  """The `processbench_metrics` of the rows whose `processbench_counts` sum to `totals` (a missing key is 0)."""
  subsets: dict[str, dict[str, float]] = {}
  for key, value in totals.items():
    subset, _, name = key.rpartition("/")
    if name not in _COUNT_KEYS or not subset:
      raise ValueError(f"processbench_from_counts: unexpected key {key!r}; keys are '<subset>/<count>' with "
                       f"<count> one of {list(_COUNT_KEYS)} (from processbench_counts).")
    subsets.setdefault(subset, {})[name] = float(value)
  return _headline({s: _metrics_from_counts(*(c.get(k, 0.0) for k in _COUNT_KEYS)) for s, c in subsets.items()})


# ----------------------------------------------------------------------------------------------------------
# TIPS on step flags (jnp, jittable). Flags are 1 where a step is judged wrong; padded steps are masked out.


def tips_reward(step_flags, step_mask, outcome_bad) -> jnp.ndarray:
  """[B, G] float32: 1 where the derived final verdict ("some real step flagged") equals `outcome_bad`.

  step_flags: [B, G, S] {0, 1} sampled step verdicts of G verifier samples; step_mask: [B, S] real steps;
  outcome_bad: [B] {0, 1}, the solution's final answer is wrong. DESIGN, ../shared/methods/llm.md §3.
  """
  flagged = (step_flags > 0) & (step_mask > 0)[:, None, :]
  says_bad = flagged.any(axis=-1)
  return (says_bad == (outcome_bad > 0)[:, None]).astype(jnp.float32)


def first_flag(step_flags, step_mask) -> jnp.ndarray:
  """[B, G] int32: the first flagged real step, or -1 where none is (the ProcessBench prediction)."""
  flagged = (step_flags > 0) & (step_mask > 0)[:, None, :]
  return jnp.where(flagged.any(axis=-1), jnp.argmax(flagged, axis=-1), NO_ERROR).astype(jnp.int32)


# ----------------------------------------------------------------------------------------------------------
# Verdict text and the answer string.


def verdict_chars(text: str) -> Optional[str]:
  """The verdict characters of a verdict text, stripped of outer whitespace: "++-+" as it is, a worked verdict
  "38+14=52:55-28+10=38:38+" -> "-+" (module docstring); None for anything else (inner spaces, a check without its
  verdict)."""
  text = text.strip()
  if not text:
    return None
  if set(text) <= {STEP_OK, STEP_WRONG}:
    return text
  return "".join(re.findall(_WORKED_STEP, text)) if _WORKED.fullmatch(text) else None


def parse_verdicts(text: str, n_steps: int) -> Optional[list[int]]:
  """"++-+" (or the worked "8-3=5:5+12-4=8:8+14-1=13:12-11-2=9:9+") -> [0, 0, 1, 0] (1 = step judged wrong, as
  `step_flags`); None unless the text, stripped of outer whitespace, holds exactly `n_steps` verdicts in one of
  the two forms."""
  if n_steps < 1:
    raise ValueError(f"parse_verdicts: n_steps must be >= 1, got {n_steps}.")
  chars = verdict_chars(text)
  if chars is None or len(chars) != n_steps:
    return None
  return [int(c == STEP_WRONG) for c in chars]


def predicted_index(text: str, n_steps: int) -> int:
  """The verdict's ProcessBench prediction: its first '-', -1 for all '+', MALFORMED (-2, never a label) when it
  does not parse."""
  flags = parse_verdicts(text, n_steps)
  if flags is None:
    return MALFORMED
  return flags.index(1) if 1 in flags else NO_ERROR


def format_answer(label: int, n_steps: int) -> str:
  """The example's `answer`: "2/4" (earliest wrong step 2 of 4 steps), "-1/3" (no error in 3 steps). The step
  count is in it because `Task.verify(completion, answer)` must refuse a verdict of the wrong length."""
  return f"{label}/{n_steps}"


def parse_answer(answer: str) -> tuple[int, int]:
  """Inverse of `format_answer`; a malformed answer is a data error (ValueError naming the fix)."""
  label, sep, n_steps = str(answer).partition("/")
  try:
    label, n_steps = int(label), int(n_steps)
  except ValueError:
    label = n_steps = None
  if not sep or label is None or n_steps < 1 or not NO_ERROR <= label < n_steps:
    raise ValueError(f"ProcessBench answer {answer!r} must be '<label>/<number of steps>' with label -1 or a "
                     "0-based step index (e.g. '2/4', '-1/3'); build examples with load_processbench or the "
                     "processbench_chains task.")
  return label, n_steps


# ----------------------------------------------------------------------------------------------------------
# Rewards. The row function runs in the executor's worker, so it is module-level (picklable).


def score_verdict(completion: str, label: int, n_steps: int, outcome_bad: bool) -> tuple[float, float, float]:
  """One row: (well formed, derived verdict == outcome, predicted_index == label), each 0.0 or 1.0."""
  flags = parse_verdicts(completion, n_steps)
  if flags is None:
    return 0.0, 0.0, 0.0
  says_bad = any(flags)
  pred = flags.index(1) if says_bad else NO_ERROR
  return 1.0, float(says_bad == outcome_bad), float(pred == label)


def _verdict_rows(reward: str, batch: RewardBatch, need_outcome: bool) -> list[tuple]:
  """(completion, label, n_steps, outcome_bad) per row; data errors raise here, in the trainer, not as row
  failures in the worker."""
  rows = []
  for i, (completion, answer, fields) in enumerate(zip(batch.completions, batch.answers, batch.fields)):
    label, n_steps = parse_answer(answer)
    outcome_bad = False
    if need_outcome:
      final_ok = fields.get("final_answer_correct")
      if not isinstance(final_ok, (bool, np.bool_)):
        raise ValueError(f"reward {reward!r}: row {i} needs the bool field 'final_answer_correct' (the outcome "
                         f"label), got {final_ok!r}; use examples from load_processbench or the "
                         "processbench_chains task, or add the field to the data.")
      outcome_bad = not bool(final_ok)
    rows.append((completion, label, n_steps, outcome_bad))
  return rows


def _verdict_reward(reward: str, executor: VerifierExecutor, pay_column: int, component: str,
                    format_penalty: float, failure_reward: float) -> RewardFn:
  """Pays column `pay_column` of `score_verdict` (1: outcome, 2: process) on well-formed rows, -format_penalty on
  malformed ones, failure_reward where the row function failed; components `<component>` and `format` sum to it."""
  format_penalty = check_float(reward, "format_penalty", format_penalty)
  failure_reward = check_float(reward, "failure_reward", failure_reward)

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    rows = _verdict_rows(reward, batch, need_outcome=pay_column == 1)
    out = executor.map(score_verdict, rows, fallback=(0.0, 0.0, 0.0))
    ok = ~out.failed
    formed = (out.values[:, 0] > 0.5) & ok
    paid = np.where(out.failed, failure_reward, np.where(formed, out.values[:, pay_column], 0.0))
    penalty = np.where(ok & ~formed, -format_penalty, 0.0)
    return RewardOutput(rewards=paid + penalty, correct=(out.values[:, 2] > 0.5) & formed,
                        components={component: paid, "format": penalty}, failures=out.failures)
  return reward_fn


@register_reward("tips_outcome")
def make_tips_outcome(task, executor: VerifierExecutor, *, format_penalty: float = 0.0,
                      failure_reward: float = 0.0) -> RewardFn:
  """TIPS (DESIGN, ../shared/methods/llm.md §3): 1 where the verdict's derived final verdict (any '-') equals the
  example's outcome (`final_answer_correct` False <=> "incorrect"); -format_penalty for a malformed verdict.
  `correct` is the exact ProcessBench match. `task` is unused: the verdict format is fixed."""
  del task
  return _verdict_reward("tips_outcome", executor, 1, "outcome", format_penalty, failure_reward)


@register_reward("step_labels")
def make_step_labels(task, executor: VerifierExecutor, *, format_penalty: float = 0.0,
                     failure_reward: float = 0.0) -> RewardFn:
  """The exact step label as an RL reward (the supervised upper bound of the TIPS experiment): 1 where
  predicted_index == label; -format_penalty for a malformed verdict. `correct` is that same match."""
  del task
  return _verdict_reward("step_labels", executor, 2, "process", format_penalty, failure_reward)

