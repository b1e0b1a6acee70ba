"""The key-door rooms of the SRD experiment (rlkit/agents/keydoor.py): the shortest way reaches the goal, invalid
and unreadable actions do nothing and are counted, locked doors hold, running out of actions ends with the way
that should have been taken, a turn without an act ends the episode, and the task, its demonstration and the
reward agree with the environment; with hidden keys the rooms show no key colours."""
import ml_collections
import numpy as np
import pytest

from rlkit.agents import keydoor
from rlkit.agents.envs import AGENT_ENVS
from rlkit.data.tasks import TASKS, make_task
from rlkit.rewards.batch import RewardBatch
from rlkit.rewards.verifier import REWARDS

# Door 0 is red, its key in room 0; door 1 is blue, its key in room 0 too (to be carried through door 0).
LAYOUT = {"doors": ["red", "blue"], "keys": [0, 0]}
EXAMPLE = {"prompt": "", "answer": "", "fields": {"layout": LAYOUT}}
WAY = ["take red key", "take blue key", "open red door", "go east", "open blue door", "go east"]


def play(env, state, actions):
  steps = []
  for action in actions:
    steps.append(env.step([state], [f"<act>{action}</act>"], run=None)[0])
    state = steps[-1].state
  return steps


def test_shortest_way_reaches_the_goal():
  env = keydoor.KeyDoorEnv()
  state = env.reset(EXAMPLE, seed=0)
  assert keydoor.shortest_way(state) == WAY
  steps = play(env, state, WAY)
  assert [s.done for s in steps] == [False] * 5 + [True]
  assert steps[0].observation == "<obs>Room 0. A blue key is here. The door east is locked (red).</obs>"
  assert steps[3].observation == "<obs>Room 1. The door east is locked (blue).</obs>"
  assert steps[-1].observation == "<obs>You reached the goal.</obs>"
  assert env.summary(steps[-1].state) == {"success": True, "actions": 6, "invalid": 0, "solution": ", ".join(WAY)}
  assert all(s.counts == {} for s in steps)


def test_random_layouts_have_the_shortest_way_of_three_actions_a_door():
  rng = np.random.default_rng(0)
  for n_rooms in (2, 3, 5):
    task = make_task("key_door", n_rooms=n_rooms, max_actions=12)
    for _ in range(20):
      example = task.make_example(rng)
      way = example["answer"].split(", ")
      assert len(way) == 3 * (n_rooms - 1)
      steps = play(keydoor.KeyDoorEnv(max_actions=12), keydoor.KeyDoorEnv().reset(example, 0), way)
      assert steps[-1].state.success and steps[-1].done


def test_invalid_or_unreadable_actions_do_nothing_and_are_counted():
  env = keydoor.KeyDoorEnv()
  state = env.reset(EXAMPLE, 0)
  for action in ("open red door", "take green key", "go west", "dance"):   # no key yet, no such key, a wall
    step = play(env, state, [action])[0]
    assert step.observation == "<obs>Nothing happens.</obs>" and step.counts == {"invalid_action": 1}
    assert step.state.room == 0 and step.state.held == () and step.state.invalid == 1 and step.state.actions == 1
  assert play(env, state, ["  Take RED   key "])[0].state.held == ("red",)   # case and spaces do not matter


def test_the_door_east_holds_until_opened():
  env = keydoor.KeyDoorEnv()
  steps = play(env, env.reset(EXAMPLE, 0), ["go east", "take red key", "go east", "open red door", "go east"])
  assert [s.state.room for s in steps] == [0, 0, 0, 0, 1]
  assert [s.state.invalid for s in steps] == [1, 1, 2, 2, 2]


def test_out_of_time_tells_the_way():
  env = keydoor.KeyDoorEnv(max_actions=3)
  steps = play(env, env.reset(EXAMPLE, 0), ["take red key", "go west", "open red door"])
  assert [s.done for s in steps] == [False, False, True]
  assert steps[-1].observation == f"<obs>Out of time. The way was: {', '.join(WAY)}.</obs>"
  assert env.summary(steps[-1].state)["success"] is False
  assert env.step([steps[-1].state], ["<act>go east</act>"])[0].observation is None   # over: nothing more


def test_a_turn_without_an_act_ends_the_episode():
  env = keydoor.KeyDoorEnv()
  state = env.reset(EXAMPLE, 0)
  step = env.step([state], ["I give up."], run=None)[0]
  assert step.observation is None and step.state == state and step.counts == {}


def test_reset_is_a_pure_function_of_the_example():
  env = keydoor.KeyDoorEnv()
  assert env.reset(EXAMPLE, 0) == env.reset(dict(EXAMPLE), 7)
  assert env.reset(EXAMPLE, 0) != env.reset({"fields": {"layout": {"doors": ["red", "blue"], "keys": [0, 1]}}}, 0)
  with pytest.raises(ValueError, match="keys"):
    env.reset({"fields": {"layout": {"doors": ["red", "blue"], "keys": [0, 2]}}}, 0)   # key beyond its door
  with pytest.raises(ValueError, match="no 'layout' field"):
    env.reset({"prompt": "", "answer": "", "fields": {"other": 1}}, 0)


def test_task_examples_are_deterministic_and_show_the_first_room():
  task = TASKS.get("key_door")()
  a = [task.make_example(np.random.default_rng(3)) for _ in range(2)]
  assert a[0] == a[1]
  others = [task.make_example(np.random.default_rng(s))["layout"] for s in range(20)]
  assert len({str(o) for o in others}) > 1
  start = keydoor.state_from_layout(a[0]["layout"])
  assert a[0]["prompt"].endswith(keydoor.describe(start)) and a[0]["prompt"].startswith("Reach room 2")
  assert task.verify("<act>" + "</act><act>".join(a[0]["answer"].split(", ")) + "</act>", a[0]["answer"]) == 1.0
  assert task.verify("<act>go east</act>", a[0]["answer"]) == 0.0
  with pytest.raises(ValueError, match="max_actions"):
    make_task("key_door", n_rooms=4, max_actions=8)


def test_demonstration_replays_to_the_goal():
  task = make_task("key_door", n_rooms=4, max_actions=9)
  example = task.make_example(np.random.default_rng(1))
  demo = task.demonstration(example)
  actions = keydoor.parse_actions(demo)
  assert ", ".join(actions) == example["answer"] and task.verify(demo, example["answer"]) == 1.0
  env = keydoor.KeyDoorEnv(max_actions=9)
  steps = play(env, env.reset({"fields": {"layout": example["layout"]}}, 0), actions)
  assert "".join(f"<act>{a}</act>{s.observation}" for a, s in zip(actions, steps)) == demo
  assert steps[-1].state.success


def test_env_registry_reads_env_kwargs():
  spec = AGENT_ENVS.get("key_door")
  assert spec.make(ml_collections.ConfigDict(), None).max_actions == 8
  section = ml_collections.ConfigDict({"env_kwargs": {"max_actions": 4}})
  assert spec.make(section, None).max_actions == 4 and spec.make(section, None).stop_strings == ("</act>",)
  with pytest.raises(ValueError, match="rl.multi_turn.env_kwargs.max_actions"):
    spec.check(ml_collections.ConfigDict({"env_kwargs": {"max_actions": 0}}), "key_door")


def test_reward_reads_the_episode_success():
  reward = REWARDS.get("key_door")(None, None)

  def batch(fields):
    n = len(fields)
    return RewardBatch(prompts=[""] * n, completions=[""] * n, completion_tokens=np.zeros((n, 1), np.int32),
                       lengths=np.ones(n, np.int32), finished=np.ones(n, bool), answers=[""] * n, fields=fields,
                       group_ids=np.zeros(n, np.int32))
  out = reward(batch([{"episode": {"success": True, "invalid": 0}}, {"episode": {"success": False, "invalid": 3}}]))
  np.testing.assert_array_equal(out.rewards, [1.0, 0.0])
  np.testing.assert_array_equal(out.correct, [True, False])
  np.testing.assert_array_equal(out.components["invalid_actions"], [0.0, 3.0])
  with pytest.raises(ValueError, match="rl.collector='multi_turn'"):
    reward(batch([{}]))


def test_hidden_keys_show_no_colour_so_a_key_for_a_later_door_must_be_guessed():
  hidden = {**LAYOUT, "hidden_keys": True}
  env = keydoor.KeyDoorEnv()
  state = env.reset({"fields": {"layout": hidden}}, 0)
  assert keydoor.describe(state) == ("<obs>Room 0. A key is here. A key is here. The door east is locked (red)."
                                     "</obs>")
  assert keydoor.shortest_way(state) == WAY                  # the way, and the way told at the end, name colours
  # Door 1's colour is not in sight from room 0: a wrong guess does nothing and costs an action.
  steps = play(env, state, ["take red key", "take green key", "take blue key"])
  assert steps[0].observation == "<obs>Room 0. A key is here. The door east is locked (red).</obs>"
  assert steps[1].observation == "<obs>Nothing happens.</obs>" and steps[2].state.held == ("red", "blue")
  out = play(keydoor.KeyDoorEnv(max_actions=3), state, ["take red key", "take green key", "open red door"])[-1]
  assert out.done and "The way was: " + ", ".join(WAY) in out.observation
  assert play(env, state, WAY)[-1].state.success
  with pytest.raises(ValueError, match="hidden_keys"):
    keydoor.state_from_layout({**LAYOUT, "hidden_keys": "yes"})


def test_the_hidden_keys_task_keeps_the_layouts_and_hides_the_colours():
  plain, hidden = make_task("key_door"), make_task("key_door", hidden_keys=True)
  a, b = plain.make_example(np.random.default_rng(5)), hidden.make_example(np.random.default_rng(5))
  assert b["layout"] == {**a["layout"], "hidden_keys": True} and b["answer"] == a["answer"]
  assert "hidden_keys" not in a["layout"]                    # the plain task's examples are unchanged
  assert " key is here" in b["prompt"] and not any(f"{c} key is here" in b["prompt"] for c in keydoor.COLOURS)
  assert not any(f"A {c} key" in hidden.demonstration(b) for c in keydoor.COLOURS)
  with pytest.raises(ValueError, match="hidden_keys"):
    make_task("key_door", hidden_keys=1)
