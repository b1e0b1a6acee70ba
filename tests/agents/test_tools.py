"""Tool environments and the tool task's reward: calls run under a time limit and every failure is an error
observation the policy reads; execution and the summary are scored apart, penalties and judge noise on the
summary only."""
import time

import numpy as np
import pytest

from rlkit.agents.runner import ToolRunner
from rlkit.agents.tool_task import make_tool_task_reward, summary_value
from rlkit.agents.tools import CALCULATOR, ToolEnv, load_tools, parse_call
from rlkit.core.labels import SEGMENT_KINDS
from rlkit.rewards import REWARDS, RewardBatch


def lookup(key):
  return {"paris": "France", "rome": "Italy"}[key]


def hang(*args):
  time.sleep(60)


@pytest.fixture(scope="module")
def runner():
  with ToolRunner(timeout_s=1.0) as r:
    yield r


def test_parse_call_reads_literals():
  assert parse_call("<call>mul(23, 4)</call>") == ("mul", (23, 4))
  assert parse_call("x <call>lookup('paris')</call><") == ("lookup", ("paris",))
  assert parse_call("<call>f()</call>") == ("f", ())
  assert parse_call("<call>mul(23,4</call>") is None


def test_calls_become_results_or_error_observations_within_the_time_limit(runner):
  env = ToolEnv({**CALCULATOR, "lookup": lookup, "hang": hang})
  turns = ["<call>mul(23,4)</call><", "<call>lookup('rome')</call>", "<call>lookup('oslo')</call>",
           "<call>hang()</call>", "<call>div(1,2)</call>", "<call>mul(2</call>", "<say>done</say>",
           "<call>mul('a',9)</call>"]
  t0 = time.perf_counter()
  steps = env.step([env.reset({}, 0) for _ in turns], turns, runner.map)
  # the 60 s hang costs its 1 s limit, then a fresh worker (which imports this module again: seconds)
  assert time.perf_counter() - t0 < 15
  obs = [s.observation for s in steps]
  assert obs[0] == "<result>92</result>" and obs[1] == "<result>Italy</result>"
  assert obs[2].startswith("<error>KeyError") and obs[3] == "<error>timeout</error>"
  assert obs[4].startswith("<error>unknown tool 'div'") and obs[5].startswith("<error>malformed call")
  assert obs[6] is None                            # no call: the turn was the answer
  assert obs[7].startswith("<error>TypeError")     # the calculator takes integers only
  assert [s.counts for s in steps] == [{}, {}, {"tool_error": 1}, {"tool_timeout": 1}, {"unknown_tool": 1},
                                       {"malformed_call": 1}, {}, {"tool_error": 1}]
  summary = env.summary(steps[0].state)
  assert summary == {"calls": [{"tool": "mul", "args": [23, 4], "result": "92", "error": None}]}


def test_the_calculator_opens_the_summary_after_its_answer(runner):
  """The corpus writes "</result><say>" (BPE's "><" spans the tags): the calculator's answer opens the summary."""
  from rlkit.agents.envs import AGENT_ENVS
  env = AGENT_ENVS.get("calculator").make(None, None)
  step, = env.step([env.reset({}, 0)], ["<call>add(2,3)</call>"], runner.map)
  assert step.observation == "<result>5</result><say>"


def test_user_tools_load_by_name_and_bad_names_are_clear():
  tools = load_tools("tests.agents.test_tools:lookup")
  assert tools["lookup"]("paris") == "France"
  for spec, words in (("nomodule", "not 'module:function'"), ("tests.agents.test_tools:missing", "cannot load"),
                      ("", "is empty")):
    with pytest.raises(ValueError, match=words):
      load_tools(spec)


def _batch(completions, calls, answers):
  n = len(completions)
  return RewardBatch(prompts=["q"] * n, completions=completions, completion_tokens=np.zeros((n, 1), np.int32),
                     lengths=np.ones(n, np.int32), finished=np.ones(n, bool), answers=answers,
                     fields=[{"episode": {"calls": c}} for c in calls], group_ids=np.zeros(n, np.int32))


def _call(tool, args, result=None, error=None):
  return {"tool": tool, "args": list(args), "result": result, "error": error}


def test_tool_task_scores_execution_and_summary_apart():
  good = _call("mul", (23, 4), "92")
  batch = _batch(
      ["<call>mul(23,4)</call><result>92</result><say>23 times 4 is 92.</say>",   # right call, right summary
       "<call>mul(23,4)</call><result>92</result><say>23 times 4 is 91.</say>",   # right call, wrong summary
       "<call>mul(23,5)</call><result>115</result><say>it is 92</say>",           # wrong call, right number
       "<call>mul(2</call><error>malformed</error><call>mul(23,4)</call><result>92</result><say>92</say>",
       "<say>92</say>"],                                                           # no call
      [[good], [good], [_call("mul", (23, 5), "115")], [_call("", (), None, "malformed"), good], []],
      ["mul(23,4)|92"] * 5)
  out = REWARDS.get("tool_task")(None, None)(batch)
  np.testing.assert_array_equal(out.components["execution"], [1, 1, 0, 0, 1 * 0])
  np.testing.assert_array_equal(out.components["summary_rule"], [1, 0, 1, 1, 1])
  np.testing.assert_array_equal(out.components["penalty"], [0, 0, 0, -1.0, 0])   # a failed call + an extra one
  np.testing.assert_array_equal(out.correct, [True, False, False, False, False])
  seg = out.segment_rewards
  np.testing.assert_array_equal(seg[:, SEGMENT_KINDS["tool_call"]], out.components["execution"])
  np.testing.assert_array_equal(seg[:, SEGMENT_KINDS["summary"]], out.components["summary"])
  np.testing.assert_allclose(out.rewards, seg.sum(axis=1))


def test_the_judge_noise_lands_on_the_summary_only_and_is_a_function_of_the_text():
  batch = _batch(["<say>92</say>"] * 2 + ["<say>92.</say>"], [[_call("mul", (23, 4), "92")]] * 3,
                 ["mul(23,4)|92"] * 3)
  clean = make_tool_task_reward(None, None)(batch)
  noisy = make_tool_task_reward(None, None, judge_noise=1.0, judge_seed=3)(batch)
  again = make_tool_task_reward(None, None, judge_noise=1.0, judge_seed=3)(batch)
  np.testing.assert_array_equal(noisy.rewards, again.rewards)
  np.testing.assert_array_equal(noisy.components["execution"], clean.components["execution"])
  delta = noisy.components["summary"] - clean.components["summary"]
  assert delta[0] == delta[1] != delta[2] and np.all(delta != 0)
  np.testing.assert_array_equal(noisy.correct, clean.correct)     # correctness is the rule, before the noise


def test_summary_value_and_a_row_without_an_episode():
  assert summary_value("<say>3 plus 4 is 7.</say>") == 7 and summary_value("no say 7") is None
  batch = _batch(["x"], [[]], ["add(3,4)|7"])
  batch.fields[0].clear()
  with pytest.raises(ValueError, match="rl.collector='multi_turn'"):
    make_tool_task_reward(None, None)(batch)
