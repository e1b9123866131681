"""Quantizers and packers that make real checkpoint tensors from float weights."""
