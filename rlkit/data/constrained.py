"""`keyword_arithmetic`: arithmetic with an instruction to follow, for CALIF's tiny experiment (experiments/calif;
DESIGN, ../shared/methods/llm.md §2).

"17+25=[BLUE]" asks for the sum and for the word BLUE in the answer: "42 BLUE" does both. Each example carries
its constraint list (`[{"kind": "keyword", "word": "BLUE"}]`, rlkit/rewards/calif.py) and its `base_prompt`
("17+25=", what the frozen reference answers for CALIF's length anchor). The SFT demonstrations follow the
instruction on a share `follow_frac` of the examples (drawn per example, kept in the field `follows`), so the
base policy sometimes writes the word and RL has a behaviour to reinforce.

Evaluation adds the instruction's view of the greedy answers (rlkit/train/evaluate.py's hook), computed by the
constraint reward's own checks: `eval/constraint/satisfied` (the word is there), `eval/constraint/both` (the
sum is right and the word is there), `eval/constraint/content_len` (characters besides the word, as CALIF
counts them); `eval/accuracy` is the sum's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from rlkit.data.tasks import TASKS, Arithmetic, _require


@TASKS.register("keyword_arithmetic")
@dataclasses.dataclass(frozen=True)
class KeywordArithmetic(Arithmetic):
  """Arithmetic (its fields) plus a required keyword from `words`, written in the prompt as "=[WORD]"."""
  words: tuple = ("RED", "BLUE", "GREEN")
  follow_frac: float = 0.3
  name: str = dataclasses.field(default="keyword_arithmetic", init=False)
  required_fields: tuple = dataclasses.field(default=("constraints", "base_prompt"), init=False)

  def __post_init__(self):
    super().__post_init__()
    words = tuple(self.words) if isinstance(self.words, (tuple, list)) else ()
    _require(bool(words) and all(isinstance(w, str) and w.isalpha() and w.isupper() for w in words), self.name,
             f"words must be a non-empty list of upper-case words, got {self.words!r}.")
    object.__setattr__(self, "words", words)
    _require(isinstance(self.follow_frac, (int, float)) and 0.0 <= self.follow_frac <= 1.0, self.name,
             f"follow_frac must be in [0, 1], got {self.follow_frac!r}.")

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    example = super().make_example(rng)
    word = self.words[int(rng.integers(len(self.words)))]
    return {"prompt": f"{example['prompt']}[{word}]", "answer": example["answer"], "base_prompt": example["prompt"],
            "constraints": [{"kind": "keyword", "word": word}], "follows": bool(rng.random() < self.follow_frac)}

  def demonstration(self, example: Mapping[str, Any]) -> str:
    word = example["constraints"][0]["word"]
    return f"{example['answer']} {word}" if example["follows"] else example["answer"]

  def eval_counts(self, example: Mapping[str, Any], completion_text: str) -> dict[str, float]:
    from rlkit.rewards.calif import CONSTRAINTS, content_length, parse_constraints
    fields = example.get("fields") or example
    constraints = parse_constraints(fields["constraints"], f"task {self.name!r}")
    satisfied = float(all(CONSTRAINTS.get(c.kind).check(completion_text, **c.params) for c in constraints))
    right = self.verify(completion_text, example["answer"])
    return {"constraint/n": 1.0, "constraint/satisfied": satisfied, "constraint/both": satisfied * right,
            "constraint/content_len": float(content_length(completion_text, constraints))}

  def eval_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
    n = max(totals["constraint/n"], 1.0)
    return {k: totals[k] / n for k in ("constraint/satisfied", "constraint/both", "constraint/content_len")}
