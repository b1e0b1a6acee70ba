"""Rubric item judges (rlkit/rewards/rubric.py): the checks a rubric item names by `check.kind`, each a function
`judge(task, completion, answer, params) -> float in [0, 1]` (1: the item is met) with the `check` parameters it
takes. Exact checkers for synthetic tasks (contains, not_contains, regex, answer_correct), and `lm`, a judge
model's yes/no that the rubric reward asks in the trainer process. Judges are module-level functions, so the
reward's executor worker can import them.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping, NamedTuple, Optional

from rlkit.core.registry import Registry


class ItemJudge(NamedTuple):
  """An item checker `judge(task, completion, answer, params) -> float in [0, 1]` and the `check` parameters
  it takes (name -> type). `validate(params)` returns a problem with valid-typed params, or None."""
  judge: Callable[[Any, str, str, Mapping[str, Any]], float]
  required: Mapping[str, type]
  optional: Mapping[str, type]
  validate: Optional[Callable[[Mapping[str, Any]], Optional[str]]] = None
  in_process: bool = False    # judged by a model in the trainer process (kind "lm"), not in the worker


ITEM_JUDGES: Registry[ItemJudge] = Registry("rubric item judge")


def register_item_judge(name: str, *, required: Optional[Mapping[str, type]] = None,
                        optional: Optional[Mapping[str, type]] = None, validate=None, in_process: bool = False):
  """Registers a module-level judge function as check kind `name` (module-level, so the worker can import it)."""
  def decorator(judge):
    ITEM_JUDGES.add(name, ItemJudge(judge, dict(required or {}), dict(optional or {}), validate, in_process))
    return judge
  return decorator


def _fold(text: str, params: Mapping[str, Any]) -> str:
  return text if params.get("case_sensitive", True) else text.casefold()


@register_item_judge("contains", required={"text": str}, optional={"case_sensitive": bool})
def judge_contains(task, completion: str, answer: str, params: Mapping[str, Any]) -> float:
  return float(_fold(params["text"], params) in _fold(completion, params))


@register_item_judge("not_contains", required={"text": str}, optional={"case_sensitive": bool})
def judge_not_contains(task, completion: str, answer: str, params: Mapping[str, Any]) -> float:
  return 1.0 - judge_contains(task, completion, answer, params)


def _pattern_problem(params: Mapping[str, Any]) -> Optional[str]:
  try:
    re.compile(params["pattern"])
  except re.error as e:
    return f"check.pattern {params['pattern']!r} is not a valid regular expression ({e})"
  return None


@register_item_judge("regex", required={"pattern": str}, validate=_pattern_problem)
def judge_regex(task, completion: str, answer: str, params: Mapping[str, Any]) -> float:
  return float(re.search(params["pattern"], completion) is not None)


@register_item_judge("answer_correct")
def judge_answer_correct(task, completion: str, answer: str, params: Mapping[str, Any]) -> float:
  """The task's verifier accepts the completion (its score above 0.5, as in the "verifier" reward)."""
  return float(task.verify(completion, answer) > 0.5)


@register_item_judge("lm", optional={"question": str}, in_process=True)
def judge_lm(task, completion: str, answer: str, params: Mapping[str, Any]) -> float:
  """A model's yes/no judgment (rlkit/rewards/lm_judge.py), asked `question` (default: the criterion). The
  rubric reward runs it in the trainer process with the model of its `judge_role`; never called in the worker."""
  raise RuntimeError("rubric item kind 'lm' is judged by the rubric reward's judge model, not by this function.")
