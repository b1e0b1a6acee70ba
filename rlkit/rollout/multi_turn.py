"""Multi-turn rollouts, token in / token out: the policy writes a turn, the environment answers, and the answer
enters the live KV cache as tokens; the trainer later scores exactly these tokens.

One collect call runs a batch of episodes in lockstep on one `DecodeState` (`rlkit.rollout.resumable`):

  prefill the prompts
  repeat while an episode goes on:
    decode_until     every live row writes one turn: it ends at a stop token, a stop string (the environment's
                     `stop_strings`, matched at the token level: `rlkit.rollout.stop_strings`), the turn budget
                     `turn_tokens`, or a full buffer
    env.step         the turns' text (host side, batched) -> an observation per row, or the end of its episode
    append           each observation's tokens into the cache (no prefix is recomputed); a row without one
                     stays stopped

The renderer turns an observation into the text to append: `PlainRenderer` appends it as is (less what the
turn's last token already wrote: a stop string can end inside a token, as "</call>" inside "><"), and the
chat-template renderer (`rlkit.rollout.chat`) appends the template's delta after checking that the template
leaves every earlier turn's text unchanged. Earlier tokens are never re-tokenised.

What the record says of each token (`to_rollout`): the policy's tokens are trained (`loss_mask`) with the
sampler's log-probs; observation tokens are attended, never trained, with log-prob 0. Segment kinds follow the
released SLCA implementation: the policy's tokens of every turn but a row's last are `tool_call`, the last
turn's are `summary`, appended ones `observation`; `turn_ids` number a row's turns from 0 (an observation
belongs to the turn it answers); `num_calls` counts its policy turns. Rows are compacted (each row's tokens
moved to the front, the holes left by rows that waited dropped), so the response region reads like a
single-turn one: `lengths` tokens, then padding.

An episode ends when the environment returns no observation (`finished` if its last turn ended with a stop),
with a final observation (`Step.done`, finished), at `max_turns` policy turns, or when an observation does not
fit in the buffer (both not finished, counted as `turn_limit` and `context_full`).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.labels import SEGMENT_KINDS
from rlkit.models.tokenizer import pad_left
from rlkit.rollout.resumable import DecodeState, append, decode_until
from rlkit.rollout.sampler import SamplingConfig
from rlkit.rollout.stop_strings import StopTable


OBS_WIDTH = 8   # observation appends are padded to a multiple of this many columns (bounds their compilations)


@dataclasses.dataclass(frozen=True)
class TurnBudget:
  max_turns: int     # policy turns per episode
  turn_tokens: int   # most tokens one policy turn draws


class Renderer(Protocol):
  def start(self, prompt: str) -> tuple[Any, Optional[str]]:
    """(the row's conversation, the prompt text to encode; None: the data pipeline's prompt tokens)."""

  def observe(self, conv: Any, sampled: str, observation: str) -> tuple[Any, str]:
    """(the conversation after the turn `sampled` (its text with special tokens) and the environment's
    `observation`, the text to append)."""


@dataclasses.dataclass(frozen=True)
class PlainRenderer:
  """Observations appended as written. The turn ends once a stop string is written, possibly inside a token
  that carries on into the observation's opening (the "<" of "><" after "</call>"): that much of the
  observation is already in the context and is not appended again."""
  stop_strings: tuple[str, ...] = ()

  def start(self, prompt: str) -> tuple[None, None]:
    return None, None

  def observe(self, conv: None, sampled: str, observation: str) -> tuple[None, str]:
    ends = [sampled.rfind(s) + len(s) for s in self.stop_strings if s in sampled]
    tail = sampled[max(ends):] if ends else ""
    return conv, observation[len(tail):] if tail and observation.startswith(tail) else observation


@dataclasses.dataclass
class Episodes:
  """What the host knows of the batch's episodes after a collect call (one entry per row)."""
  states: list                # each row's environment state
  turn_of: np.ndarray         # [B, C] int32 the turn of each buffer column (-1: unused)
  turns: np.ndarray           # [B] int32 policy turns taken
  finished: np.ndarray        # [B] bool, the episode ended by the environment after a stop
  counts: collections.Counter  # environment counts (tool errors, timeouts) and the collector's cut reasons


def run_episodes(model, params, state: DecodeState, sampling: SamplingConfig, env, states: list, convs: list,
                 run: Callable, tokenizer, renderer: Renderer, budget: TurnBudget,
                 stop_strings: Optional[StopTable], perturb=None) -> tuple[DecodeState, Episodes]:
  """Runs the episodes of the prefilled `state` (one per row, environment states `states`, renderer
  conversations `convs`) to their ends (module docstring). `params` as the resumable pieces take them."""
  b, cap = state.tokens.shape
  turn_of = np.full((b, cap), -1, np.int32)
  turns = np.zeros(b, np.int32)
  live, finished = np.ones(b, bool), np.zeros(b, bool)
  counts = collections.Counter()
  while live.any():
    used = int(state.used)
    if used >= cap:
      counts["context_full"] += int(live.sum())
      break
    # The budget is static in the jitted decode: one value for every call (the loop itself stops at a full buffer),
    # not the shrinking room left, which would compile the decode again for each new value.
    state = decode_until(model, params, state, sampling, budget=budget.turn_tokens, perturb=perturb,
                         stop_strings=stop_strings)
    tokens, mask, done, now = jax.device_get((state.tokens, state.mask, state.done, state.used))
    now = int(now)
    drew = mask[:, used:now]
    turn_of[:, used:now] = np.where(drew, turns[:, None], -1)
    rows = np.flatnonzero(live)
    sampled = [tokens[r, used:now][drew[r]].tolist() for r in rows]
    steps = env.step([states[r] for r in rows], [tokenizer.decode(t) for t in sampled], run)
    if len(steps) != len(rows):
      raise ValueError(f"the environment answered {len(steps)} of {len(rows)} turns; return one Step per turn.")
    answers = {}
    for r, ids, step in zip(rows, sampled, steps):
      states[r] = step.state
      counts.update(step.counts)
      turns[r] += 1
      if step.observation is None:
        live[r], finished[r] = False, bool(done[r])
        continue
      if turns[r] >= budget.max_turns and not step.done:
        live[r] = False
        counts["turn_limit"] += 1
        continue
      convs[r], text = renderer.observe(convs[r], tokenizer.decode(ids, skip_special=False), step.observation)
      answers[r] = (tokenizer.encode(text), step.done)
    # An observation must fit, with room for the next turn's first token unless it ends the episode.
    free = cap - now
    for r in [r for r, (ids, final) in answers.items() if len(ids) + (not final) > free]:
      del answers[r]
      live[r] = False
      counts["context_full"] += 1
    if answers:
      # Widths rounded up to a multiple of OBS_WIDTH (within the room left): `append` compiles once per width.
      # The padding never takes the column a continuing row's next turn needs.
      longest = max(1, max(len(ids) for ids, _ in answers.values()))
      room = free - (not all(final for _, final in answers.values()))
      width = max(longest, min(-(-longest // OBS_WIDTH) * OBS_WIDTH, room))
      obs, obs_mask = pad_left([answers[r][0] if r in answers else [] for r in range(b)], width,
                               tokenizer.pad_id)
      state = append(model, params, state, obs, obs_mask)
      turn_of[:, now:now + width] = np.where(obs_mask, turns[:, None] - 1, -1)
      for r, (_, final) in answers.items():
        if final:
          live[r], finished[r] = False, True
    # Only the rows whose episode goes on decode next: a row cut by its turn budget is still live in the state.
    state = state.replace(done=jnp.asarray(~live))
  return state, Episodes(states, turn_of, turns, finished, counts)


def compact_order(mask: np.ndarray) -> np.ndarray:
  """[B, C] column order that moves each row's attended columns to the front, in order (holes after)."""
  return np.argsort(~mask, axis=1, kind="stable")


def rollout_arrays(state: DecodeState, episodes: Episodes, pad_id: int) -> dict[str, np.ndarray]:
  """The response-region arrays of a `Rollout` (host, compacted; module docstring; `pad_id` after each row's
  end), and `routed_experts` / `routed_weights` for an MoE state (its prompt slots, then the compacted response
  columns)."""
  tokens, logprobs, mask, appended = jax.device_get((state.tokens, state.logprobs, state.mask, state.appended))
  turn_of = episodes.turn_of
  sampled = mask & ~appended
  last = np.max(np.where(sampled, turn_of, -1), axis=1)
  kinds = np.where(appended, SEGMENT_KINDS["observation"],
                   np.where(sampled & (turn_of < last[:, None]), SEGMENT_KINDS["tool_call"],
                            np.where(sampled, SEGMENT_KINDS["summary"], SEGMENT_KINDS["pad"])))
  order = compact_order(mask)
  take = lambda x: np.take_along_axis(x, order, axis=1)   # noqa: E731
  mask_c = take(mask)
  out = dict(response=np.where(mask_c, take(tokens), pad_id),
             response_mask=mask_c, logprobs=np.where(mask_c, take(logprobs), 0.0).astype(np.float32),
             loss_mask=take(sampled), segment_ids=take(kinds).astype(np.int32),
             turn_ids=np.where(mask_c, take(turn_of), 0).astype(np.int32),
             lengths=mask.sum(axis=1).astype(np.int32), finished=episodes.finished.copy(),
             num_calls=episodes.turns.astype(np.int32))
  p = state.prompt_len
  for name, routed in jax.device_get(state.routed or {}).items():
    routed = np.asarray(routed)
    idx = order.reshape(order.shape + (1,) * (routed.ndim - 2))
    out[name] = np.concatenate([routed[:, :p], np.take_along_axis(routed[:, p:], idx, axis=1)], 1)
  return out

