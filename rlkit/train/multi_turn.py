"""The multi-turn collector on the RL stage: `rl.collector=multi_turn` and its section `rl.multi_turn`.

Each prompt's G rows play one episode each in an environment of `AGENT_ENVS` (`rlkit.agents`: the calculator
and the user's tools, `rlkit/agents/tools.py`; the key-and-door rooms, `rlkit/agents/keydoor.py`); the episodes
run token in / token out on the resumable sampler (`rlkit.rollout.multi_turn`), and the rows come back as a
`Rollout` whose observation tokens are attended but not trained, with segment kinds and turn ids for the
segment-level estimators (`rl.advantage=slca`). Each row's example gains fields["episode"] (the environment's
summary of the episode, e.g. its calls or its success), which the environment's reward reads. The collector
reports its counts (tool errors and timeouts, episodes cut by the turn or token budget, policy turns) as
collect/<name>.

`rl.max_new_tokens` is the whole budget of a row's response region, sampled and observation tokens together;
`turn_tokens` caps one policy turn. Renderers: `plain` appends an observation's text as the environment wrote
it; `chat_template` renders the conversation with the model's Hugging Face chat template and appends only its
delta, refusing a template that would change text the model has already seen (`rlkit.rollout.chat`); the
prompt is then the template's rendering of the task's prompt as a user message.

Randomness: the sampler draws from the collect key as single-turn collection does; environment seeds are drawn
from fold_in(key, ENV_STREAM), so a resumed iteration replays the same episodes. One process only for now: the
episode loop reads every row on the host.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.agents import catalog  # noqa: F401  (registers the agent environments, tasks and rewards)
from rlkit.agents.envs import AGENT_ENVS
from rlkit.agents.runner import ToolRunner
from rlkit.core.labels import ROW_SOURCE
from rlkit.core.registry import choice
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.core.types import Rollout
from rlkit.models.tokenizer import bucket_length, pad_left
from rlkit.rollout import chat
from rlkit.rollout.multi_turn import PlainRenderer, TurnBudget, rollout_arrays, run_episodes
from rlkit.rollout.resumable import decode_layout_params, prefill
from rlkit.rollout.stop_strings import StopTable, stop_string_table
from rlkit.train.phases.collect import COLLECTORS, CollectorSpec, Samples

ENV_STREAM = 0x656E7673   # fold_in data of the environments' seeds (distinct from the sampler's streams)
RENDERERS = ("plain", "chat_template")


def multi_turn_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.env = "calculator"          # collector=multi_turn: the environment (registry AGENT_ENVS): calculator |
                                # tools | key_door
  c.env_kwargs = ml_collections.ConfigDict()   # the environment's own parameters (key_door: max_actions)
  c.tools = ""                  # env=tools: your tool functions, "module:function,..." (README, "Your own tools")
  c.max_turns = 4               # collector=multi_turn: policy turns per episode
  c.turn_tokens = 0             # collector=multi_turn: most tokens one policy turn draws (0: rl.max_new_tokens,
                                # the budget of the whole response region, observations included)
  c.tool_timeout_s = 5.0        # collector=multi_turn: wall-time limit of one tool call (0: inline, no limit)
  c.renderer = "plain"          # plain | chat_template (appends the model's chat template's delta per turn)
  c.chat_template = ""          # renderer=chat_template: the folder of the template ("": the model's model.path)
  c.observation_role = "tool"   # renderer=chat_template: the role of the observation messages
  return c


def check(stage, name: str) -> None:
  s, where = stage.multi_turn, f"{name}.multi_turn"
  choice(s.env, AGENT_ENVS, f"{where}.env")
  if s.renderer not in RENDERERS:
    raise ValueError(f"{where}.renderer={s.renderer!r}: choose one of {', '.join(RENDERERS)}.")
  if s.max_turns < 1:
    raise ValueError(f"{where}.max_turns={s.max_turns} must be >= 1.")
  if s.turn_tokens < 0:
    raise ValueError(f"{where}.turn_tokens={s.turn_tokens} must be >= 0 (0: {name}.max_new_tokens).")
  if s.tool_timeout_s < 0:
    raise ValueError(f"{where}.tool_timeout_s={s.tool_timeout_s} must be >= 0 (0: inline, no limit).")
  AGENT_ENVS.get(s.env).check(s, where)


def _check_collector(stage, name: str) -> None:
  check(stage, name)
  if jax.process_count() > 1:
    raise ValueError(f"{name}.collector='multi_turn' runs on one process for now (its episode loop reads every "
                     f"row on the host); run on one host, or use {name}.collector='single_turn'.")


class _ChatRenderer:
  """`rlkit.rollout.chat` behind the collector's renderer interface."""

  def __init__(self, template: chat.ChatTemplate, tokenizer, role: str):
    self.template, self.role = template, role
    self.end_texts = tuple(tokenizer.decode([i], skip_special=False) for i in tokenizer.stop_ids)

  def start(self, prompt: str):
    conv = chat.start(self.template, prompt)
    return conv, conv.text

  def observe(self, conv, sampled: str, observation: str):
    return chat.observe(self.template, conv, sampled, observation, self.end_texts, self.role)


def make_renderer(section, config_model_path: str, tokenizer, stop_strings):
  if section.renderer == "plain":
    return PlainRenderer(tuple(stop_strings))
  folder = section.chat_template or config_model_path
  if not folder or not os.path.isdir(folder):
    raise ValueError(f"rl.multi_turn.renderer='chat_template' needs the template's folder: set "
                     f"rl.multi_turn.chat_template (or model.path) to a Hugging Face folder, got {folder!r}.")
  return _ChatRenderer(chat.ChatTemplate.from_folder(folder), tokenizer, section.observation_role)


def _prompts(batch: dict, rep: np.ndarray, renderer, tokenizer) -> tuple[list, np.ndarray, np.ndarray]:
  """Each row's conversation and its left-padded prompt: the pipeline's tokens, or the renderer's text."""
  started = [renderer.start(batch["prompt"][i]) for i in range(len(batch["answer"]))]
  convs = [started[i][0] for i in rep]
  if started and started[0][1] is None:
    return convs, batch["prompt_tokens"][rep], batch["prompt_mask"][rep]
  ids = [tokenizer.encode(text) for _, text in started]
  tokens, mask = pad_left(ids, bucket_length(max(len(x) for x in ids)), tokenizer.pad_id)
  return convs, tokens[rep], mask[rep]


def make_collector(cfg, cenv) -> Any:
  section, tok = cfg.multi_turn, cenv.tokenizer
  env = AGENT_ENVS.get(section.env).make(section, tok)
  runner = ToolRunner(float(section.tool_timeout_s))
  stop = None
  if env.stop_strings:
    table = stop_string_table(tok, env.stop_strings)
    stop = StopTable(jnp.asarray(table.table), jnp.asarray(table.accept))
  renderer = make_renderer(section, cenv.model_path, tok, env.stop_strings)
  budget = TurnBudget(int(section.max_turns), int(section.turn_tokens or cfg.max_new_tokens))

  def collect(model, params, batch, key, sampling, group_size, put_batch, first_group_id=0, perturb=None):
    n_prompts = len(batch["answer"])
    rep = np.repeat(np.arange(n_prompts), group_size)
    convs, prompt, prompt_mask = _prompts(batch, rep, renderer, tok)
    dev = put_batch({"prompt": prompt, "mask": prompt_mask,
                     "group_ids": (first_group_id + rep).astype(np.int32)})
    examples = [{"prompt": batch["prompt"][i], "answer": batch["answer"][i],
                 "demonstration": batch["demonstration"][i],
                 "fields": dict(batch["fields"][i]) if "fields" in batch else {}} for i in rep]
    seeds = np.asarray(jax.random.randint(jax.random.fold_in(key, ENV_STREAM), (len(rep),), 0, 2**31 - 1))
    states = [env.reset(ex, int(seed)) for ex, seed in zip(examples, seeds)]
    params = decode_layout_params(model, params)
    state = prefill(model, params, dev["prompt"], dev["mask"], key, sampling.max_new_tokens, sampling.pad_id)
    state, episodes = run_episodes(model, params, state, sampling, env, states, convs, runner.map, tok, renderer,
                                   budget, stop, perturb)
    arrays = rollout_arrays(state, episodes, sampling.pad_id)
    extras = {name: jnp.asarray(arrays.pop(name)) for name in list(arrays) if name.startswith(("routed_", "trace_"))}
    arrays = put_batch(arrays)
    rollout = Rollout(prompt=dev["prompt"], prompt_mask=dev["mask"], group_ids=dev["group_ids"], extras=extras,
                      **arrays)
    for ex, st in zip(examples, episodes.states):
      ex["fields"]["episode"] = env.summary(st)
    metrics = dict(episodes.counts, turns=int(episodes.turns.sum()), episodes=len(rep))
    return Samples(rollout, examples, np.full(len(rep), ROW_SOURCE["policy"], np.int32), np.ones(len(rep), bool),
                   metrics=metrics)

  return collect


RL_SECTIONS.add("multi_turn", Section(multi_turn_defaults, lambda stage, name: None,
                                      doc="the multi-turn collector's environment and budgets (collector=multi_turn)"))
COLLECTORS.add("multi_turn", CollectorSpec(make_collector, _check_collector))
