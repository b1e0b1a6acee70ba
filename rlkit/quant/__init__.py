"""rlkit.quant: low-precision formats of the sampler's weights (`rl.sync.quantizer`: registry QUANTIZERS in
rlkit/quant/quantizers.py; int8 in rlkit/quant/int8.py, fp8 in rlkit/quant/fp8.py) and, later, quantized
rollout (FP4, TRACE: methods/systems.md §1)."""
