"""Weights without storage, and one copy of each: optimizing a model whose parameters are on
the meta device, making its prepared weights later, and sharing equal tensors across programs.

    meta          models on the meta device: optimized and planned, never run
    lazy_weights  a meta constant's recipe; a program's prepared weights made one at a time
    interning     one copy of equal compile-time tensors across programs
"""
