"""Schedules of traced step inputs (registry `SCHEDULES`, config `rl.schedules`): a loss-term weight, a row
source's weight or any other `step_inputs` value as a function of the stage step.

`rl.schedules` maps a step-input name to a schedule, e.g.
`{"weight/kl": {"kind": "linear", "start": 0.1, "end": 0.0, "steps": 200}}`. The stage evaluates every
schedule on the host at each iteration and passes the values as float32 scalars in `step_inputs`, which the
jitted update step traces: a changing value never recompiles the step.

  constant   value                                          v(t) = value
  linear     start, end, steps, begin=0                     start -> end linearly over [begin, begin + steps],
                                                            then end (begin: held at start before)
  cosine     start, end, steps, begin=0                     end + (start - end) (1 + cos(pi u)) / 2, u the same
                                                            clipped fraction of the way
  piecewise  boundaries, values                             values[i] on [boundaries[i-1], boundaries[i]):
                                                            len(values) = len(boundaries) + 1

A schedule is `make(**params) -> (t: int) -> float`, a pure function of the step, so a resumed run sees the
same values as an uninterrupted one.
"""
from __future__ import annotations

import bisect
import math
from typing import Callable, Mapping

from rlkit.core.errors import ConfigError
from rlkit.core.registry import Registry, choice

Schedule = Callable[[int], float]
SCHEDULES: Registry[Callable[..., Schedule]] = Registry("schedule")


def _fraction(t: int, begin: int, steps: int) -> float:
  return min(max((t - begin) / steps, 0.0), 1.0) if steps > 0 else float(t >= begin)


@SCHEDULES.register("constant")
def constant(value: float) -> Schedule:
  return lambda t: float(value)


@SCHEDULES.register("linear")
def linear(start: float, end: float, steps: int, begin: int = 0) -> Schedule:
  return lambda t: float(start) + (float(end) - float(start)) * _fraction(t, begin, steps)


@SCHEDULES.register("cosine")
def cosine(start: float, end: float, steps: int, begin: int = 0) -> Schedule:
  return lambda t: float(end) + (float(start) - float(end)) * (1 + math.cos(math.pi * _fraction(t, begin, steps))) / 2


@SCHEDULES.register("piecewise")
def piecewise(boundaries, values) -> Schedule:
  boundaries, values = [int(b) for b in boundaries], [float(v) for v in values]
  if len(values) != len(boundaries) + 1 or boundaries != sorted(boundaries):
    raise ValueError(f"piecewise needs increasing boundaries and one more value than boundaries; got "
                     f"boundaries={boundaries}, values={values}.")
  return lambda t: values[bisect.bisect_right(boundaries, t)]


def make_schedule(spec: Mapping) -> Schedule:
  """The schedule of one `rl.schedules` entry ({"kind": ..., **params})."""
  params = dict(spec)
  return SCHEDULES.get(params.pop("kind"))(**params)


def check(schedules: Mapping, where: str) -> None:
  """ConfigError naming the entry and the fix for a bad `rl.schedules` section (an unknown kind or a bad
  parameter); evaluates each schedule at step 0 so a wrong parameter fails before any work."""
  for name, spec in schedules.items():
    key = f"{where}.{name}"
    if not hasattr(spec, "items") or "kind" not in spec:
      raise ConfigError(f"{key}={spec!r}: a schedule is a dict with a `kind` ({', '.join(SCHEDULES)}) and its "
                        'parameters, e.g. {"kind": "linear", "start": 1.0, "end": 0.0, "steps": 100}.')
    choice(spec["kind"], SCHEDULES, f"{key}.kind")
    try:
      make_schedule(spec)(0)
    except (TypeError, ValueError) as e:
      raise ConfigError(f"{key}: {e}") from None


def values_at(schedules: Mapping, step: int) -> dict[str, float]:
  """{step-input name: value at `step`} of every schedule."""
  return {name: make_schedule(spec)(step) for name, spec in schedules.items()}
