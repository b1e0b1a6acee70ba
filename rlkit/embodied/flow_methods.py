"""Flow-policy RL methods (registry FLOW_METHODS, `<stage>.method` of the `flow_rl` stage): how a flow expert acts
in the environment and what its update differentiates (rlkit/embodied/flow_rl.py).

A method is a `FlowMethod`:
  init(flow_params, flow_cfg, section, obs_dim, key) -> the policy's params (the expert's, plus any head)
  act(params, flow_cfg, section, obs [E, O], key) -> (chunks [E, H, A], extras {name: [E, ...]}, logp [E, R])
      the rollout's draw: what the batch's rows keep (extras) and their log-likelihood under the acting params
  adapter(flow_cfg, section) -> PolicyAdapter over rows whose extras hold the act's extras and "obs"
  steps(section) -> R, the log-likelihood columns per row
  expert(params) -> the flow expert's params (what evaluation and later stages sample from); with_expert and
  expert_path locate it in the params (LoRA adapts the expert alone: rlkit/embodied/flow_lora.py)

  reinflow   ReinFlow's noise-injected chain: R = K denoising steps, each with its own exact ratio
  fpo        FPO: R = 1, logp = -L_CFM at M draws (s, eps) stored per row; acting is the deterministic sampler
             plus Gaussian exploration noise of std `fpo.noise` (the CFM ratio scores the chunk taken)
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from rlkit.core.registry import Registry
from rlkit.embodied.flow_rl import (ChainConfig, fpo_draws, fpo_logp, fpo_policy, init_reinflow, reinflow_policy,
                                    reinflow_sample)
from rlkit.models.flow import sample


class FlowMethod(NamedTuple):
  init: Callable
  act: Callable
  adapter: Callable
  steps: Callable[[Any], int]
  expert: Callable[[Any], Any]
  with_expert: Callable[[Any, Any], Any]      # (params, expert params) -> params with that expert
  expert_path: str                            # the expert's path prefix in the params ('' : the params are it)


FLOW_METHODS: Registry[FlowMethod] = Registry("flow method")


def chain_config(section) -> ChainConfig:
  return ChainConfig(steps=section.chain.steps, sigma_min=section.chain.sigma_min,
                     sigma_max=section.chain.sigma_max, hidden=section.chain.hidden)


def _reinflow_act(params, flow, section, obs, key):
  chunks, links, logp, _ = reinflow_sample(params, flow, chain_config(section), obs, key)
  return chunks, {"chain": links}, logp


FLOW_METHODS.add("reinflow", FlowMethod(
    init=lambda flow_params, flow, section, obs_dim, key: init_reinflow(flow_params, flow, chain_config(section),
                                                                        obs_dim, key),
    act=_reinflow_act,
    adapter=lambda flow, section: reinflow_policy(flow, chain_config(section)),
    steps=lambda section: section.chain.steps,
    expert=lambda params: params["flow"],
    with_expert=lambda params, expert: {**params, "flow": expert},
    expert_path="flow/"))


def _fpo_act(params, flow, section, obs, key):
  k_sample, k_noise, k_draws = jax.random.split(key, 3)
  mean = sample(params, flow, obs, k_sample, section.chain.steps)
  chunks = mean + section.fpo.noise * jax.random.normal(k_noise, mean.shape)
  s, eps = fpo_draws(k_draws, obs.shape[0], section.fpo.draws, flow)
  return chunks, {"actions": chunks, "fpo_s": s, "fpo_eps": eps}, fpo_logp(params, flow, obs, chunks, s, eps)[:, None]


FLOW_METHODS.add("fpo", FlowMethod(
    init=lambda flow_params, flow, section, obs_dim, key: flow_params,
    act=_fpo_act,
    adapter=lambda flow, section: fpo_policy(flow),
    steps=lambda section: 1,
    expert=lambda params: params,
    with_expert=lambda params, expert: expert,
    expert_path=""))
