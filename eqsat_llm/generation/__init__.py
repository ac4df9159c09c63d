"""Text generation on compiled programs, and starting it from a checkpoint.

    generator       Generator and generate: a decode step and a prefill chunk, compiled once
    kv_cache        the step program: a causal LM over a static KV cache it owns as buffers
    checkpoint      a save_pretrained directory: its model on the meta device, its weights
    program_cache   optimized programs of meta-device models, on disk
    warm_start      a second start of Generator.from_pretrained that builds no model
    parallel_start  a checkpoint's two programs optimized in child processes
    progress        a progress line on a terminal for long work
"""
