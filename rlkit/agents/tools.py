"""Tool-calling environments: the policy writes `<call>name(arg, ...)</call>`, the tool runs (in the time-limited
`ToolRunner`), and `<result>value</result>` (or `<error>why</error>`) is appended; a turn without a call ends
the episode (it was the answer). Registered in `AGENT_ENVS`:

  calculator   add, sub, mul on integers: the tool task of SLCA-GRPO (methods/llm.md §10), whose prompts are the
               `tool_calls` task's ("What is 23 times 4?") and whose reward is `tool_task` (rlkit/agents/tool_task.py);
               its answer ends with "<say>", opening the summary turn (`ToolEnv.opens`): the corpus writes
               "</result><say>" with the token "><" across the tags, so a base that was shown "</result>" alone
               wrote the summary without its opening tag
  tools        the user's own Python functions, named in `rl.multi_turn.tools` as "module:function" (README,
               "Your own tools"): a function takes the call's arguments (Python literals: numbers, strings)
               and returns what the policy reads (str() of it)

A call the environment cannot run is an error observation the policy reads, counted for the metrics:
`malformed_call` (a `<call>` it cannot parse), `unknown_tool`, `tool_error` (the tool raised), `tool_timeout`
(it ran past `rl.multi_turn.tool_timeout_s`; the runner kills it). The episode summary (the row's
fields["episode"]) lists every call with its result or error.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from typing import Callable, Mapping, Optional

from rlkit.agents.envs import AGENT_ENVS, EnvSpec, Step

CALL_START, CALL_END = "<call>", "</call>"
_CALL = re.compile(r"<call>\s*(\w+)\s*\((.*?)\)\s*</call>", re.S)


@dataclasses.dataclass(frozen=True)
class Call:
  tool: str
  args: tuple
  result: Optional[str]    # str() of the tool's value; None when the call failed
  error: Optional[str]     # why it failed: the runner's error, "unknown tool ...", "malformed call"

  def as_dict(self) -> dict:
    return {"tool": self.tool, "args": list(self.args), "result": self.result, "error": self.error}


@dataclasses.dataclass(frozen=True)
class ToolEpisode:
  calls: tuple[Call, ...] = ()


def parse_call(text: str) -> Optional[tuple[str, tuple]]:
  """(tool, args) of the first well-formed call in `text`; None if there is none. Arguments are Python
  literals; one that is not reads as its text."""
  m = _CALL.search(text)
  if m is None:
    return None
  args = []
  for part in (p.strip() for p in m.group(2).split(",")) if m.group(2).strip() else ():
    try:
      args.append(ast.literal_eval(part))
    except (ValueError, SyntaxError):
      args.append(part)
  return m.group(1), tuple(args)


@dataclasses.dataclass(frozen=True)
class ToolEnv:
  """Calls `tools` (name -> picklable function) through the runner; see the module docstring."""
  tools: Mapping[str, Callable]
  stop_strings: tuple[str, ...] = (CALL_END,)
  opens: str = ""          # text after each answer that opens the policy's next turn, as a chat template's
                           # generation prompt does (the calculator: "<say>", its summary, as the corpus writes it)

  def reset(self, example: dict, seed: int) -> ToolEpisode:
    del example, seed
    return ToolEpisode()

  def step(self, states, turns, run) -> list[Step]:
    parsed = [parse_call(t) if CALL_START in t else None for t in turns]
    jobs = [i for i, p in enumerate(parsed) if p is not None and p[0] in self.tools]
    results = dict(zip(jobs, run([(self.tools[parsed[i][0]], parsed[i][1]) for i in jobs]))) if jobs else {}
    steps = []
    for i, (state, turn, p) in enumerate(zip(states, turns, parsed)):
      if CALL_START not in turn:
        steps.append(Step(None, state))
        continue
      if p is None:
        call, count = Call("", (), None, "malformed call: write <call>name(arg, ...)</call>"), "malformed_call"
      elif i not in results:
        call = Call(p[0], p[1], None, f"unknown tool {p[0]!r}; tools: {', '.join(sorted(self.tools))}")
        count = "unknown_tool"
      else:
        r = results[i]
        call = Call(p[0], p[1], None if r.error else str(r.value), r.error)
        count = None if r.error is None else "tool_timeout" if r.error == "timeout" else "tool_error"
      obs = (f"<error>{call.error}</error>" if call.error else f"<result>{call.result}</result>") + self.opens
      steps.append(Step(obs, ToolEpisode(state.calls + (call,)), {count: 1} if count else {}))
    return steps

  def summary(self, state: ToolEpisode) -> dict:
    return {"calls": [c.as_dict() for c in state.calls]}


def _two_integers(*args) -> None:
  if len(args) != 2 or not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
    raise TypeError(f"takes two integers, got {args!r}")


def add(*args) -> int:
  _two_integers(*args)
  return args[0] + args[1]


def sub(*args) -> int:
  _two_integers(*args)
  return args[0] - args[1]


def mul(*args) -> int:
  _two_integers(*args)
  return args[0] * args[1]


CALCULATOR = {"add": add, "sub": sub, "mul": mul}


def load_tools(spec: str, where: str = "rl.multi_turn.tools") -> dict[str, Callable]:
  """name -> function of "module:function[,module:function...]"; ValueError naming the entry and the fix."""
  tools = {}
  for entry in (e.strip() for e in str(spec).split(",") if e.strip()):
    module, _, name = entry.partition(":")
    if not module or not name:
      raise ValueError(f"{where}: {entry!r} is not 'module:function' (e.g. 'my_tools:lookup').")
    try:
      fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"{where}: cannot load {entry!r} ({e}); the module must be importable (on PYTHONPATH) "
                       "and define the function at module level.") from None
    if not callable(fn):
      raise ValueError(f"{where}: {entry!r} is not a function.")
    if name in tools:
      raise ValueError(f"{where}: two tools are named {name!r}; tool names must be unique.")
    tools[name] = fn
  if not tools:
    raise ValueError(f"{where} is empty; name your tools as 'module:function,...'.")
  return tools


AGENT_ENVS.add("calculator", EnvSpec(lambda section, tokenizer: ToolEnv(CALCULATOR, opens="<say>")))
def _check_tools(section, name: str) -> None:
  load_tools(section.tools, f"{name}.tools")


AGENT_ENVS.add("tools", EnvSpec(lambda section, tokenizer: ToolEnv(load_tools(section.tools)), _check_tools))
