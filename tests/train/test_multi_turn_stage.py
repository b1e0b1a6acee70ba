"""The multi-turn collector on the RL stage: the agentic preset trains from its config, a run interrupted in the
middle of an episode loop resumes to the uninterrupted run's metrics (environment state included), and every
`rl.multi_turn` field acts."""
import dataclasses

import pytest

from configs.agentic import get_config
from rlkit.agents.envs import AGENT_ENVS, EnvSpec, Step
from rlkit.train import stages
from rlkit.train.metrics import read_metrics, without_timings
from tests.fast_compile import fast_compile


@dataclasses.dataclass(frozen=True)
class Counter:
  seed: int
  turns: int = 0


class SeededEnv:
  """Answers every turn with a number drawn from the episode's seed (so a resume must rebuild the same episodes)
  until the episode's `answers` (env_kwargs) are spent."""
  stop_strings = ("e",)

  def __init__(self, answers: int):
    self.answers = answers

  def reset(self, example, seed):
    return Counter(seed)

  def step(self, states, turns, run):
    out = []
    for st in states:
      st = dataclasses.replace(st, turns=st.turns + 1)
      obs = None if st.turns > self.answers else f"<{(st.seed // 7 ** st.turns) % 100}>"
      out.append(Step(obs, st, {"answered": int(obs is not None)}))
    return out

  def summary(self, st):
    return {"calls": [], "turns": st.turns}


AGENT_ENVS.add("seeded_test", EnvSpec(lambda section, tok: SeededEnv(int(section.env_kwargs.get("answers", 2)))))


def _config(**overrides):
  c = get_config("test")
  c.rl.multi_turn.env = "seeded_test"
  c.rl.multi_turn.env_kwargs.answers = 2
  for key, value in overrides.items():
    target, *path = key.split(".")
    node = c.rl
    for part in [target, *path][:-1]:
      node = node[part]
    node[[target, *path][-1]] = value
  return c


class _Interrupted(Exception):
  pass


def test_a_run_killed_inside_an_episode_loop_resumes_to_the_uninterrupted_metrics(tmp_path, monkeypatch):
  from rlkit.train.run import run
  config = _config()
  with fast_compile():
    run(config, str(tmp_path / "ref"))
    save, step = stages.save, SeededEnv.step
    saved = []

    def save_and_mark(ctx, state, global_step, meta, force):
      save(ctx, state, global_step, meta, force)
      saved.append(global_step)

    def dies_in_step_two(self, states, turns, run_):
      if saved == [1]:                 # iteration 2, after its first turn: the episodes are half played
        raise _Interrupted()
      return step(self, states, turns, run_)
    monkeypatch.setattr(stages, "save", save_and_mark)
    monkeypatch.setattr(SeededEnv, "step", dies_in_step_two)
    with pytest.raises(_Interrupted):
      run(config, str(tmp_path / "cut"))
    monkeypatch.setattr(SeededEnv, "step", step)
    run(config, str(tmp_path / "cut"))
  reference = read_metrics(str(tmp_path / "ref" / "metrics.jsonl"))
  rows = [r for r in reference if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2]
  assert all(r["collect/answered"] > 0 and r["grad_norm"] > 0 for r in rows)
  assert without_timings(read_metrics(str(tmp_path / "cut" / "metrics.jsonl"))) == without_timings(reference)


TEMPLATE = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% if m.role == 'assistant' %}<eos>{% endif %}\n"
            "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


def _collect(model, **fields):
  import jax
  import numpy as np
  from rlkit.models.tokenizer import CharTokenizer, pad_left
  from rlkit.train.multi_turn import make_collector
  from rlkit.train.phases.collect import CollectEnv, sampling_config
  tok = CharTokenizer()
  cfg = _config(max_new_tokens=64, **{f"multi_turn.{k}": v for k, v in fields.items()}).rl
  collect = make_collector(cfg, CollectEnv(tok))
  prompts = ["What is 1 plus 2?\n", "What is 3 times 4?\n"]
  tokens, mask = pad_left([tok.encode(p) for p in prompts], 24, tok.pad_id)
  batch = {"prompt": prompts, "answer": ["add(1,2)|3", "mul(3,4)|12"], "demonstration": ["", ""],
           "prompt_tokens": tokens, "prompt_mask": mask}
  net, params = model
  s = collect(net, params, batch, jax.random.key(5), sampling_config(cfg, tok), 2, lambda b: b)
  return (np.asarray(s.rollout.prompt).tolist(), np.asarray(s.rollout.response).tolist(), s.metrics,
          [e["fields"]["episode"] for e in s.examples])


def test_every_multi_turn_field_acts(tmp_path):
  import jax
  from rlkit.models.transformer import Transformer, TransformerConfig, init_params
  from rlkit.models.tokenizer import CharTokenizer
  cfg = TransformerConfig(vocab_size=CharTokenizer().vocab_size, hidden_size=32, intermediate_size=48,
                          num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
  model = (Transformer(cfg), init_params(cfg, jax.random.key(0)))
  (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
  chat = {"renderer": "chat_template", "chat_template": str(tmp_path)}
  with fast_compile():
    base = _collect(model)
    flips = {"env": {"env": "calculator"}, "env_kwargs": {"env_kwargs.answers": 0},
             "max_turns": {"max_turns": 1}, "turn_tokens": {"turn_tokens": 3}, "renderer+chat_template": chat}
    for name, flip in flips.items():
      assert _collect(model, **flip) != base, name
    chatted = _collect(model, **chat)
    assert chatted[2]["answered"] > 0
    assert _collect(model, **chat, observation_role="user") != chatted, "observation_role"
  assert base[2]["answered"] > 0
  prompt = CharTokenizer().decode(chatted[0][0])
  assert prompt == "[user]What is 1 plus 2?\n[assistant]", prompt   # the template's rendering is the prompt


def test_the_readme_user_tool_example_runs_as_written(tmp_path, monkeypatch):
  """The README's `my_tools.py` and its launch command, literally: the tool module on the path, the config
  validates with it, and a missing function is a config error naming it."""
  import os
  import re
  import shlex
  from tests.cli_in_process import launch_in_process
  readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
  section = readme[readme.index("## Agents and tools"):readme.index("## Loading a Hugging Face model")]
  (tmp_path / "my_tools.py").write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
  monkeypatch.syspath_prepend(str(tmp_path))
  command = [c for c in re.findall(r"```bash\n(.*?)```", section, re.S) if "my_tools" in c][0]
  argv = shlex.split(command.replace("\\\n", " "))[2:]
  code, out, err = launch_in_process(*argv, "--validate_only")
  assert code == 0 and "config OK" in out, err[-2000:]
  import my_tools
  assert my_tools.lookup("paris") == "France"
  code, out, err = launch_in_process(*[a.replace("my_tools:lookup", "my_tools:nope") for a in argv],
                                     "--validate_only")
  assert code != 0 and "my_tools:nope" in out + err
