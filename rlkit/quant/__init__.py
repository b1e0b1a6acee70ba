"""rlkit.quant: low-precision formats of the sampler's weights (`rl.sync.quantizer`: registry QUANTIZERS in
rlkit/quant/quantizers.py; int8 in int8.py, fp8 in fp8.py, FP4 numerics in fp4.py and its weights in
fp4_weight.py) and TRACE's rollout-guided FP4 rounding of the MoE experts (trace.py; methods/systems.md §1)."""
