"""`annotated_responses`: sums with one response each, rated by a synthetic annotator population that splits on
style, for the diffusion reward model's tiny experiment (experiments/drm; DESIGN, ../shared/methods/llm.md §11).

Each example is a prompt "12+7=" with one `response` that has two features, both visible in the text:

  correct   the number is the sum ("19") or a near miss ("21": off by 1 to 3)
  verbose   terse "19", or verbose "19 as 12+7=19" (the number, then the equation written out)

Annotators belong to group A (share `group_a_share`) or group B. Everyone adds `correct_bonus` for a right
answer; group A adds `like` for the verbose style, group B subtracts `dislike`; each rating has Gaussian noise
`noise` around its group's value. The true rating distribution of a response is therefore

  terse    N(b c, noise²)                                              consensus: unimodal
  verbose  p N(b c + like, noise²) + (1 − p) N(b c − dislike, noise²)    controversial: bimodal

with b = correct_bonus, c = 1 for a right answer, p = group_a_share. `__post_init__` refuses parameters under
which the verbose mixture has one mode (the experiment's labels would then be wrong). With the defaults the
verbose style has the higher mean (+0.5) and a much lower lower tail: a mean-maximiser prefers it, a
risk-averse reader (a lower quantile) does not.

Every example carries `response`, `ratings` (`num_ratings` draws from the population: the data the reward_model
stage trains on; rlkit/train/reward_model_stage.py), the features `correct` and `verbose`, `controversial` (=
verbose: the groups disagree) and `mixture`, the exact true distribution as [[weight, mean, std], ...], so the
experiment scores predicted distributions against the truth (`mixture_quantiles`), not against 8 noisy ratings.
The SFT demonstration is the right answer in the example's style (`verbose_frac` of them verbose): the base
policy answers in both styles, and the embedding model has seen the equations written correctly.

For RL the task is arithmetic (prompt, answer, `verify` on the leading integer). Any completion maps to the
population's features (`completion_features`: right or not; verbose if anything follows the number), so the
evaluation hook reports, on the greedy answers, `eval/annotated/controversial` (share of verbose answers),
`eval/annotated/true_mean` and `eval/annotated/true_q10` (the population's mean and 10% quantile rating).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import numpy as np

from rlkit.data.tasks import TASKS, Arithmetic, _require

Mixture = tuple[tuple[float, float, float], ...]     # ((weight, mean, std), ...), weights summing to 1
RISK_LEVEL = 0.1                                       # the lower quantile the evaluation reports
_erf = np.frompyfunc(math.erf, 1, 1)                   # numpy has no erf; no scipy in the runtime deps


# ----------------------------------------------------------------------------------------------- mixtures

def mixture_cdf(mixture: Mixture, x) -> np.ndarray:
  """P(rating <= x) under the Gaussian mixture, elementwise over x."""
  x = np.asarray(x, np.float64)
  return sum(w * 0.5 * (1.0 + _erf((x - m) / (s * math.sqrt(2.0))).astype(np.float64)) for w, m, s in mixture)


def mixture_pdf(mixture: Mixture, x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return sum(w * np.exp(-0.5 * ((x - m) / s) ** 2) / (s * math.sqrt(2 * math.pi)) for w, m, s in mixture)


def mixture_mean(mixture: Mixture) -> float:
  return float(sum(w * m for w, m, _ in mixture))


@functools.lru_cache(maxsize=64)
def _quantiles(mixture: Mixture, levels: tuple[float, ...]) -> np.ndarray:
  levels = np.asarray(levels, np.float64)
  lo = np.full(levels.shape, min(m - 10 * s for _, m, s in mixture))
  hi = np.full(levels.shape, max(m + 10 * s for _, m, s in mixture))
  for _ in range(60):                   # bisection: the CDF is increasing; 60 halvings reach float64 precision
    mid = 0.5 * (lo + hi)
    below = mixture_cdf(mixture, mid) < levels
    lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
  return 0.5 * (lo + hi)


def mixture_quantiles(mixture, levels) -> np.ndarray:
  """The true quantile function at `levels` (each in (0, 1)), float64. With levels (j + ½)/M this is the M-point
  discretisation of the truth that W1 / CRPS against empirical samples use (rlkit/rewards/reward_metrics.py):
  its W1 to the exact distribution shrinks as 1/M. Cached per (mixture, levels): the population has four."""
  mixture = tuple(tuple(float(v) for v in c) for c in mixture)
  levels = tuple(float(v) for v in np.asarray(levels, np.float64).reshape(-1))
  if not levels or not all(0.0 < v < 1.0 for v in levels):
    raise ValueError(f"mixture_quantiles: levels must lie in (0, 1), got {levels[:4]}...")
  return _quantiles(mixture, levels).copy()


def midpoint_levels(m: int) -> np.ndarray:
  return (np.arange(m, dtype=np.float64) + 0.5) / m


def count_modes(mixture: Mixture, points: int = 4001) -> int:
  """Local maxima of the mixture density on a fine grid over ±6 std of every component."""
  lo = min(m - 6 * s for _, m, s in mixture)
  hi = max(m + 6 * s for _, m, s in mixture)
  p = mixture_pdf(mixture, np.linspace(lo, hi, points))
  return int(np.sum((p[1:-1] > p[:-2]) & (p[1:-1] >= p[2:])))


# ----------------------------------------------------------------------------------------------- the task

def _finite(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@TASKS.register("annotated_responses")
@dataclasses.dataclass(frozen=True)
class AnnotatedResponses(Arithmetic):
  """Arithmetic (its fields: ops, digits, operands) with one rated response per prompt (module docstring)."""
  num_ratings: int = 8          # annotators who rate each response (K)
  group_a_share: float = 0.5    # share of annotators in group A (likes the verbose style)
  like: float = 2.5             # group A's rating gain for a verbose response
  dislike: float = 1.5          # group B's rating loss for a verbose response
  correct_bonus: float = 1.0    # everyone's rating gain for a right answer
  noise: float = 0.5            # std of one rating around its group's value
  verbose_frac: float = 0.5     # share of verbose responses (rated ones and SFT demonstrations alike)
  wrong_frac: float = 0.3       # share of rated responses that are wrong (demonstrations are always right)
  name: str = dataclasses.field(default="annotated_responses", init=False)
  required_fields: tuple = dataclasses.field(
      default=("response", "ratings", "correct", "verbose", "controversial", "mixture"), init=False)

  def __post_init__(self):
    super().__post_init__()
    k = self.num_ratings
    _require(isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1, self.name,
             f"num_ratings must be an integer >= 1, got {k!r}.")
    checks = {"group_a_share": (lambda v: 0 < v < 1, "a number in (0, 1)"),
              "like": (lambda v: v >= 0, "a number >= 0"), "dislike": (lambda v: v >= 0, "a number >= 0"),
              "correct_bonus": (lambda v: True, "a finite number"), "noise": (lambda v: v > 0, "a number > 0"),
              "verbose_frac": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
              "wrong_frac": (lambda v: 0 <= v <= 1, "a number in [0, 1]")}
    for key, (ok, expected) in checks.items():
      value = getattr(self, key)
      _require(_finite(value) and ok(value), self.name, f"{key}={value!r} is invalid; give {expected}.")
    modes = count_modes(self.mixture(True, True))
    _require(modes == 2, self.name,
             f"like={self.like} and dislike={self.dislike} against noise={self.noise} (group_a_share="
             f"{self.group_a_share}) give the verbose responses a rating density with {modes} mode(s), so the "
             "'controversial' responses would not be bimodal; raise like + dislike (above 2 * noise for equal "
             "groups, more for unequal ones) or lower noise.")

  def mixture(self, correct: bool, verbose: bool) -> Mixture:
    """The true rating distribution of a response with these features, ((weight, mean, std), ...)."""
    base = self.correct_bonus * float(correct)
    if not verbose:
      return ((1.0, base, self.noise),)
    p = float(self.group_a_share)
    return ((p, base + self.like, self.noise), (1.0 - p, base - self.dislike, self.noise))

  def respond(self, prompt: str, value: str, verbose: bool) -> str:
    """The response text: the number, or the number and the equation ("19 as 12+7=19")."""
    return f"{value} as {prompt}{value}" if verbose else value

  def variants(self, example: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every (correct, verbose) response to the example's prompt with its true distribution: the candidates
    of the experiment's "pick the safest response" check. The wrong number is the example's own when it has
    one, else the sum plus one."""
    answer = example["answer"]
    wrong = example["response"].split(" ", 1)[0] if not example["correct"] else str(int(answer) + 1)
    return [{"response": self.respond(example["prompt"], answer if c else wrong, v), "correct": c, "verbose": v,
             "mixture": [list(x) for x in self.mixture(c, v)]} for c in (True, False) for v in (False, True)]

  def sample_ratings(self, rng: np.random.Generator, mixture: Mixture) -> list[float]:
    """`num_ratings` draws from the mixture: each annotator's group, then its noisy rating (4 decimals)."""
    weights = np.array([w for w, _, _ in mixture])
    groups = rng.choice(len(mixture), size=self.num_ratings, p=weights / weights.sum())
    means, stds = np.array([m for _, m, _ in mixture]), np.array([s for _, _, s in mixture])
    return [round(float(x), 4) for x in means[groups] + stds[groups] * rng.standard_normal(self.num_ratings)]

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    example = super().make_example(rng)
    verbose = bool(rng.random() < self.verbose_frac)
    correct = not bool(rng.random() < self.wrong_frac)
    value = int(example["answer"])
    if not correct:                     # a near miss, never negative (off by 1 to 3, either way)
      offset = int(rng.integers(1, 4)) * (1 if value < 3 or rng.random() < 0.5 else -1)
      value += offset
    mixture = self.mixture(correct, verbose)
    return {**example, "response": self.respond(example["prompt"], str(value), verbose),
            "ratings": self.sample_ratings(rng, mixture), "correct": correct, "verbose": verbose,
            "controversial": verbose, "mixture": [list(c) for c in mixture]}

  def demonstration(self, example: Mapping[str, Any]) -> str:
    return self.respond(example["prompt"], example["answer"], example["verbose"])

  def completion_features(self, completion_text: str, answer: str) -> tuple[bool, bool]:
    """(correct, verbose) of any completion: right by `verify`; verbose when any text follows the leading
    number (the population rates every addition to the number as the verbose style)."""
    number = self.extract_answer(completion_text)
    rest = completion_text.strip()[len(number.strip()):] if number is not None else completion_text.strip()
    return bool(self.verify(completion_text, answer)), bool(rest.strip())

  def eval_counts(self, example: Mapping[str, Any], completion_text: str) -> dict[str, float]:
    """The population's view of one greedy answer: its style and its true mean and 10% quantile rating."""
    mixture = self.mixture(*self.completion_features(completion_text, example["answer"]))
    return {"annotated/n": 1.0, "annotated/controversial": float(len(mixture) > 1),
            "annotated/true_mean": mixture_mean(mixture),
            "annotated/true_q10": float(mixture_quantiles(mixture, [RISK_LEVEL])[0])}

  def eval_metrics(self, totals: Mapping[str, float]) -> dict[str, float]:
    n = max(totals["annotated/n"], 1.0)
    return {k: totals[k] / n for k in ("annotated/controversial", "annotated/true_mean", "annotated/true_q10")}
