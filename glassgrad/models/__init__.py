"""Whole models built from `glassgrad.nn` layers: `gpt2` (GPT-2, with Hugging Face weights and KV-cached generation).

In: a config (or a weights file). Out: an object whose `__call__` maps input tensors to output tensors, whose
attributes are named so that `glassgrad.nn.state.get_state_dict` gives the published checkpoint's keys.
"""
from glassgrad.models.gpt2 import GPT2, Generator, GPT2Config

__all__ = ["GPT2", "GPT2Config", "Generator"]
