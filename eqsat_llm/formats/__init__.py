"""Weight formats: what a stored weight is (reference semantics) and the policies that choose
them.

    quant_formats   quantized weights (int8, int4, fp8, ...): quantize, dequantize
    quantization    optimize(quantize=...): which format, which weights, the error measured
    sparse_formats  pruned weights (2:4, zero 16 x 16 blocks), their zeros skipped
    pruning         pruning a model's weights into those structures (tests, benchmarks)
    half_formats    half-precision weights held in float16 / bfloat16
    half            bf16 / fp16 models on the C backend: a graph pass computing in float32
    last_call       one function's last result (a format's integers, then its scales)
"""
