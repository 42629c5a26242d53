"""The benchmark harness without an engine: prompt sets, method specs, report arithmetic."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from benchmarks import prompts as P
from benchmarks.cli import main
from benchmarks.methods import parse_method
from benchmarks.report import build_rows, source_table, step_breakdown, to_csv, to_markdown, write_report

# -- prompts ---------------------------------------------------------------------------


def test_stdlib_code_prompts_are_reproducible_and_show_signature_and_docstring():
    a = P.code_completion_prompts(12)
    b = P.code_completion_prompts(12)
    assert [p.prompt_id for p in a] == [p.prompt_id for p in b]
    assert len(a) == 12 and len({p.prompt_id for p in a}) == 12
    assert len({p.prompt_id.split(":")[1] for p in a}) == 12  # one per module first
    for p in a:
        assert p.category == "code"
        assert "```python\ndef " in p.text and '"""' in p.text and p.text.rstrip().endswith("```")


def test_specbench_categories(tmp_path):
    rows = [
        {"question_id": i, "category": c, "turns": [f"q{i}", "second"]}
        for i, c in enumerate(["writing", "coding", "coding", "qa", "summarization", "math"] * 3)
    ]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    mt = P.category_prompts("mt_bench", 4, path)
    assert [p.text for p in mt] == ["q0", "q5", "q1", "q6"]  # round robin over the MT-bench categories
    code = P.category_prompts("code", 4, path)
    assert [p.prompt_id.split(":")[0] for p in code] == ["specbench", "stdlib", "specbench", "stdlib"]
    assert [p.text for p in P.category_prompts("qa", 10, path)] == ["q3", "q9", "q15"]
    with pytest.raises(P.PromptSetError, match="unknown prompt category"):
        P.category_prompts("nope", 1, path)
    with pytest.raises(P.PromptSetError, match="--specbench"):
        P.category_prompts("qa", 1, tmp_path / "missing.jsonl")


def test_sharegpt_reader_stops_at_the_truncated_record(tmp_path):
    records = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "first question here"}, {"from": "gpt", "value": "x"}],
        },
        {"id": "b", "conversations": [{"from": "gpt", "value": "starts with the model"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "hi"}]},  # too short
        {"id": "d", "conversations": [{"from": "human", "value": "x" * 3000 + " long but fine"}]},
    ]
    text = "[" + ", ".join(json.dumps(r) for r in records) + ', {"id": "e", "conversations": [{"from": "hu'
    path = tmp_path / "ShareGPT.json"
    path.write_text(text)
    got = P.sharegpt_prompts(10, path)
    assert [p.prompt_id for p in got] == ["sharegpt:a", "sharegpt:d"]
    assert P.sharegpt_prompts(1, path)[0].text == "first question here"


def test_packaged_sharegpt_is_readable():
    got = P.sharegpt_prompts(40)
    assert len(got) == 40 and all(p.text for p in got)


class _Tok:
    chat_template = None

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}


def test_tokenize_drops_long_prompts_instead_of_cutting():
    ps = [P.Prompt("a", "x", "abc"), P.Prompt("b", "x", "abcdefgh")]
    assert [(p.prompt_id, ids) for p, ids in P.tokenize(ps, _Tok(), 5)] == [("a", [97, 98, 99])]


# -- methods ---------------------------------------------------------------------------


def test_method_specs():
    assert parse_method("none").speculative_config is None
    ngram = parse_method("ngram")
    assert ngram.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert parse_method('ngram:{"num_speculative_tokens": 8}').speculative_config["num_speculative_tokens"] == 8
    la = parse_method('lookahead:{"window_size": 4, "lookup_context": 3}')
    assert la.speculative_config == {"method": "lookahead", "window_size": 4, "lookup_context": 3}
    assert la.label == "lookahead W4 N5 G7 lookup_context=3"
    suffix = parse_method("suffix")
    assert suffix.speculative_config == {"method": "suffix"}
    with pytest.raises(ValueError, match="unknown method"):
        parse_method("eagle")
    with pytest.raises(ValueError, match="JSON object"):
        parse_method("ngram:[1]")
    with pytest.raises(Exception, match="window_size"):
        parse_method('lookahead:{"window_size": 65}')


def test_bench_cli_rejects_a_bad_method_before_starting_anything(capsys):
    assert main(["--methods", "none", "medusa"]) == 2
    assert "unknown method 'medusa'" in capsys.readouterr().err


# -- report ----------------------------------------------------------------------------


def _run(outputs, wall, gen=0, acc=0, drafted=0, drafts=0, steps=10, propose=0.0, latency=(1.0,)):
    return {
        "wall_s": wall,
        "ttft_s": [0.1] * len(outputs),
        "latency_s": [latency[i % len(latency)] for i in range(len(outputs))],
        "outputs": outputs,
        "counters": {
            "vllm:generation_tokens": gen,
            "vllm:spec_decode_num_accepted_tokens": acc,
            "vllm:spec_decode_num_draft_tokens": drafted,
            "vllm:spec_decode_num_drafts": drafts,
        },
        "timers": {"step_s": 0.5, "step_calls": steps, "propose_s": propose, "verify_s": 0.01},
        "extra": {},
    }


def _raw():
    same, other = [[1, 2, 3, 4]] * 2, [[1, 2, 3, 4], [1, 2, 9, 9]]
    return {
        "plan": {
            "model": "m",
            "max_tokens": 4,
            "repeats": 2,
            "max_model_len": 64,
            "enforce_eager": True,
            "categories": ["code"],
        },
        "environment": {"date": "d", "cpus": 2, "vllm": "0.32.0", "torch": "t", "vllm_lookahead": "0.1.0"},
        "workloads": [
            {"name": "code", "kind": "category", "concurrency": 1},
            {"name": "sharegpt@c4", "kind": "concurrency", "concurrency": 4},
        ],
        "methods": [
            {
                "method": "no-spec",
                "skip_reason": None,
                "runs": {
                    "code": [_run(same, 1.0, gen=8, steps=8), _run(same, 2.0, gen=8, steps=8)],
                    "sharegpt@c4": [_run(same, 1.0, gen=8, latency=(1.0, 1.0))],
                },
            },
            {"method": "suffix", "skip_reason": "not installed", "runs": {}},
            {
                "method": "lookahead",
                "skip_reason": None,
                "runs": {
                    "code": [
                        _run(other, 0.5, gen=8, acc=4, drafted=40, drafts=4, steps=4, propose=0.004),
                        _run(other, 0.5, gen=8, acc=4, drafted=40, drafts=4, steps=4, propose=0.004),
                    ],
                    "sharegpt@c4": [_run(same, 2.0, gen=8, latency=(0.5, 2.0))],
                },
            },
        ],
    }


def test_rows_compute_mat_acceptance_speedup_spread_and_exactness():
    rows = {(r.method, r.workload): r for r in build_rows(_raw())}
    ref, la = rows[("no-spec", "code")], rows[("lookahead", "code")]
    assert ref.mat == 1.0 and ref.speedup == 1.0 and (ref.exact, ref.compared) == (4, 4)
    assert la.mat == pytest.approx(16 / 8)  # 16 generated, 8 accepted over both repeats -> 8 forwards
    assert la.acceptance == pytest.approx(8 / 80)
    assert la.draft_per_step == pytest.approx(10.0)
    assert la.tok_s == pytest.approx(16.0)
    assert (la.speedup_min, la.speedup_max) == (pytest.approx(2.0), pytest.approx(4.0))  # per repeat: 16/8, 16/4
    assert la.speedup == pytest.approx(3.0)
    assert (la.exact, la.compared) == (2, 4)  # per repeat: one of two identical
    assert (la.requests, la.tokens) == (4, 16)
    assert la.propose_ms == pytest.approx(1.0)  # 8 ms over 8 steps
    assert rows[("lookahead", "sharegpt@c4")].speedup == pytest.approx(0.5)
    # the closed wave ends with its slowest request; requests wait 1.25 s on average against 1.0
    assert rows[("lookahead", "sharegpt@c4")].latency_speedup == pytest.approx(1.0 / 1.25)
    assert la.latency_speedup == pytest.approx(1.0)
    assert ("suffix", "code") not in rows


def test_markdown_csv_and_plots(tmp_path):
    raw = _raw()
    rows = build_rows(raw)
    md = to_markdown(raw, rows)
    assert "**suffix: not run** -- not installed" in md
    assert "| lookahead | code | 2.00 | 10.0% | 10.0 | 16.0 | 3.00x [2.00, 4.00] | 1.00x |" in md
    assert md.rstrip().endswith("no speculation.") and "| 2/4 |" in md
    table = list(csv.reader(io.StringIO(to_csv(rows))))
    assert table[0][:3] == ["method", "workload", "concurrency"] and len(table) == 1 + len(rows)
    paths = write_report(raw, tmp_path)
    for key in ("markdown", "csv", "speedup_vs_concurrency", "mat_per_category"):
        assert (tmp_path / paths[key].split("/")[-1]).stat().st_size > 0
    assert not math.isnan(rows[0].tok_s)


def _timed(run, engine_s, forward, sample, shapes):
    """Give a run the step timers of the breakdown table: shapes = {tokens: (calls, seconds)}."""
    run["timers"].update({"engine_step_s": engine_s, "engine_step_calls": 4.0, "step_s": forward, "sample_s": sample})
    for tokens, (calls, sec) in shapes.items():
        run["timers"][f"forward{tokens}_calls"], run["timers"][f"forward{tokens}_s"] = calls, sec
    return run


def test_step_breakdown_splits_engine_steps_and_compares_equal_shapes():
    raw = _raw()
    ref, la = raw["methods"][0]["runs"]["code"], raw["methods"][2]["runs"]["code"]
    for r in ref:
        _timed(r, 0.4, 0.3, 0.04, {1: (4, 0.3)})
    for r in la:
        _timed(r, 0.8, 0.6, 0.12, {1: (1, 0.05), 5: (3, 0.55)})
    lines = step_breakdown(raw)
    assert "**code (batch 1)**" in lines and "**4 in flight**" not in lines  # no step timers there
    header = next(line for line in lines if line.startswith("| method | engine step ms"))
    assert header.endswith("| forward @ 1 | forward @ 5 |")  # the shapes seen most, in token order
    row = {
        line.split(" | ")[0][2:]: line
        for line in lines
        if line.startswith("| no-spec") or line.startswith("| lookahead")
    }
    # no-spec: 8 engine steps over 0.8 s -> 100 ms: forward 75, sample 10, rest 15; 75 ms per 1-token forward
    assert row["no-spec"].startswith("| no-spec | 100.0 | 75.0 | 10.0 | ") and row["no-spec"].endswith(
        "| 15.0 | 75.0 (8) | - |"
    )
    # lookahead: 200 ms per step = 150 forward + 30 sample + 20 rest; 50 ms at 1 token, 183.3 at 5
    assert row["lookahead"].endswith("| 20.0 | 50.0 (2) | 183.3 (6) |")
    assert "## Where a step's time goes" in to_markdown(raw, build_rows(raw))


def test_step_breakdown_is_left_out_for_results_without_step_timers():
    assert step_breakdown(_raw()) == []


def test_step_timers_keep_forward_time_per_shape():
    from types import SimpleNamespace

    from benchmarks.driver import StepTimers

    timers = StepTimers()
    forward = timers._wrap("step", lambda runner, out: None)
    for tokens in (1, 5, 5):
        forward(object(), SimpleNamespace(total_num_scheduled_tokens=tokens))
    snap = timers.snapshot()
    assert (snap["step_calls"], snap["forward1_calls"], snap["forward5_calls"]) == (3, 1.0, 2.0)
    assert snap["forward1_s"] + snap["forward5_s"] == pytest.approx(snap["step_s"])
    timers._wrap("verify", lambda runner, logits: None)(object(), SimpleNamespace(total_num_scheduled_tokens=9))
    assert "forward9_calls" not in timers.snapshot()  # only the forward is kept per shape


def test_report_only_rebuilds_from_json(tmp_path, capsys):
    src = tmp_path / "results.json"
    src.write_text(json.dumps(_raw()))
    assert main(["--report-only", str(src), "--out", str(tmp_path / "out")]) == 0
    assert "## Batch 1, per prompt category" in capsys.readouterr().out
    assert (tmp_path / "out" / "results.csv").exists()


def test_workloads_never_reuse_a_prompt(tmp_path):
    from benchmarks.suite import Plan, build_workloads

    rows = [{"question_id": i, "category": "qa", "turns": [f"question {i}"]} for i in range(20)]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    plan = Plan(
        model="m",
        methods=["none"],
        categories=["qa"],
        prompts_per_category=3,
        repeats=3,
        concurrency=[1, 4],
        min_sweep_requests=2,
        requests_per_slot=1,
        specbench=str(path),
    )
    workloads = build_workloads(plan, _Tok())
    seen = [p.prompt_id for w in workloads for rep in w.prompts for p in rep]
    assert len(seen) == len(set(seen)) == 3 * 3 + 3 * (2 + 4)
    qa = workloads[0]
    assert [len(rep) for rep in qa.token_ids] == [3, 3, 3] and qa.num_requests == 9
    assert [w.name for w in workloads] == ["qa", "sharegpt@c1", "sharegpt@c4"]


def test_rounds_alternate_the_method_order():
    from benchmarks.suite import round_orders

    a, b, c = (parse_method(m) for m in ("none", "ngram", "lookahead"))
    orders = round_orders([a, b, c], 3)
    assert orders == [[a, b, c], [c, b, a], [a, b, c]]
    assert round_orders([a, b], 1) == [[a, b]]


def test_bench_options_are_not_abbreviated(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--requests", "7"])  # would otherwise mean --requests-per-slot
    assert exc.value.code == 2


def test_batch1_mat_counts_forwards_not_drafts_accepted_past_the_end():
    # vLLM also counts drafts accepted on a request's last step that fall past max_tokens (or the stop
    # token) and are discarded: 6 "accepted" per repeat, but 8 tokens came out of 4 forwards.
    raw = _raw()
    la = raw["methods"][2]["runs"]
    la["code"] = [_run([[1, 2, 3, 4], [1, 2, 9, 9]], 0.5, gen=8, acc=6, drafted=40, drafts=4, steps=4)] * 2
    la["sharegpt@c4"] = [_run([[1, 2, 3, 4]] * 2, 2.0, gen=8, acc=6, drafted=10, drafts=2)]
    rows = {(r.method, r.workload): r for r in build_rows(raw)}
    assert rows[("lookahead", "code")].mat == pytest.approx(16 / 8)
    assert rows[("lookahead", "code")].acceptance == pytest.approx(8 / 80)
    assert rows[("lookahead", "sharegpt@c4")].mat == pytest.approx(8 / 2)  # several in flight: counters


def test_temperature_and_concurrency_variants_get_their_own_prompts(tmp_path):
    from benchmarks.suite import Plan, build_workloads

    rows = [{"question_id": i, "category": "qa", "turns": [f"question {i}"]} for i in range(40)]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    plan = Plan(
        model="m",
        methods=["none"],
        categories=["qa"],
        prompts_per_category=2,
        repeats=2,
        concurrency=[],
        specbench=str(path),
        temperatures=[0.0, 0.7],
        category_concurrency=[1, 4],
    )
    workloads = build_workloads(plan, _Tok())
    assert [(w.name, w.concurrency, w.temperature, w.category) for w in workloads] == [
        ("qa", 1, 0.0, "qa"),
        ("qa@T0.7", 1, 0.7, "qa"),
        ("qa@c4", 4, 0.0, "qa"),
        ("qa@c4@T0.7", 4, 0.7, "qa"),
    ]
    seen = [p.prompt_id for w in workloads for rep in w.prompts for p in rep]
    assert len(seen) == len(set(seen)) == (2 + 2 + 4 + 4) * 2  # at c4, one request per slot at least
    assert [len(w.prompts[0]) for w in workloads] == [2, 2, 4, 4]
    # the default plan picks the same prompts as before the variants existed (old results replay)
    default = build_workloads(
        Plan(
            model="m",
            methods=["none"],
            categories=["qa"],
            prompts_per_category=2,
            repeats=2,
            concurrency=[],
            specbench=str(path),
        ),
        _Tok(),
    )
    assert [p.prompt_id for rep in default[0].prompts for p in rep] == [
        p.prompt_id for rep in workloads[0].prompts for p in rep
    ]


def test_sampled_workloads_are_summarised_and_not_compared_token_by_token():
    raw = _raw()
    raw["plan"]["temperatures"] = [0.0, 0.7]
    raw["workloads"].append(
        {"name": "code@T0.7", "kind": "category", "concurrency": 1, "temperature": 0.7, "category": "code"}
    )
    raw["methods"][0]["runs"]["code@T0.7"] = [_run([[5, 6]], 1.0, gen=2, steps=2)]
    raw["methods"][2]["runs"]["code@T0.7"] = [_run([[7, 8]], 0.5, gen=2, acc=1, drafted=4, drafts=1, steps=1)]
    rows = {(r.method, r.workload): r for r in build_rows(raw)}
    sampled = rows[("lookahead", "code@T0.7")]
    assert (sampled.exact, sampled.compared, sampled.temperature, sampled.category) == (0, 0, 0.7, "code")
    assert sampled.speedup == pytest.approx(2.0) and sampled.mat == pytest.approx(2.0)
    md = to_markdown(raw, build_rows(raw))
    assert "## Summary: MAT / speedup over no speculation, per category" in md
    assert "**1 in flight, temperature 0.7**" in md and "| code | 2.00 / 2.00x |" in md
    assert "## Batch 1, temperature 0.7, per prompt category" in md and "| sampled |" in md


def test_source_table_shows_where_lookaheads_accepted_tokens_came_from():
    raw = _raw()
    counters = {
        "lookahead_steps": 4,
        "lookahead_accepted_tokens": 4,
        "lookahead_draft_tokens": 40,
        "lookahead_window_steps": 2,
        "lookahead_window_tokens": 30,
        "lookahead_accepted_prompt": 1,
        "lookahead_accepted_output": 1,
        "lookahead_accepted_window": 2,
    }
    for run in raw["methods"][2]["runs"]["code"]:
        run["counters"].update(counters)
    lines = source_table(raw)
    # over both repeats: 8 steps, 8 accepted (2 from prompt, 2 output, 4 window), window on 4 steps with 60 nodes
    assert "| lookahead | code | 8 | 2.00 | 10.0 | 50% | 15.0 | 0.25 (25%) | 0.25 (25%) | 0.50 (50%) |" in lines
    assert "| no-spec |" not in "\n".join(lines)
    assert "## Where lookahead's accepted tokens came from" in to_markdown(raw, build_rows(raw))
    assert source_table(_raw()) == []  # results without lookahead counters: no table


def test_summary_gives_the_latency_speedup_where_several_requests_are_in_flight():
    raw = _raw()
    raw["workloads"].append({"name": "code@c4", "kind": "category", "concurrency": 4, "category": "code"})
    raw["methods"][0]["runs"]["code@c4"] = [_run([[1, 2, 3, 4]] * 2, 1.0, gen=8, latency=(1.0, 1.0))]
    raw["methods"][2]["runs"]["code@c4"] = [_run([[1, 2, 3, 4]] * 2, 1.0, gen=8, acc=4, latency=(0.5, 1.0))]
    md = to_markdown(raw, build_rows(raw))
    assert "**4 in flight, greedy**" in md
    assert "| code | 2.00 / 1.00x / 1.33x |" in md  # same wall, requests wait 0.75 s against 1.0
    assert "| code | 2.00 / 3.00x |" in md  # batch 1: no latency column


def test_engines_run_with_fixed_malloc_thresholds_unless_the_caller_chose_an_allocator():
    from benchmarks.engine_env import FIXED_MALLOC, engine_env

    env, line = engine_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", **FIXED_MALLOC} and all(f"{k}={v}" in line for k, v in FIXED_MALLOC.items())
    for chosen in (
        {"LD_PRELOAD": "/lib/libjemalloc.so.2"},
        {"MALLOC_ARENA_MAX": "2"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
    ):
        env, line = engine_env({"PATH": "/bin", **chosen})
        assert env == {"PATH": "/bin", **chosen} and line.startswith("as given") and next(iter(chosen.values())) in line
    env, line = engine_env({"PATH": "/bin", "LD_PRELOAD": ""}, inherit=True)
    assert env == {"PATH": "/bin", "LD_PRELOAD": ""} and "--inherit-malloc" in line


def test_report_names_the_engines_allocator(tmp_path):
    raw = _raw()
    raw["environment"]["engine_allocator"] = "glibc malloc, MALLOC_MMAP_THRESHOLD_=33554432"
    assert "engines: glibc malloc, MALLOC_MMAP_THRESHOLD_=33554432." in to_markdown(raw, build_rows(raw))


def test_a_short_category_keeps_every_variants_size_and_reuses_prompts_only_across_rounds(tmp_path):
    from benchmarks.prompts import PromptSetError
    from benchmarks.suite import Plan, build_workloads

    def workloads_for(n: int, repeats: int = 3):
        rows = [{"question_id": i, "category": "qa", "turns": [f"question {i}"]} for i in range(n)]
        path = tmp_path / f"q{n}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows))
        plan = Plan(
            model="m",
            methods=["none"],
            categories=["qa"],
            prompts_per_category=2,
            repeats=repeats,
            concurrency=[],
            specbench=str(path),
            category_concurrency=[1, 4],
        )
        return build_workloads(plan, _Tok())

    # 10 prompts for 3 rounds x (2 + 4): every variant keeps its size, each round's prompts distinct
    workloads = workloads_for(10)
    assert [[len(rep) for rep in w.prompts] for w in workloads] == [[2, 2, 2], [4, 4, 4]]
    for r in range(3):
        in_round = [p.prompt_id for w in workloads for p in w.prompts[r]]
        assert len(in_round) == len(set(in_round)) == 6
    every = {p.prompt_id for w in workloads for rep in w.prompts for p in rep}
    assert len(every) == 10  # all of them used, some in two rounds
    # fewer than one round needs: every variant shrinks alike, a round's prompts still distinct
    small = workloads_for(5)
    assert [[len(rep) for rep in w.prompts] for w in small] == [[1, 1, 1], [3, 3, 3]]
    assert all(len({p.prompt_id for w in small for p in w.prompts[r]}) == 4 for r in range(3))
    with pytest.raises(PromptSetError, match="fewer than its 2"):
        workloads_for(1)
