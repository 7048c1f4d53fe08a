"""Builders of the assets: run in the assets venv (numpy, gguf, tokenizers, Pillow), never in a stack."""
