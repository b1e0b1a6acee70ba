"""The code task family: write a Python function; hidden tests grade it inside the sandbox.

Task `code_functions` (TASKS): the prompt asks for `f(x)` over integers, built from 1..`max_steps` steps
("multiply x by 3, then add 2") with one public example; the answer is the specification as JSON (the steps and
the seed of the hidden inputs); the demonstration is a step-by-step function:

  Write a Python function f(x): multiply x by 3, then add 2. Example: f(4) = 14.
  def f(x):
      x = x * 3
      x = x + 2
      return x

Grading (`run_tests`): the solution and a fixed harness run in a fresh sandbox (rlkit/agents/sandbox.py). Only
the hidden *inputs* enter it (stdin); the expected outputs, the reference steps and the seed stay on the host,
which compares the outputs the harness prints. So reading every file the sandbox can see, patching the harness,
exiting early or printing forged results cannot pass: passing needs the right values for inputs drawn fresh
per example. `verify` (a TASKS verifier, serial) is 1.0 when every hidden test passes; the `code_tests` reward
(rlkit/agents/code_reward.py) grades a batch in parallel.
"""
from __future__ import annotations

import dataclasses
import json
import re
import threading
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np

from rlkit.agents.sandbox import Job, Limits, Result, Sandbox
from rlkit.data.tasks import TASKS, _require

# (phrase, statement) of each step kind; k is the step's constant
STEPS = {"add": ("add {k}", "x = x + {k}"), "sub": ("subtract {k}", "x = x - {k}"),
         "mul": ("multiply x by {k}", "x = x * {k}"), "square": ("square x", "x = x * x"),
         "neg": ("negate x", "x = -x"), "abs": ("take the absolute value", "x = abs(x)"),
         "mod": ("take x modulo {k}", "x = x % {k}")}
INPUT_RANGE = 50          # hidden inputs are uniform in [-INPUT_RANGE, INPUT_RANGE]
_DEF = re.compile(r"def f\(")

HARNESS = r"""
import json, os, sys
inputs = json.loads(sys.stdin.read())
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "solution.py")) as handle:
    source = handle.read()
scope = {"__name__": "solution"}
outputs = []
try:
    exec(compile(source, "solution.py", "exec"), scope)
    f = scope["f"]
    for x in inputs:
        try:
            y = f(x)
            outputs.append(y if type(y) is int else repr(y)[:100])
        except Exception as e:
            outputs.append("error: " + type(e).__name__)
except BaseException as e:
    outputs = "error: " + type(e).__name__
sys.stdout.write("\n" + json.dumps({"outputs": outputs}) + "\n")
"""


def apply_steps(steps, x: int) -> int:
  """The reference function (host-side only)."""
  for kind, k in steps:
    x = {"add": lambda v: v + k, "sub": lambda v: v - k, "mul": lambda v: v * k, "square": lambda v: v * v,
         "neg": lambda v: -v, "abs": abs, "mod": lambda v: v % k}[kind](x)
  return x


def hidden_inputs(spec: Mapping[str, Any]) -> list[int]:
  """The example's hidden inputs, drawn from its seed (never shown to the policy or the sandbox's files)."""
  rng = np.random.default_rng(int(spec["seed"]))
  return [int(v) for v in rng.integers(-INPUT_RANGE, INPUT_RANGE + 1, size=int(spec["tests"]))]


class TestReport(NamedTuple):
  """One solution's grade."""
  passed: int               # hidden tests passed
  total: int
  outputs: Any              # what the harness printed (a list, an error string), or None
  result: Optional[Result]  # the sandbox run (None when the completion had no function)

  @property
  def fraction(self) -> float:
    return self.passed / self.total if self.total else 0.0


def extract_code(completion: str) -> Optional[str]:
  """The completion from its first `def f(` on, or None."""
  m = _DEF.search(completion)
  return completion[m.start():].rstrip() + "\n" if m else None


def test_job(code: str, spec: Mapping[str, Any]) -> Job:
  return Job.python(HARNESS, stdin=json.dumps(hidden_inputs(spec)).encode(), files={"solution.py": code})


def grade(code: Optional[str], spec: Mapping[str, Any], result: Optional[Result]) -> TestReport:
  """Compares the harness's printed outputs with the reference on the host."""
  total = int(spec["tests"])
  if code is None or result is None:
    return TestReport(0, total, None, result)
  outputs = None
  for line in reversed(result.stdout.splitlines()):
    try:
      outputs = json.loads(line)["outputs"]
      break
    except (ValueError, KeyError, TypeError):
      continue
  expected = [apply_steps(spec["steps"], x) for x in hidden_inputs(spec)]
  if result.limit or not isinstance(outputs, list) or len(outputs) != total:
    return TestReport(0, total, outputs, result)
  passed = sum(type(got) is int and got == want for got, want in zip(outputs, expected))
  return TestReport(passed, total, outputs, result)


def run_tests(sandbox: Sandbox, completions, answers, workers: int = 2) -> list[TestReport]:
  """Grades each completion against its answer's hidden tests, `workers` sandboxes at a time."""
  specs = [json.loads(a) for a in answers]
  codes = [extract_code(c) for c in completions]
  todo = [i for i, code in enumerate(codes) if code is not None]
  results = dict(zip(todo, sandbox.map([test_job(codes[i], specs[i]) for i in todo], workers=workers)))
  return [grade(codes[i], specs[i], results.get(i)) for i in range(len(codes))]


_SANDBOX: dict = {}
_SANDBOX_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
  """One bwrap sandbox per process for the task's verifier (the reward builds its own from its kwargs)."""
  with _SANDBOX_LOCK:
    if "box" not in _SANDBOX:
      _SANDBOX["box"] = Sandbox(Limits(cpu_s=2, wall_s=5.0, memory_mb=256, processes=8))
    return _SANDBOX["box"]


@TASKS.register("code_functions")
@dataclasses.dataclass(frozen=True)
class CodeFunctions:
  """Write `f(x)` from a step description; graded by hidden tests in the sandbox (module docstring)."""
  kinds: str = "add,sub,mul,square,neg,abs,mod"
  max_steps: int = 3
  tests: int = 8
  max_constant: int = 9
  verbose_rate: float = 0.0   # the fraction of demonstrations padded with redundant statements (a testbed for
                              # graders that prefer concise solutions: SFT then writes both kinds)
  name: str = dataclasses.field(default="code_functions", init=False)
  required_fields: tuple = dataclasses.field(default=(), init=False)

  def __post_init__(self):
    kinds = self.kinds.split(",") if isinstance(self.kinds, str) else []
    _require(bool(kinds) and set(kinds) <= set(STEPS), self.name,
             f"kinds must be a comma-separated subset of {','.join(STEPS)}, got {self.kinds!r}.")
    _require(isinstance(self.verbose_rate, (int, float)) and 0.0 <= self.verbose_rate <= 1.0, self.name,
             f"verbose_rate must be a number in [0, 1], got {self.verbose_rate!r}.")
    for key, low, high in (("max_steps", 1, 6), ("tests", 1, 64), ("max_constant", 2, 99)):
      value = getattr(self, key)
      _require(isinstance(value, (int, np.integer)) and low <= value <= high, self.name,
               f"{key} must be an integer in [{low}, {high}], got {value!r}.")

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    kinds = self.kinds.split(",")
    steps = []
    for _ in range(int(rng.integers(1, self.max_steps + 1))):
      kind = kinds[int(rng.integers(len(kinds)))]
      steps.append([kind, int(rng.integers(2, self.max_constant + 1)) if "{k}" in STEPS[kind][0] else 0])
    x = int(rng.integers(1, 10))
    phrase = ", then ".join(STEPS[kind][0].format(k=k) for kind, k in steps)
    spec = {"steps": steps, "seed": int(rng.integers(2 ** 31)), "tests": self.tests}
    if self.verbose_rate and rng.random() < self.verbose_rate:
      spec["pad"] = int(rng.integers(1, 3))      # redundant statement pairs in the demonstration
    return {"prompt": f"Write a Python function f(x): {phrase}. Example: f({x}) = {apply_steps(steps, x)}.\n",
            "answer": json.dumps(spec)}

  def extract_answer(self, completion_text: str) -> Optional[str]:
    return extract_code(completion_text)

  def verify(self, completion_text: str, answer: str) -> float:
    [report] = run_tests(default_sandbox(), [completion_text], [answer], workers=1)
    return float(report.total > 0 and report.passed == report.total)

  def demonstration(self, example: Mapping[str, Any]) -> str:
    """The reference, or, for a padded example, the reference with `pad` redundant pairs before its return."""
    code = reference_code(example["answer"])
    pad = json.loads(example["answer"]).get("pad", 0)
    return code.replace("    return x", "    y = x\n    x = y\n" * pad + "    return x") if pad else code


def reference_code(answer: str) -> str:
  """The step-by-step reference solution of an example's answer (its demonstration when not padded)."""
  body = "".join(f"    {STEPS[kind][1].format(k=k)}\n" for kind, k in json.loads(answer)["steps"])
  return f"def f(x):\n{body}    return x"

