"""What the generative stages generate (registry GEN_DATA, `<stage>.data`): the data a class- or prompt-conditioned
flow generator is pretrained on (rlkit/diffusion/gen_pretrain_stage.py), and the conditions the RL stage prompts
it with (rlkit/diffusion/gen_rl_stage.py).

A dataset is a `GenData`, built from the stage's section by the registered factory:
  dim                    D: a sample is D floats (the flow network's chunk [1, D])
  conditions             C: prompts or classes; the network sees the condition's one-hot as its observation
  arrays(n, seed)        (x [M, D] float32, cond [M] int32): the pretraining set (n fresh draws, or a fixed set)
  quality(samples, seed) {name: float} for conditional samples [C, S, D]: how close they are to the data

  toy2d    rlkit/diffusion/toy2d.py's prompt task (methods/embodied.md §1.4): C = `toy2d.prompts` mixtures of
           `toy2d.modes` Gaussians in the plane, one of them rare; D = 2. quality: mmd, the mean over prompts of
           the squared MMD (rlkit/diffusion/sample_distance.py) to 512 draws of that prompt's mixture
  digits   scikit-learn's 8x8 digits (rlkit/diffusion/digits.py): 1797 images, pixels scaled to [-1, 1], D = 64,
           C = 10 classes, the whole set. quality: class_accuracy, the share of samples the digit classifier
           assigns to the class asked for
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import ml_collections
import numpy as np

from rlkit.core.registry import Registry
from rlkit.diffusion import digits
from rlkit.diffusion.sample_distance import mean_mmd2
from rlkit.diffusion.toy2d import PromptTask, prompt_task


class GenData(NamedTuple):
  dim: int
  conditions: int
  arrays: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
  quality: Callable[[np.ndarray, int], dict]


GEN_DATA: Registry[Callable[[ml_collections.ConfigDict], GenData]] = Registry("generative dataset")


def toy2d_defaults() -> ml_collections.ConfigDict:
  """The toy2d task's fields (rlkit/diffusion/toy2d.py's `prompt_task`)."""
  c = ml_collections.ConfigDict()
  c.seed = 0                    # draws the prompts' mode angles: the task itself, not the run's randomness
  c.prompts = 8                 # conditions
  c.modes = 3                   # Gaussians per prompt, the first one rare
  c.radius = 2.0                # the modes' circle
  c.std = 0.3                   # each mode's standard deviation
  c.rare_weight = 0.1           # the rare mode's weight (the reward points at it)
  return c


def toy2d_task(section, gamma: float = 0.0) -> PromptTask:
  t = section.toy2d
  return prompt_task(seed=t.seed, prompts=t.prompts, modes=t.modes, radius=t.radius, std=t.std,
                     rare_weight=t.rare_weight, gamma=gamma)


@GEN_DATA.register("toy2d")
def toy2d_data(section) -> GenData:
  task = toy2d_task(section)

  def arrays(n, seed):
    cond, x = task.sample(np.random.default_rng(seed), n)
    return x.astype(np.float32), cond.astype(np.int32)

  def quality(samples, seed):
    rng = np.random.default_rng(seed)
    return {"mmd": mean_mmd2(samples, [m.sample(rng, 512) for m in task.mixtures])}
  return GenData(dim=2, conditions=len(task.mixtures), arrays=arrays, quality=quality)


@GEN_DATA.register("digits")
def digits_data(section) -> GenData:
  def arrays(n, seed):
    del n, seed                 # the fixed set
    return digits.digit_arrays()

  def quality(samples, seed):
    del seed
    params, _ = digits.classifier()
    c, s, d = samples.shape
    guess = np.argmax(np.asarray(digits.classifier_logits(params, np.clip(samples.reshape(c * s, d), -1, 1))), -1)
    return {"class_accuracy": float(np.mean(guess == np.repeat(np.arange(c), s)))}
  return GenData(dim=digits.PIXELS, conditions=digits.CLASSES, arrays=arrays, quality=quality)
