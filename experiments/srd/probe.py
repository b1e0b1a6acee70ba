"""The format-SFT probe for srd's next pre-registration (not a pre-registered run): the base never writes an
`<act>` turn on the key-door task (the gate's episodes were all one action-less turn), so does a short SFT on
2-room layouts' demonstrations (act, observation, act, ...) make it act on the experiment's 3-room layouts?

  python launch.py --config=experiments/srd/probe.py:sft2 --workdir=/tmp/srd_probe/sft2
  python launch.py --config=configs/srd.py:gate --workdir=/tmp/srd_probe/gate_s0 --config.seed=0 \
      --config.model.path=/tmp/srd_probe/sft2          # the gate's frozen 3-room episodes from the SFT model

2 rooms have 4 layouts (one door, its key in room 0): 3 train, 1 held out; PRESETS' steps of SFT_BATCH rows.
"""
from configs import srd
from rlkit.train.config import sft_defaults

SFT_BATCH = 16
# preset -> (SFT steps, peak learning rate); round 2 (`sft2_long`) after round 1's loss stayed at 2.8 nats a token
PRESETS = {"sft2": (60, 3e-4), "sft2_long": (240, 1e-3)}


def get_config(arg=None):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the srd probe; choose one of {', '.join(PRESETS)}.")
  c = srd.get_config("grpo")
  c.stages = ("sft",)
  c.task.kwargs.n_rooms = 2
  c.data.num_train, c.data.num_test = 3, 1
  c.sft = s = sft_defaults()
  s.steps, s.batch_size, s.max_len = PRESETS[arg][0], SFT_BATCH, 320
  s.optimizer.lr, s.optimizer.warmup_steps, s.optimizer.schedule = PRESETS[arg][1], 5, "cosine"
  c.checkpoint.every = 0
  return c
