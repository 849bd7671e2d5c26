"""pods-rl's tests. A package, so that pytest puts the repository root (not tests/) on sys.path: otherwise the engine
lanes' directories tests/vllm and tests/verl would be found as namespace packages named `vllm` and `verl` where those
engines are not installed, and TRL would take vLLM for installed."""
