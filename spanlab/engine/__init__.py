"""Inference engine: the default CPU model, the shipped chat template, a managed vLLM server, weight sync.

Importing this package is cheap (no torch/transformers/vLLM import); heavy imports happen inside
the functions that need them.
"""
