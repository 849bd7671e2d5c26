"""vLLM for training and evaluation.

    cpu.py     vLLM's CPU build: the checks, and the weight-reload workaround.
    server.py  the vLLM server's worker extension that reloads weights from a directory
               (``--worker-extension-cls pods_rl.engines.vllm.server.ReloadWeightsExtension``).

Importing this package imports nothing; vLLM is imported where it is used.
"""
