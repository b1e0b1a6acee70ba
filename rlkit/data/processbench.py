"""ProcessBench data: the official files, a synthetic running-sum analogue, and its task `processbench_chains`.

ProcessBench (FOUND: https://huggingface.co/papers/2412.06559, data `Qwen/ProcessBench` on the HF hub): one file per
subset (gsm8k, math, olympiadbench, omnimath), rows {"id", "generator", "problem", "steps": [str],
"final_answer_correct": bool, "label": int}, `label` = 0-based index of the earliest wrong step, -1 if none.
`load_processbench` turns them into rlkit examples: the problem and its numbered steps as the prompt, answer
"<label>/<number of steps>" (rlkit.rewards.prm.format_answer; the verifier needs the count to refuse a verdict of
the wrong length), and every official field kept as an extra field. A verifier answers with one verdict character
per step, '+' correct or '-' wrong, each optionally after its worked check (rlkit.rewards.prm).

Synthetic chains (DESIGN, ../shared/methods/llm.md §3, the tiny TIPS experiment): a start number, then steps that
each add an operand to the previous written result. Prompt "5+3=8+4=12+2=14>", steps ["5+3=8", "8+4=12", "12+2=14"].
A step is wrong when its own sum is wrong (a + b != c for the a it was given), so one injected error makes exactly
one step wrong and carries into the final answer. A *trap* adds a second error at a later step that cancels the
first: the final answer is right, the process is not (label = the first error, final_answer_correct True). These
are the cases an outcome-only reward teaches a verifier to accept. Four subsets of rising difficulty:

  subset  steps  operands      subset  steps  operands
  len3    3-4    1-9           len5    5-6    1-49
  len4    4-5    1-19          len7    7-8    1-99      (every prompt stays under 64 characters)

With `op="-"` the chains are running differences instead, "40-3=37-4=33>": the start is the operands' sum
plus a number drawn as the start of a `+` chain, so every true result stays positive (the experiments' chains
whose step labels the pretrained base never saw: experiments/tips). The default `+` chains draw exactly what
they drew before the option existed.

Prompts and verdicts use only characters of the char tokenizer's DEFAULT_ALPHABET. Real ProcessBench text does
not (it needs an HF tokenizer), which `load_processbench` allows.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np

from rlkit.data.jsonl import JsonlTask
from rlkit.data.tasks import TASKS
from rlkit.rewards.prm import (NO_ERROR, STEP_OK, STEP_WRONG, format_answer, parse_answer, predicted_index,
                              processbench_counts, processbench_from_counts, verdict_chars)

OFFICIAL_SUBSETS = ("gsm8k", "math", "olympiadbench", "omnimath")
PROMPT_TEMPLATE = "{problem}\n\n{steps}\n\nVerdict, one character per step (+ correct, - wrong):\n"
STEP_TEMPLATE = "Step {index}: {step}"     # 0-based, as ProcessBench labels (the official prompt's <paragraph_0>)
MAX_REPORTED_ROWS = 20                     # an error lists the first ones in full and counts the rest

# ----------------------------------------------------------------------------------------------------------
# Official files


def processbench_prompt(problem: str, steps: list[str]) -> str:
  steps_text = "\n".join(STEP_TEMPLATE.format(index=i, step=step) for i, step in enumerate(steps))
  return PROMPT_TEMPLATE.format(problem=problem, steps=steps_text)


def _row_problems(row: Any) -> list[tuple[str, str]]:
  """(field, what is wrong and how to fix it) for every problem of one official row."""
  if not isinstance(row, dict):
    return [("<row>", f"expected a JSON object, got {type(row).__name__}")]
  problems = []
  if not isinstance(row.get("problem"), str):
    problems.append(("problem", f"must be the problem text (a string), got {row.get('problem')!r:.60}"))
  steps = row.get("steps")
  steps_ok = isinstance(steps, list) and steps and all(isinstance(s, str) for s in steps)
  if not steps_ok:
    problems.append(("steps", f"must be a non-empty list of strings (one per solution step), got {steps!r:.60}"))
  if not isinstance(row.get("final_answer_correct"), bool):
    problems.append(("final_answer_correct", "must be true or false (does the final answer match the "
                     f"reference), got {row.get('final_answer_correct')!r}"))
  label = row.get("label")
  if isinstance(label, bool) or not isinstance(label, int):
    problems.append(("label", f"must be an integer (-1 or a 0-based step index), got {label!r}"))
  elif steps_ok and not NO_ERROR <= label < len(steps):
    problems.append(("label", f"must be -1 (no error) or a 0-based index of the earliest wrong step in "
                     f"[0, {len(steps) - 1}], got {label}; 1-based labels must be lowered by one"))
  return problems


def _read_rows(path: str) -> list[tuple[str, Any]]:
  """(where, row) for every row of a JSON list or a JSON Lines file, told apart by the first character (HF
  `Dataset.to_json` writes JSON Lines whatever the file is called)."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  if text.lstrip().startswith("["):
    try:
      rows = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"load_processbench: {path} is not valid JSON ({e.msg} at line {e.lineno}, column "
                       f"{e.colno}).") from None
    return [(f"row {i}", row) for i, row in enumerate(rows)]
  rows = []
  for line_no, line in enumerate(text.splitlines(), 1):
    if line.strip():
      try:
        rows.append((f"row {len(rows)} (line {line_no})", json.loads(line)))
      except json.JSONDecodeError as e:
        raise ValueError(f"load_processbench: {path} line {line_no} is not valid JSON ({e.msg} at column "
                         f"{e.colno}); a file holds one JSON list of rows or one JSON object per line.") from None
  return rows


def _subset_files(path: str) -> list[tuple[str, str]]:
  """(subset, file) pairs: every <subset>.json / <subset>.jsonl of a folder, or the one file `path`."""
  if os.path.isfile(path):
    return [(os.path.splitext(os.path.basename(path))[0], path)]
  if not os.path.isdir(path):
    raise FileNotFoundError(f"load_processbench: {path!r} is neither a file nor a folder.")
  files = sorted(name for name in os.listdir(path) if name.endswith((".json", ".jsonl")))
  stems = [os.path.splitext(name)[0] for name in files]
  twice = sorted({s for s in stems if stems.count(s) > 1})
  if twice:
    raise ValueError(f"load_processbench: {path} holds both a .json and a .jsonl file for subset(s) {twice}; "
                     "keep one per subset.")
  if not files:
    raise ValueError(f"load_processbench: no <subset>.json or <subset>.jsonl file in {path}; expected the "
                     f"Qwen/ProcessBench subsets {list(OFFICIAL_SUBSETS)}, e.g. written with "
                     "datasets.load_dataset('Qwen/ProcessBench', split='gsm8k').to_json('gsm8k.jsonl').")
  return [(stem, os.path.join(path, name)) for stem, name in zip(stems, files)]


def load_processbench(path: str) -> list[dict]:
  """Examples {"prompt", "answer", "subset", "problem", "steps", "final_answer_correct", "label", "id",
  "generator"} from a folder of official <subset>.json(l) files or from one such file (subset = file stem).

  Every invalid row of every file is reported in one ValueError, naming the file, the row and the field.
  """
  examples, problems = [], []
  for subset, file in _subset_files(path):
    rows = _read_rows(file)
    if not rows:
      problems.append(f"{file}: no rows")
    for i, (where, row) in enumerate(rows):
      bad = _row_problems(row)
      problems += [f"{file}: {where}: field {field!r} {message}" for field, message in bad]
      if bad:
        continue
      steps = list(row["steps"])
      examples.append({
          "prompt": processbench_prompt(row["problem"], steps), "answer": format_answer(row["label"], len(steps)),
          "subset": subset, "problem": row["problem"], "steps": steps,
          "final_answer_correct": row["final_answer_correct"], "label": row["label"],
          "id": row.get("id", f"{subset}-{i}"), "generator": row.get("generator")})
  if problems:
    shown = problems[:MAX_REPORTED_ROWS]
    more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    raise ValueError(f"load_processbench: {len(problems)} problem(s) in {path}:\n  " + "\n  ".join(shown) + more
                     + "\nRows follow the Qwen/ProcessBench layout: {\"id\", \"generator\", \"problem\", "
                     "\"steps\": [str], \"final_answer_correct\": bool, \"label\": int}.")
  return examples


# ----------------------------------------------------------------------------------------------------------
# Synthetic running-sum chains


class Difficulty(NamedTuple):
  min_steps: int
  max_steps: int
  max_operand: int     # the start and every operand are uniform in [1, max_operand]


SUBSETS = {"len3": Difficulty(3, 4, 9), "len4": Difficulty(4, 5, 19), "len5": Difficulty(5, 6, 49),
           "len7": Difficulty(7, 8, 99)}
_STEP = re.compile(r"^(\d+)([+-])(\d+)=(\d+)$")
CHAIN_OPS = ("+", "-")      # running sums, running differences
SFT_TARGETS = ("steps", "checks", "format")     # ProcessBenchChains.demonstration


def make_chain(rng: np.random.Generator, subset: str, erroneous: bool, trap: bool, max_error: int,
               op: str = "+") -> dict:
  """One chain of `subset` with operator `op`: correct, with one injected error, or (trap) with a second,
  cancelling one."""
  difficulty = SUBSETS[subset]
  n_steps = int(rng.integers(difficulty.min_steps, difficulty.max_steps + 1))
  start = int(rng.integers(1, difficulty.max_operand + 1))
  operands = [int(b) for b in rng.integers(1, difficulty.max_operand + 1, size=n_steps)]
  sign = 1
  if op == "-":               # the same draws, so "+" chains are what they were; results stay >= 1
    start, sign = start + sum(operands), -1
  true_results = np.cumsum([start] + [sign * b for b in operands])[1:].tolist()
  offsets = [0] * n_steps             # written result - true result, per step
  first_error = NO_ERROR
  if erroneous:
    # A trap needs a later step to cancel the error on; the error may be negative only if results stay >= 0.
    first_error = int(rng.integers(0, n_steps - 1 if trap else n_steps))
    delta = int(rng.integers(1, max_error + 1))
    # Every written result stays >= 0: the smallest true result from the error on (a running sum's: the first).
    if rng.random() < 0.5 and min(true_results[first_error:]) - delta >= 0:
      delta = -delta
    fix = int(rng.integers(first_error + 1, n_steps)) if trap else n_steps
    offsets = [delta if first_error <= i < fix else 0 for i in range(n_steps)]
  written = [r + o for r, o in zip(true_results, offsets)]
  steps = [f"{a}{op}{b}={c}" for a, b, c in zip([start] + written[:-1], operands, written)]
  return {"prompt": str(start) + "".join(s[s.index(op):] for s in steps) + ">",     # a, b, c are >= 0
          "answer": format_answer(first_error, n_steps), "subset": subset, "steps": steps,
          "final_answer_correct": written[-1] == true_results[-1], "label": first_error,
          "trap": bool(erroneous and trap)}


def step_checks(steps: list[str]) -> list[tuple[str, str]]:
  """(the step's check, its verdict) per step of a chain: "a-b=c" -> ("c+b=<c+b>:a", '+' iff c + b = a), "a+b=c"
  -> ("c-b=<c-b>:a", '+' iff c - b = a): the step undone, then the number it must give back. Undone, the value
  cannot be copied from the chain's own text; beside it, a is compared with it where both are written."""
  checks = []
  for step in steps:
    m = _STEP.match(step)
    if m is None:
      raise ValueError(f"step_checks: {step!r} is not a running-sum step 'a+b=c' (or 'a-b=c'); only synthetic "
                       "chains (synthetic_processbench, processbench_chains) have per-step labels.")
    a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
    inverse, undone = ("-", c - b) if op == "+" else ("+", c + b)
    checks.append((f"{c}{inverse}{b}={undone}:{a}", STEP_OK if undone == a else STEP_WRONG))
  return checks


def step_verdicts(steps: list[str]) -> str:
  """The true verdict of a chain: each step's own correctness, '+' where a + b = c (a - b = c), else '-'."""
  return "".join(verdict for _, verdict in step_checks(steps))


def worked_verdicts(steps: list[str]) -> str:
  """The true worked verdict (rlkit.rewards.prm): each step's check, then its verdict, "40-3=37-4=34>" ->
  "37+3=40:40+34+4=38:37-"."""
  return "".join(check + verdict for check, verdict in step_checks(steps))


def synthetic_processbench(seed: int, per_subset: int, *, error_frac: float = 0.5, trap_frac: float = 0.2,
                           max_error: int = 9) -> list[dict]:
  """A fixed evaluation set: `per_subset` chains of each subset, exactly round(per_subset * error_frac) of them
  erroneous and round(that * trap_frac) of those traps, in a seeded order. Deterministic given the arguments."""
  _check_fracs("synthetic_processbench", error_frac, trap_frac, max_error)
  rng = np.random.default_rng(seed)
  n_err = int(round(per_subset * error_frac))
  n_trap = int(round(n_err * trap_frac))
  kinds = [(True, True)] * n_trap + [(True, False)] * (n_err - n_trap) + [(False, False)] * (per_subset - n_err)
  examples = []
  for subset in SUBSETS:
    for i, k in enumerate(rng.permutation(len(kinds))):
      example = make_chain(rng, subset, *kinds[k], max_error)
      examples.append({**example, "id": f"{subset}-{i}"})
  return examples


def final_answer_baseline(example: Mapping[str, Any]) -> str:
  """The lower bound of the TIPS experiment: a final-answer checker, which flags the last step iff the final
  answer is wrong. It cannot localise an error, and it accepts traps."""
  n_steps = len(example["steps"])
  return STEP_OK * n_steps if example["final_answer_correct"] else STEP_OK * (n_steps - 1) + STEP_WRONG


def _check_fracs(where: str, error_frac, trap_frac, max_error) -> None:
  for key, value in (("error_frac", error_frac), ("trap_frac", trap_frac)):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
      raise ValueError(f"{where}: {key} must be a number in [0, 1], got {value!r}.")
  if isinstance(max_error, bool) or not isinstance(max_error, (int, np.integer)) or max_error < 1:
    raise ValueError(f"{where}: max_error must be an integer >= 1, got {max_error!r}.")


class VerdictGrading:
  """What both ProcessBench tasks grade and report: the verdict string against the label (the exact ProcessBench
  match), the subset as the category, and ProcessBench's F1 over subsets as eval metrics (`eval/processbench/f1`,
  the mean over the subsets present, and per subset `eval/processbench/<subset>/f1`, `/acc_err`, `/acc_cor`,
  rlkit/train/evaluate.py's hook). The subset is each example's `subset` field."""

  def extract_answer(self, completion_text: str) -> Optional[str]:
    """The verdict characters ("37+3=40:40+34+4=38:37-" -> "+-"); None unless the text is a verdict of either form
    (rlkit.rewards.prm.verdict_chars; the step count is checked by `verify`, which knows it)."""
    return verdict_chars(completion_text)

  def verify(self, completion_text: str, answer: str) -> float:
    label, n_steps = parse_answer(answer)
    return float(predicted_index(completion_text, n_steps) == label)

  def demonstration(self, example: Mapping[str, Any]) -> str:
    """The label as a verdict: '+' before the earliest wrong step, '-' on it and '+' after it (ProcessBench
    labels say nothing about later steps)."""
    label, n_steps = parse_answer(example["answer"])
    return STEP_OK * n_steps if label == NO_ERROR else STEP_OK * label + STEP_WRONG + STEP_OK * (n_steps - label - 1)

  def category(self, example: Mapping[str, Any]) -> str:
    """The subset; `example` is a row (extra fields at the top) or a decoded record (in `fields`)."""
    return str((example.get("fields") or example)["subset"])

  def eval_counts(self, example: Mapping[str, Any], completion_text: str) -> dict[str, float]:
    """ProcessBench counts of every row (`processbench/`); where the example says whether it is a trap (the
    synthetic chains), also the non-trap rows' (`processbench_nontrap/`) and the traps' matches."""
    fields = example.get("fields") or example
    label, n_steps = parse_answer(example["answer"])
    pred = predicted_index(completion_text, n_steps)
    counts = processbench_counts(self.category(example), pred, label)
    out = {f"processbench/{k}": v for k, v in counts.items()}
    if "trap" in fields:
      if fields["trap"]:
        out.update({"processbench_traps/num": 1.0, "processbench_traps/hits": float(pred == label)})
      else:
        out.update({f"processbench_nontrap/{k}": v for k, v in counts.items()})
    return out

  def eval_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
    """F1 (the mean over subsets), per subset F1, acc_err and acc_cor, of all rows and of the non-trap rows;
    the share of traps whose earliest error is found (`processbench_traps/accuracy`)."""
    groups: dict[str, dict[str, float]] = {}
    for key, value in totals.items():
      prefix, _, rest = key.partition("/")
      groups.setdefault(prefix, {})[rest] = value
    metrics = {}
    for prefix in ("processbench", "processbench_nontrap"):
      if prefix in groups:
        metrics.update({f"{prefix}/{k}": v for k, v in processbench_from_counts(groups[prefix]).items()
                        if not k.endswith(("/num_err", "/num_cor"))})
    traps = groups.get("processbench_traps")
    if traps:
      metrics["processbench_traps/accuracy"] = traps["hits"] / traps["num"] if traps["num"] else float("nan")
    return metrics


@TASKS.register("processbench_chains")
@dataclasses.dataclass(frozen=True)
class ProcessBenchChains(VerdictGrading):
  """Find the earliest wrong step of a running-sum chain (module docstring): prompt "5+3=8+4=13+2=15>", target
  "+-+" (8+4 != 13). Graded by the exact ProcessBench match: the first '-' must be the label (-1: all '+').

  Each example draws its subset uniformly from `subsets`, is erroneous with probability `error_frac`, and an
  erroneous one is a trap with probability `trap_frac`; injected errors are 1..max_error off. `op="-"`: running
  differences, "40-3=37-4=33>" (module docstring).
  """
  subsets: tuple = tuple(SUBSETS)
  error_frac: float = 0.5
  trap_frac: float = 0.2
  max_error: int = 9
  sft_target: str = "steps"        # the demonstration: "steps" (verdicts) | "checks" (worked) | "format" (all '+')
  op: str = "+"                    # the chain's operator: "+" (running sums) | "-" (running differences)
  name: str = dataclasses.field(default="processbench_chains", init=False)
  # final_answer_correct: the tips_outcome reward; steps: the demonstration; subset: category; label: the metric.
  required_fields: tuple = dataclasses.field(default=("final_answer_correct", "label", "steps", "subset"),
                                             init=False)

  def __post_init__(self):
    subsets = tuple(self.subsets) if isinstance(self.subsets, (tuple, list)) else None
    if not subsets or any(s not in SUBSETS for s in subsets):
      raise ValueError(f"task {self.name!r}: subsets must be a non-empty list of {list(SUBSETS)}, got "
                       f"{self.subsets!r}.")
    object.__setattr__(self, "subsets", subsets)
    _check_fracs(f"task {self.name!r}", self.error_frac, self.trap_frac, self.max_error)
    if self.op not in CHAIN_OPS:
      raise ValueError(f"task {self.name!r}: op must be one of {list(CHAIN_OPS)} (running sums or differences), "
                       f"got {self.op!r}.")
    if self.sft_target not in SFT_TARGETS:
      raise ValueError(f"task {self.name!r}: sft_target must be one of {list(SFT_TARGETS)} ('steps': the step "
                       "labels; 'checks': each step's check, then its label; 'format': all '+', the "
                       f"verdict format with no error information), got {self.sft_target!r}.")

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    subset = self.subsets[int(rng.integers(len(self.subsets)))]
    erroneous = bool(rng.random() < self.error_frac)
    trap = erroneous and bool(rng.random() < self.trap_frac)
    return make_chain(rng, subset, erroneous, trap, self.max_error, self.op)

  def demonstration(self, example: Mapping[str, Any]) -> str:
    """sft_target "steps": every step's own verdict (a trap's cancelling step is '-' too), the supervised
    target; "checks": the same verdicts, each after its check ("37+3=40:40+34+4=38:37-"); "format": all '+',
    which teaches the verdict's form and length and nothing about errors."""
    steps = example["steps"]
    if self.sft_target == "checks":
      return worked_verdicts(steps)
    return step_verdicts(steps) if self.sft_target == "steps" else STEP_OK * len(steps)


@TASKS.register("processbench")
@dataclasses.dataclass(frozen=True)
class ProcessBenchFiles(VerdictGrading, JsonlTask):
  """Serves ProcessBench examples from files, graded as `processbench_chains` is: the official Qwen/ProcessBench
  files converted once with `python -m rlkit.data.processbench_convert --official=DIR --out=FILE.jsonl` (or
  any JSONL of such examples), given as data.test_jsonl (and data.train_jsonl). Real ProcessBench text needs an
  HF tokenizer.

  Evaluation scores the whole test file, as the benchmark does (its F1 is the mean of the subset F1s, and a
  converted file holds the subsets one after the other, so the first eval.num_examples rows would all be
  GSM8K's): eval.num_examples does not apply. `eval_limit` N > 0 scores the first N rows of each subset instead,
  and the run says so (rlkit.train.evaluate.evaluated_records)."""
  name: str = dataclasses.field(default="processbench", init=False)
  eval_limit: int = 0       # evaluated rows per subset: 0 = all (the benchmark's number), N = the first N of each

  def __post_init__(self):
    if isinstance(self.eval_limit, bool) or not isinstance(self.eval_limit, int) or self.eval_limit < 0:
      raise ValueError(f"task {self.name!r}: eval_limit must be an integer >= 0 (0 evaluates every row, N the "
                       f"first N rows of each subset), got {self.eval_limit!r}.")
    object.__setattr__(self, "required_fields", tuple(self.required_fields) or ("subset", "steps"))
    super().__post_init__()

