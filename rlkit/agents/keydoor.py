"""Key-and-door rooms: the multi-turn text task of the SRD experiment (../shared/methods/llm.md §4), as an
environment (`AGENT_ENVS["key_door"]`), a task (`TASKS["key_door"]`) and a reward (`REWARDS["key_door"]`).

`n_rooms` rooms lie in a line; the policy starts in room 0 and must reach room n_rooms-1. Door i (between
rooms i and i+1) is locked with a colour, and its key lies in a room k <= i, so a key is always reachable
before its door. The policy writes one action a turn, `<act>go east</act>`, `<act>go west</act>`,
`<act>take red key</act>` or `<act>open red door</act>`, and reads the room it is in, `<obs>Room 1. A blue
key is here. The door east is locked (green).</obs>`, or `<obs>Nothing happens.</obs>` for an action that
is invalid or unreadable. A turn without `<act>` ends the episode with no observation (the policy stopped).

SRD needs a task where early rollouts all fail (every group's reward is 0, so GRPO's gradient is exactly
zero) and where what comes after an action tells what should have been done: after `max_actions` actions
without reaching the goal the episode ends with a final observation that spells out the shortest way,
`<obs>Out of time. The way was: take red key, open red door, go east, ...</obs>`, which the retrospective
teacher reads as hindsight. Walking east and taking each key in the room where it lies is the shortest way:
each door costs exactly one take, one open and one step, 3 * (n_rooms - 1) actions in all.

The layout, {"doors": [colour of door i], "keys": [room of door i's key]}, is the example's extra field
`layout`; the environment rebuilds every episode from it alone. With `"hidden_keys": true` in the layout (the
task's `hidden_keys=True`) a room shows its keys without their colours (`A key is here.`): the doors still show
theirs, so a key lying beside its own door can be named, but a key for a door further east (keys[i] < i) must be
guessed, and a wrong colour is an action that does nothing. Then the way told at the end holds what the
observations hid when the key was taken, which is what SRD's hindsight needs: on the plain task every action of
the shortest way can be read off the room the policy is in (experiments/srd/probe_runs, round 5).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from rlkit.agents.envs import AGENT_ENVS, EnvSpec, Step
from rlkit.data.tasks import TASKS, _require
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.verifier import RewardFn, register_reward

COLOURS = ("red", "blue", "green", "yellow")   # door colours are distinct, so "take red key" names one key
STOP = "</act>"
NOTHING = "<obs>Nothing happens.</obs>"
GOAL = "<obs>You reached the goal.</obs>"
_ACT = re.compile(r"<act>(.*?)(?:</act>|\Z)", re.S)   # an unclosed act counts: a collector may strip the stop
_TAKE = re.compile(r"take (\w+) key")
_OPEN = re.compile(r"open (\w+) door")


def parse_actions(text: str) -> list[str]:
  """Every `<act>` of `text`, lower-cased with single spaces: "<act> Take  RED key</act>" -> "take red key"."""
  return [" ".join(m.group(1).lower().split()) for m in _ACT.finditer(text)]


@dataclasses.dataclass(frozen=True)
class KeyDoorState:
  """One episode: the layout (door colours, the room of each door's key) and what the policy has done."""
  doors: tuple[str, ...]
  keys: tuple[int, ...]
  room: int = 0
  held: tuple[str, ...] = ()      # colours of the keys taken, in the order taken
  opened: tuple[bool, ...] = ()   # per door
  actions: int = 0
  invalid: int = 0
  success: bool = False
  hidden_keys: bool = False       # rooms show their keys without colours (module docstring)


def layout_of(example: Mapping[str, Any]) -> Mapping[str, Any]:
  """The example's `layout` field, from a decoded record or a raw `make_example` row."""
  fields = example.get("fields") or example
  if "layout" not in fields:
    raise ValueError(f"key_door: the example has no 'layout' field (keys {sorted(fields)}); its examples come "
                     "from task.name='key_door', or a JSONL file whose rows carry 'layout'.")
  return fields["layout"]


def state_from_layout(layout: Mapping[str, Any]) -> KeyDoorState:
  """The start state of `layout`; a layout that is not a solvable key-door world raises a ValueError."""
  doors, keys = (layout.get("doors"), layout.get("keys")) if isinstance(layout, Mapping) else (None, None)
  ok = (isinstance(doors, (list, tuple)) and isinstance(keys, (list, tuple)) and len(doors) == len(keys) >= 1
        and all(d in COLOURS for d in doors) and len(set(doors)) == len(doors)
        and all(type(k) is int and 0 <= k <= i for i, k in enumerate(keys))
        and type(layout.get("hidden_keys", False)) is bool)
  if not ok:
    raise ValueError(f"key_door: bad layout {layout!r}; need 'doors' (distinct colours of {COLOURS}) and "
                     "'keys' (keys[i] the room of door i's key, 0 <= keys[i] <= i), of equal non-zero length, "
                     "and optionally 'hidden_keys' (true or false).")
  return KeyDoorState(tuple(doors), tuple(keys), opened=(False,) * len(doors),
                      hidden_keys=layout.get("hidden_keys", False))


def shortest_way(state: KeyDoorState) -> list[str]:
  """The shortest actions from the start: in each room take the keys lying there, open the door, go east."""
  way = []
  for room, colour in enumerate(state.doors):
    way += [f"take {state.doors[i]} key" for i, k in enumerate(state.keys) if k == room]
    way += [f"open {colour} door", "go east"]
  return way


def describe(state: KeyDoorState) -> str:
  """The observation of the current room (never the last one: reaching it ends the episode)."""
  here = [f"A {'' if state.hidden_keys else c + ' '}key is here."
          for c, k in zip(state.doors, state.keys) if k == state.room and c not in state.held]
  door = ("open" if state.opened[state.room] else f"locked ({state.doors[state.room]})")
  return " ".join([f"<obs>Room {state.room}."] + here + [f"The door east is {door}.</obs>"])


def act(state: KeyDoorState, action: str) -> Optional[KeyDoorState]:
  """The state after a valid `action` (its counters untouched), or None where nothing happens."""
  door_east = state.room < len(state.doors)   # False only in the goal room, which ends the episode
  if action == "go west" and state.room > 0:
    return dataclasses.replace(state, room=state.room - 1)
  if action == "go east" and door_east and state.opened[state.room]:
    return dataclasses.replace(state, room=state.room + 1, success=state.room + 1 == len(state.doors))
  m = _TAKE.fullmatch(action)
  if m and any(c == m[1] and k == state.room for c, k in zip(state.doors, state.keys)) and m[1] not in state.held:
    return dataclasses.replace(state, held=state.held + (m[1],))
  m = _OPEN.fullmatch(action)
  if m and door_east and state.doors[state.room] == m[1] and m[1] in state.held and not state.opened[state.room]:
    opened = state.opened[:state.room] + (True,) + state.opened[state.room + 1:]
    return dataclasses.replace(state, opened=opened)
  return None


# ----------------------------------------------------------------------------------------------------------
# The environment


@dataclasses.dataclass(frozen=True)
class KeyDoorEnv:
  """The key-door world as an `AgentEnv`: one action a turn, every action (valid or not) counts towards
  `max_actions`. `step` needs no tool runner: nothing here runs user code."""
  max_actions: int = 8
  stop_strings: tuple[str, ...] = (STOP,)

  def __post_init__(self):
    _check_max_actions(self.max_actions, "max_actions")

  def reset(self, example: Mapping[str, Any], seed: int) -> KeyDoorState:
    del seed   # the world is the example's layout; the interface's seed has nothing left to draw
    return state_from_layout(layout_of(example))

  def step(self, states: Sequence[KeyDoorState], turns: Sequence[str], run: Callable = None) -> list[Step]:
    del run
    if len(states) != len(turns):
      raise ValueError(f"KeyDoorEnv.step: {len(states)} states but {len(turns)} turns.")
    return [self._step_one(s, t) for s, t in zip(states, turns)]

  def _step_one(self, state: KeyDoorState, turn: str) -> Step:
    actions = parse_actions(turn)
    if not actions or state.success or state.actions >= self.max_actions:
      return Step(None, state, {})   # the policy stopped acting (or the episode was already over)
    moved = act(state, actions[0])    # the stop string ends a turn at its first act
    valid = moved is not None
    new = dataclasses.replace(moved if valid else state, actions=state.actions + 1, invalid=state.invalid + (not valid))
    counts = {} if valid else {"invalid_action": 1}
    if new.success:
      return Step(GOAL, new, counts, done=True)
    if new.actions >= self.max_actions:
      return Step(f"<obs>Out of time. The way was: {', '.join(shortest_way(new))}.</obs>", new, counts, done=True)
    return Step(describe(new) if valid else NOTHING, new, counts)

  def summary(self, state: KeyDoorState) -> dict:
    return {"success": bool(state.success), "actions": state.actions, "invalid": state.invalid,
            "solution": ", ".join(shortest_way(state))}


def _check_max_actions(value, key: str) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{key} must be an integer >= 1 (the actions an episode may take), got {value!r}.")


def _env_kwargs(section) -> dict:
  """`section.env_kwargs` as a dict ({} when the section has none); only `max_actions` is known."""
  kwargs = getattr(section, "env_kwargs", None)
  kwargs = dict(kwargs.items()) if kwargs is not None else {}
  unknown = sorted(set(kwargs) - {"max_actions"})
  if unknown:
    raise ValueError(f"rl.multi_turn.env_kwargs: unknown key(s) {unknown} for env 'key_door'; valid keys: "
                     "['max_actions'].")
  return kwargs


def make_key_door_env(section, tokenizer) -> KeyDoorEnv:
  """Builds the environment from the `rl.multi_turn` section: its optional `env_kwargs` (a ConfigDict,
  possibly empty) may set `max_actions` (default 8). The tokenizer is unused: observations are text."""
  del tokenizer
  return KeyDoorEnv(**_env_kwargs(section))


def check_key_door_env(section, name: str) -> None:
  kwargs = _env_kwargs(section)
  if "max_actions" in kwargs:
    _check_max_actions(kwargs["max_actions"], f"rl.multi_turn.env_kwargs.max_actions (env {name!r})")


AGENT_ENVS.add("key_door", EnvSpec(make_key_door_env, check_key_door_env))


# ----------------------------------------------------------------------------------------------------------
# The task


@TASKS.register("key_door")
@dataclasses.dataclass(frozen=True)
class KeyDoor:
  """Key-door worlds of `n_rooms` rooms: door colours drawn without replacement from `COLOURS`, door i's key
  in a room uniform in [0, i]. The answer is the shortest way, "take red key, open red door, go east, ...".

  `verify` has only the completion and the answer, so it accepts exactly the shortest way's actions in
  order; the RL reward (`REWARDS["key_door"]`) reads the environment's own success flag instead, which any
  successful route earns. `max_actions` is only stated in the prompt: the environment's budget is
  `rl.multi_turn.env_kwargs.max_actions`, and the two should agree (both default to 8).
  """
  n_rooms: int = 3
  max_actions: int = 8
  hidden_keys: bool = False       # rooms show keys without colours (module docstring); in the layout
  name: str = dataclasses.field(default="key_door", init=False)
  required_fields: tuple = dataclasses.field(default=("layout",), init=False)

  def __post_init__(self):
    _require(isinstance(self.n_rooms, (int, np.integer)) and 2 <= self.n_rooms <= len(COLOURS) + 1, self.name,
             f"n_rooms must be an integer in [2, {len(COLOURS) + 1}] (one colour per door), got {self.n_rooms!r}.")
    need = 3 * (self.n_rooms - 1)
    _require(isinstance(self.max_actions, (int, np.integer)) and self.max_actions >= need, self.name,
             f"max_actions must be an integer >= {need} (the shortest way through {self.n_rooms} rooms), "
             f"got {self.max_actions!r}.")
    _require(type(self.hidden_keys) is bool, self.name, f"hidden_keys must be true or false, got {self.hidden_keys!r}.")

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    doors = [COLOURS[int(i)] for i in rng.permutation(len(COLOURS))[:self.n_rooms - 1]]
    keys = [int(rng.integers(0, i + 1)) for i in range(self.n_rooms - 1)]
    layout = {"doors": doors, "keys": keys, **({"hidden_keys": True} if self.hidden_keys else {})}
    start = state_from_layout(layout)
    prompt = (f"Reach room {self.n_rooms - 1} in at most {self.max_actions} actions. Act with <act>go east</act>, "
              "<act>go west</act>, <act>take COLOUR key</act> or <act>open COLOUR door</act>.\n" + describe(start))
    return {"prompt": prompt, "answer": ", ".join(shortest_way(start)), "layout": layout}

  def extract_answer(self, completion_text: str) -> Optional[str]:
    """The completion's actions joined by ", ", or None where it has no `<act>`."""
    return ", ".join(parse_actions(completion_text)) or None

  def verify(self, completion_text: str, answer: str) -> float:
    return float(self.extract_answer(completion_text) == answer)

  def demonstration(self, example: Mapping[str, Any]) -> str:
    """The shortest way played out: each act followed by the observation the environment answers."""
    state = state_from_layout(layout_of(example))
    way = shortest_way(state)
    env, text = KeyDoorEnv(max_actions=len(way)), ""   # the last action reaches the goal before time runs out
    for action in way:
      step = env.step([state], [f"<act>{action}{STOP}"])[0]
      text, state = text + f"<act>{action}{STOP}" + step.observation, step.state
    return text


# ----------------------------------------------------------------------------------------------------------
# The reward


@register_reward("key_door")
def make_key_door_reward(task, executor) -> RewardFn:
  """1 where the episode reached the goal (fields["episode"]["success"], the environment's summary), else 0;
  components "success" and "invalid_actions" (the episode's count). `task` and `executor` are unused: the
  episode was played and judged during collection."""
  del task, executor

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    episodes = []
    for row, fields in enumerate(batch.fields):
      if not isinstance(fields.get("episode"), Mapping):
        raise ValueError(f"reward 'key_door': row {row} has no fields['episode'] (the environment's summary of "
                         "a played episode); collect with rl.collector='multi_turn' and "
                         "rl.multi_turn.env='key_door'.")
      episodes.append(fields["episode"])
    success = np.array([bool(e["success"]) for e in episodes], dtype=bool)
    rewards = success.astype(np.float64)
    invalid = np.array([float(e.get("invalid", 0)) for e in episodes], dtype=np.float64)
    return RewardOutput(rewards=rewards, correct=success,
                        components={"success": rewards.copy(), "invalid_actions": invalid}, failures={})
  return reward_fn
