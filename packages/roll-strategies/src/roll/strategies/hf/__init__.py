"""hf_infer: forward passes and generation with plain transformers models (one device per worker).

The reference inference backend: slow next to vLLM / SGLang, but exact and dependency-free, so it is the one
tests, debugging and small CPU runs use. Importing this package does not import torch or transformers.
"""
