"""The environment interface of multi-turn rollouts (registry `AGENT_ENVS`, config `rl.multi_turn.env`).

The multi-turn collector (`rlkit.rollout.multi_turn`) lets the policy write a turn, hands the turn's text to
the environment, and appends the environment's answer (an observation: a tool's result, a room's
description) to the live KV cache as tokens; the episode ends when the environment returns no observation,
or at the collector's turn or token budget. An environment is host-side Python, batched over the rows of one
collect call, and never sees tokens, only text:

  env.stop_strings                      text that ends a policy turn besides the tokenizer's stop tokens
                                        (e.g. "</call>": the policy stops there and the tool answers)
  state = env.reset(example, seed)      one row's episode state, from its example (prompt, answer, fields)
                                        and an integer seed; a pure function of both, so a resumed run
                                        rebuilds the same episodes
  steps = env.step(states, turns, run)  one `Step` per row: the observation text (None ends the episode;
                                        with done=True it is appended, then the episode ends), the new
                                        state, and counts (tool errors, timeouts) for the metrics;
                                        `run` is the `ToolRunner` that executes user code under a time limit
  env.summary(state) -> dict            what the reward reads of a finished episode (in the row's
                                        fields["episode"]): e.g. the calls made, success, the hindsight text

A tool that raises or hangs must not crash or hang the run: an environment calls user code only through
`run` (`rlkit.agents.runner.ToolRunner.map`), which returns an error result within the time limit, and
turns it into an error observation the policy reads. Registered with `EnvSpec(make, check)`: `make(section,
tokenizer)` builds the environment from the `rl.multi_turn` section once per learner; `check(section, name)`
validates its settings (ValueError naming the key and the fix).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence

from rlkit.core.registry import Registry


class Step(NamedTuple):
  """One row's environment answer to a policy turn."""
  observation: Optional[str]   # text appended to the row's context; None: the episode is over
  state: Any                   # the row's episode state after the turn
  counts: dict = {}            # name -> count for the metrics (e.g. {"tool_error": 1, "tool_timeout": 1})
  done: bool = False           # True with an observation: it is appended and the episode ends there (a
                               # final observation the policy does not answer, e.g. what it should have done)


class AgentEnv(Protocol):
  stop_strings: tuple[str, ...]

  def reset(self, example: dict, seed: int) -> Any: ...

  def step(self, states: Sequence[Any], turns: Sequence[str], run: Callable) -> list[Step]: ...

  def summary(self, state: Any) -> dict: ...


def _no_check(section, name: str) -> None:
  del section, name


class EnvSpec(NamedTuple):
  make: Callable[[Any, Any], AgentEnv]            # (rl.multi_turn section, tokenizer) -> environment
  check: Callable[[Any, str], None] = _no_check   # (rl.multi_turn section, its name) -> None; ValueError


AGENT_ENVS: Registry[EnvSpec] = Registry("agent environment")
