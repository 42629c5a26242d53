"""The plugin's host work per decode step at GPU batch sizes, measured without a model.

On a GPU server a decode step of an 8B model takes ~9-11 ms and vLLM turns async scheduling off
for ``custom_class`` proposers, so whatever the plugin does on the host between two forwards is
added to every step of every request.  This benchmark replays recorded token streams through the
plugin's worker-side path exactly as the engine runs it (:mod:`.lookahead_replay`), beside vLLM's
own ``ngram`` and ``suffix`` proposers on the same streams (:mod:`.anchors`), at 1 to 1,024
requests in flight and short or 8k-token contexts (:mod:`.streams`, :mod:`.served`); ``python -m
benchmarks.host_work`` (:mod:`.__main__`) writes the table.  :mod:`.ab` compares two versions of the
code step for step; :mod:`.engine_check` sets a running engine's own timers beside the replay of the
same requests.
"""
