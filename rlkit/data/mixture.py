"""`mixture`: several tasks ("skills") drawn by weight into one task, the pretraining corpus of experiments/base.

  task.name = "mixture"
  task.kwargs.skills = {"add": {"task": "arithmetic", "weight": 3.0, "kwargs": {"ops": "+-", "max_digits": 3}},
                        "story": {"task": "word_problems", "weight": 1.0}}

Each example comes from one skill, drawn with probability proportional to its weight, and keeps the skill's
own prompt, demonstration and extra fields plus a `skill` field. Its answer is "skill<TAB>answer", so that
`verify(completion, answer)` grades with the skill's own verifier (the Task interface hands a verifier only
the answer string), and `category` is the skill: `eval.by_category=True` reports the held-out accuracy of
every skill (`eval/accuracy/<skill>`), the base model's skill table. The held-out split is the usual one
(`rlkit.data.splits`: test prompts are never in train), so each skill has its own held-out examples.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np

from rlkit.data.tasks import TASKS, _require, make_task

SEP = "\t"


def _plain(value: Any) -> Any:
  """ConfigDicts (from a config file) as plain dicts."""
  return value.to_dict() if hasattr(value, "to_dict") else dict(value)


@TASKS.register("mixture")
@dataclasses.dataclass(frozen=True, eq=False)
class Mixture:
  """Skills by weight; see the module docstring for the `skills` mapping."""
  skills: Any = None
  name: str = dataclasses.field(default="mixture", init=False)
  required_fields: tuple = dataclasses.field(default=("skill",), init=False)

  def __post_init__(self):
    _require(self.skills is not None and len(self.skills) > 0, self.name,
             'skills must map each skill name to {"task": <task name>, "weight": <w > 0>, "kwargs": {...}}; '
             "got none.")
    parts = {}
    for skill, spec in sorted(_plain(self.skills).items()):
      spec = _plain(spec)
      _require(isinstance(skill, str) and skill and SEP not in skill, self.name,
               f"skill names must be non-empty strings without a tab, got {skill!r}.")
      unknown = sorted(set(spec) - {"task", "weight", "kwargs"})
      _require("task" in spec and not unknown, self.name,
               f"skill {skill!r}: needs 'task' and takes 'weight' and 'kwargs' only, got keys {sorted(spec)}.")
      weight = spec.get("weight", 1.0)
      _require(isinstance(weight, (int, float)) and weight > 0, self.name,
               f"skill {skill!r}: weight must be a number > 0, got {weight!r}.")
      _require(spec["task"] != self.name, self.name, f"skill {skill!r}: a mixture cannot contain a mixture.")
      parts[skill] = (make_task(spec["task"], **_plain(spec.get("kwargs") or {})), float(weight))
    object.__setattr__(self, "_parts", parts)
    names = list(parts)
    weights = np.array([w for _, w in parts.values()])
    object.__setattr__(self, "_names", names)
    object.__setattr__(self, "_probs", weights / weights.sum())

  def task_of(self, skill: str):
    """The task that generates and grades `skill`."""
    if skill not in self._parts:
      raise ValueError(f"task 'mixture': unknown skill {skill!r}; skills: {', '.join(self._names)}.")
    return self._parts[skill][0]

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    skill = self._names[int(rng.choice(len(self._names), p=self._probs))]
    example = self.task_of(skill).make_example(rng)
    _require("skill" not in example, self.name, f"skill {skill!r}: its task's examples already have a 'skill' "
             "field, which the mixture needs; rename that field.")
    return {**example, "answer": skill + SEP + example["answer"], "skill": skill}

  def _split(self, answer: str) -> tuple[str, str]:
    skill, sep, inner = answer.partition(SEP)
    if not sep:
      raise ValueError(f"task 'mixture': the answer {answer[:40]!r} has no 'skill<TAB>' prefix; mixture answers "
                       "are written by its make_example.")
    return skill, inner

  def demonstration(self, example: Mapping[str, Any]) -> str:
    skill, inner = self._split(example["answer"])
    fields = {k: v for k, v in example.items() if k != "skill"}
    return self.task_of(skill).demonstration({**fields, "answer": inner})

  def extract_answer(self, completion_text: str) -> Optional[str]:
    """The first skill's extraction that finds an answer (graded answers need the skill: see `verify`)."""
    for skill in self._names:
      got = self.task_of(skill).extract_answer(completion_text)
      if got is not None:
        return got
    return None

  def verify(self, completion_text: str, answer: str) -> float:
    skill, inner = self._split(answer)
    return self.task_of(skill).verify(completion_text, inner)

  def category(self, example: Mapping[str, Any]) -> str:
    return self._split(example["answer"])[0]
