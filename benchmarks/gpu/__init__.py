"""The plugin's GPU code on a GPU without vLLM: exactness, kernel and forward timings
(``python -m benchmarks.gpu.check``)."""
