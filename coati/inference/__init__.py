"""Generation engines in processes of their own. `vllm_server` runs inside vLLM's environment (it imports only the
standard library, vLLM and what comes with it); `vllm` is the trainer's side, which starts, feeds and stops it.
This package itself imports nothing heavy."""
