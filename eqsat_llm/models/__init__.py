"""Models to optimize, built offline (no download): reference workloads, the transformers
families as users load them, and the check of every family against eqsat-llm.

    workloads     a hand-written LLaMA block and tiny Hugging Face models, as test inputs
    model_matrix  transformers model families from small configs with random weights
    families      every causal-LM family transformers ships, built small
    family_check  each of those families against optimize(): compiled, torch steps, refused
"""
