"""vLLM entry points and the patch table: where vLLM calls into the plugin."""
