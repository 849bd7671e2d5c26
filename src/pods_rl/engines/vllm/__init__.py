"""vLLM for training and evaluation: CPU-build checks (cpu.py), the server's weight-reload extension (server.py),
evaluation generation (generation.py). Importing this package imports nothing."""
