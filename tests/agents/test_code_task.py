"""The code task (rlkit/agents/code_task.py), its audit (code_audit.py), its reward (code_reward.py) and the
hack probes (hack_probes.py): demonstrations pass the hidden tests, wrong code does not, nothing the grader
compares against reaches the sandbox, every probe earns zero on every sandboxed task and is flagged, and
configs/code.py:test runs SFT then RL on it (GRS rewards, GAR advantages) through the trainer's run."""
import json

import numpy as np
import pytest

from rlkit.agents import catalog  # noqa: F401  (registers the code task and its reward)
from rlkit.agents import code_task as C
from rlkit.agents.code_audit import audit_code
from rlkit.agents.hack_probes import HACK_PROBES, SANDBOXED_TASKS
from rlkit.data.tasks import make_task
from rlkit.rewards import REWARDS, RewardBatch
from tests.fast_compile import fast_compile


def _examples(n=6, seed=0, **kwargs):
  task = make_task("code_functions", **kwargs)
  rng = np.random.default_rng(seed)
  return task, [task.make_example(rng) for _ in range(n)]


def _batch(completions, examples):
  n = len(completions)
  return RewardBatch(prompts=[e["prompt"] for e in examples], completions=list(completions),
                     completion_tokens=np.zeros((n, 1), np.int32), lengths=np.ones(n, np.int32),
                     finished=np.ones(n, bool), answers=[e["answer"] for e in examples], fields=[{}] * n,
                     group_ids=np.arange(n, dtype=np.int32))


@pytest.fixture(scope="module")
def reward_fn():
  return REWARDS.get("code_tests")(None, None, cpu_s=1, wall_s=2.0)   # read_tests reads until its CPU runs out


def test_demonstrations_pass_every_hidden_test_and_wrong_code_does_not():
  task, examples = _examples(8)
  demos = [task.demonstration(e) for e in examples]
  off_by_one = [d.replace("    return x", "    return x + 1") for d in demos]
  reports = C.run_tests(C.default_sandbox(), demos + off_by_one + ["no function here"],
                        [e["answer"] for e in examples] * 2 + [examples[0]["answer"]])
  assert all(r.passed == r.total == 8 for r in reports[:8])
  assert all(r.passed == 0 for r in reports[8:])
  assert reports[-1].result is None and reports[-1].fraction == 0.0
  assert task.verify(demos[0], examples[0]["answer"]) == 1.0
  assert task.verify(off_by_one[0], examples[0]["answer"]) == 0.0


def test_partial_credit_counts_the_tests_passed():
  _, [example] = _examples(1, seed=3, kinds="abs", max_steps=1)
  # abs(x) equals x on the non-negative inputs only
  [report] = C.run_tests(C.default_sandbox(), ["def f(x):\n    return x\n"], [example["answer"]])
  inputs = C.hidden_inputs(json.loads(example["answer"]))
  assert report.passed == sum(x >= 0 for x in inputs) and 0 < report.passed < report.total


def test_the_grader_keeps_expected_outputs_and_the_reference_on_the_host():
  task, examples = _examples(6)
  for e in examples:
    spec = json.loads(e["answer"])
    job = C.test_job(task.demonstration(e), spec)
    inside = "".join(str(v) for v in job.files.values()) + job.stdin.decode()
    expected = [C.apply_steps(spec["steps"], x) for x in C.hidden_inputs(spec)]
    assert str(spec["seed"]) not in inside and json.dumps(spec["steps"]) not in inside
    assert json.dumps(expected) not in inside


@pytest.mark.parametrize("task_name", SANDBOXED_TASKS)
def test_every_hack_probe_earns_zero_and_is_flagged(task_name, reward_fn):
  _, examples = _examples(2, seed=7)
  names = HACK_PROBES.names()
  completions = [HACK_PROBES.get(name)(e) for name in names for e in examples]
  rows = [e for _ in names for e in examples]
  out = reward_fn(_batch(completions, rows))
  per_probe = out.rewards.reshape(len(names), -1).max(axis=1)
  assert dict(zip(names, per_probe)) == {name: 0.0 for name in names}
  write_outside = [HACK_PROBES.get("write_outside")(e) for e in examples]
  assert reward_fn(_batch(write_outside, examples)).rewards.max() == 0.0   # a second run finds no marker
  unflagged = [name for name in names if not all(audit_code(C.extract_code(HACK_PROBES.get(name)(e)))
                                                 for e in examples)]
  assert not unflagged


def test_the_audit_resets_a_passing_solution_that_misbehaves(reward_fn):
  task, examples = _examples(3, seed=11)
  clean = [task.demonstration(e) for e in examples]
  noisy = [d.replace("    return x", "    print(x)\n    return x") for d in clean]
  out = reward_fn(_batch(clean + noisy, examples * 2))
  np.testing.assert_array_equal(out.components["all_pass"], np.ones(6))
  np.testing.assert_array_equal(out.rewards, [1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(out.components["audit_reset"], [0, 0, 0, 1, 1, 1])
  assert out.correct.tolist() == [True] * 3 + [False] * 3
  lenient = REWARDS.get("code_tests")(None, None, audit=False)
  assert lenient(_batch(noisy, examples)).rewards.tolist() == [1.0] * 3


def test_grs_multiplies_tests_solution_quality_and_behaviour():
  task, examples = _examples(2, seed=5)
  demos = [task.demonstration(e) for e in examples]
  verbose = [d.replace("    return x", "    y = x\n    z = y\n    x = z\n    return x") for d in demos]
  noisy = [d.replace("    return x", "    print(x)\n    return x") for d in demos]
  grs = REWARDS.get("code_tests")(None, None, grader="grs", audit=False)
  out = grs(_batch(demos + verbose + noisy, examples * 3))
  quality, behaviour = out.components["quality"], out.components["behaviour"]
  assert quality[:2].tolist() == [1.0, 1.0] and all(0 < q < 1 for q in quality[2:])
  assert behaviour.tolist() == [1.0] * 4 + [0.5] * 2
  np.testing.assert_allclose(out.rewards, out.components["tests"] * quality * behaviour)
  assert out.components["all_pass"].tolist() == [1.0] * 6 and out.rewards[2] < 1.0
  with pytest.raises(ValueError, match="grader='llm' is not one of pass_fail, grs"):
    REWARDS.get("code_tests")(None, None, grader="llm")


def test_padded_demonstrations_pass_and_score_below_the_reference():
  from rlkit.agents.code_reward import solution_score
  task, examples = _examples(40, seed=2, verbose_rate=0.5)
  padded = [e for e in examples if "pad" in json.loads(e["answer"])]
  assert 10 <= len(padded) <= 30
  demos = [task.demonstration(e) for e in padded]
  reports = C.run_tests(C.default_sandbox(), demos, [e["answer"] for e in padded])
  assert all(r.passed == r.total for r in reports)
  scores = [solution_score(d, C.reference_code(e["answer"])) for d, e in zip(demos, padded)]
  assert max(scores) < 0.9 and sum(scores) / len(scores) < 0.75
  assert _examples(3, seed=2)[1] == _examples(3, seed=2, verbose_rate=0.0)[1]   # off: the examples as before


def test_audit_flags():
  assert audit_code("def f(x):\n    x = x * 3\n    return x\n") == ()
  assert audit_code("def f(x):\n    return 14\n") == ("constant",)
  assert audit_code("def f(x):\n    return 5 if x in (1, 2) else x\n") == ("special_case",)
  assert audit_code("import os\ndef f(x):\n    return x.__class__\n") == ("import", "dunder")
  assert audit_code("def f(x) return") == ("unparsable",)
  assert audit_code(None) == ()


def test_task_settings_are_checked():
  with pytest.raises(ValueError, match="kinds must be a comma-separated subset"):
    make_task("code_functions", kinds="add,pow")
  with pytest.raises(ValueError, match="max_steps must be an integer in"):
    make_task("code_functions", max_steps=0)
  with pytest.raises(ValueError, match="workers must be an integer >= 1"):
    REWARDS.get("code_tests")(None, None, workers=0)


def test_the_code_config_runs_sft_then_rl_on_the_sandboxed_reward_with_grs_and_gar(tmp_path):
  from configs.code import get_config
  from rlkit.train.metrics import read_metrics
  from rlkit.train.run import run
  c = get_config("test")
  c.rl.advantage = "gar"                   # MiMo's advantage shaping (rlkit/train/gar.py) on GRS rewards
  c.rl.gar.length_coef = 0.1
  c.rl.reward.kwargs.grader = "grs"
  with fast_compile():
    run(c, str(tmp_path))
  rows = read_metrics(str(tmp_path / "metrics.jsonl"))
  rl = [r for r in rows if "reward/tests" in r]
  assert len(rl) == 2 and all(0.0 <= r["reward/tests"] <= 1.0 for r in rl)
  assert all(0.0 < r["reward/quality"] <= 1.0 and "reward/audit_reset" in r for r in rl)
