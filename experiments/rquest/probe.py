"""The proposer-SFT probe run after rquest's failed gate, before any new pre-registration: can a short SFT from the
base teach it to write questions (`a=3,b=5:` -> `a*b+2`), which it never does (0 of 320 valid at the gate)?
One SFT run per preset from the base on the proposer's demonstrations (`rquest_questions`, role `propose`),
evaluated greedily on held-out bindings (`eval/accuracy`: the share of valid questions, the task's own checker)
and on the solver's held-out questions (`eval/solve/accuracy`: what the fine-tuning costs the base as solver).

  python launch.py --config=experiments/rquest/probe.py:sft200 --workdir=/tmp/rquest_probe/sft200
"""
from configs import rquest

PRESETS = {"sft50": 50, "sft200": 200,      # SFT steps of 64 demonstrations
           "sft200_wide": 200,            # round 2: bindings over 11 names (5,000 distinct training prompts)
           "sft800": 800}                 # round 3: four times round 1's longer run
WIDE_NAMES = "abcdefghxyz"


def get_config(arg=None):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the rquest probe; choose one of {', '.join(PRESETS)}.")
  c = rquest.get_config("rquest")
  rquest.proposer_sft(c, PRESETS[arg])    # the settings every round shares, and the experiment's proposer stage
  if arg.endswith("_wide"):        # more names, more distinct bindings; `abxy`: the experiment's own prompts
    c.task.kwargs = {"role": "propose", "names": WIDE_NAMES}
    c.data.num_train, c.data.num_test = 5_000, 200
    c.eval.num_examples = c.eval.batch_size = 200
    c.eval.extra_sets = {"abxy": {"names": "abxy"}, "solve": {"role": "solve", "names": "abxy"}}
  return c
