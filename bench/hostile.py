"""Time and memory of the large inputs a hostile user can give, and of the largest work the
lab's bounds still accept (issue 14): megabyte pastes and uploads, the biggest story a page
draws, the biggest scheduler view it runs, a fetch from a server that drips.

Each case runs in a fresh Python process (so its peak memory is its own): its input is built
first, then the work is timed (wall and CPU) and the growth of the process's peak RSS is taken
as the memory the work held. Prints a markdown table for bench/RESULTS.md ("Hostile input").

    python bench/hostile.py [--case NAME]   # one case, as JSON (what the table runs)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.memory.kv_pool import PoolConfig  # noqa: E402
from lab.scenarios.admission_control import AdmissionControlStory  # noqa: E402
from lab.scenarios.fragmentation import FragConfig, FragmentationStory  # noqa: E402
from lab.serving.chain import batch_chain, chain_plan  # noqa: E402
from lab.serving.config import COMPUTE_POOL, SchedulerConfig  # noqa: E402
from lab.serving.cost_model import cost_model  # noqa: E402
from lab.serving.metrics import summarize  # noqa: E402
from lab.serving.runs import (  # noqa: E402
    ALLOCATORS,
    ReplayTooLong,
    check_work,
    likely_iterations,
    replay_both,
)
from lab.serving.workloads import from_preset, parse_csv  # noqa: E402
from lab.sizing.config_reader import MAX_CONFIG_BYTES, read_hf_config  # noqa: E402
from lab.sizing.model_spec import load_presets  # noqa: E402
from lab.vllm.metrics_text import MAX_TEXT_BYTES, engine_view, parse_prometheus  # noqa: E402
from lab.vllm.startup_log import MAX_LOG_BYTES, parse_startup_log  # noqa: E402

MiB = 1 << 20
V1_LINES = ("(EngineCore_0 pid=1) INFO 09-01 12:00:40 [gpu_worker.py:276] Available KV cache "
            "memory: 54.71 GiB\n(EngineCore_0 pid=1) INFO [kv_cache_utils.py:849] GPU KV cache "
            "size: 448,208 tokens\n(EngineCore_0 pid=1) INFO [kv_cache_utils.py:853] Maximum "
            "concurrency for 131,072 tokens per request: 3.42x\n")


def big(blocks: int = 2048, seats: int = 128, budget: int = 2048, **kw) -> SchedulerConfig:
    return SchedulerConfig(pool=replace(COMPUTE_POOL, num_blocks=blocks, block_size=16),
                           max_num_seqs=seats, max_num_batched_tokens=budget, **kw)


def cost():
    return cost_model(load_presets()["Llama-3.1-8B"], "H100 80 GB")


def largest_replay() -> int:
    """The most ShareGPT-like requests (max_tokens 4096, the largest pool) Replay & metrics
    still accepts."""
    low, high = 2, 20_000
    while low < high:
        mid = (low + high + 1) // 2
        try:
            check_work(from_preset("sharegpt", mid, max_tokens=4096),
                       [big(200_000, 512, 32768, allocator=a) for a in ALLOCATORS])
            low = mid
        except ReplayTooLong:
            high = mid - 1
    return low


def largest_fragmentation() -> FragConfig:
    """The accepted fragmentation settings with the most blocks x likely steps."""
    best, best_work = FragConfig(), 0
    for bs in (1, 2, 4, 8, 16, 32, 64):
        for slots in (768, 1024, 2048, 4096):
            for n in (12, 20, 40):
                for max_out in (160, 512, 1024):
                    try:
                        cfg = FragConfig(PoolConfig(num_blocks=slots // bs, block_size=bs),
                                         num_requests=n, max_output=max_out)
                    except ValueError:
                        continue
                    if cfg.likely_steps() * cfg.pool.num_blocks > best_work:
                        best, best_work = cfg, cfg.likely_steps() * cfg.pool.num_blocks
    return best


# name -> (what it is, build the input, the work on it, which returns a short result)
def _cases():
    def refused(fn):
        def run(x):
            try:
                fn(x)
                return "read"
            except ValueError as err:
                return "refused: " + str(err)[:50]
        return run

    n_replay = largest_replay()
    frag = largest_fragmentation()
    return {
        "log-quadratic": ("2 MiB of 'Maximum concurrency for '",
                          lambda: "Maximum concurrency for " * (MAX_LOG_BYTES // 24),
                          refused(parse_startup_log)),
        "log-v1": ("2 MiB of a v1 log's KV lines", lambda: V1_LINES * (MAX_LOG_BYTES
                                                                       // len(V1_LINES)),
                   refused(parse_startup_log)),
        "metrics-samples": ("4 MiB of 'x 1' samples", lambda: "x 1\n" * (MAX_TEXT_BYTES // 4),
                            refused(lambda t: engine_view(parse_prometheus(t)))),
        "metrics-labels": ("4 MiB of labelled histogram samples", lambda: (
            'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m",engine="0"} 1\n'
            * (MAX_TEXT_BYTES // 80)), refused(lambda t: engine_view(parse_prometheus(t)))),
        "metrics-escapes": ("one label of 2 M escapes", lambda: 'm{a="' + "\\\\" * (
            MAX_TEXT_BYTES // 2 - 8) + '"} 1', refused(parse_prometheus)),
        "config-1mib": ("1 MiB config.json of nested lists", lambda: b"[" * MAX_CONFIG_BYTES,
                        refused(read_hf_config)),
        "csv-80kb": ("80 KB CSV, '5,5' x 20,000", lambda: b"5,5\n" * 20_000,
                     lambda d: f"{len(parse_csv(d)):,} requests"),
        "csv-80kb-step": ("the same CSV in the step-through view (60 at most)",
                          lambda: b"5,5\n" * 20_000,
                          refused(lambda d: parse_csv(d, max_requests=60))),
        "csv-2mib": ("2 MiB CSV, 20,000 padded rows", lambda: (b" " * 95 + b"7,9,0.5\n")
                     * 20_000, lambda d: f"{len(parse_csv(d)):,} requests"),
        "step-view-largest": ("step view: 60 requests of 100+128 on 128 blocks of 8, frames",
                              lambda: AdmissionControlStory(
                                  replace(big(128, 8, 64), pool=replace(
                                      COMPUTE_POOL, num_blocks=128, block_size=8)),
                                  parse_csv("100,128\n" * 60), cost(), 0),
                              lambda story: f"{len(story.frames()):,} frames"),
        "fragmentation-largest": (
            f"fragmentation frames, the largest accepted ({frag.pool.num_blocks} blocks of "
            f"{frag.pool.block_size}, {frag.num_requests} requests, max output "
            f"{frag.max_output}; estimate {frag.likely_steps()} steps)",
            lambda: FragmentationStory(frag, 0), lambda s: f"{len(s.frames()):,} frames"),
        "replay-largest": (
            f"Replay & metrics, the largest accepted: {n_replay:,} ShareGPT-like requests, "
            "max_tokens 4096, 200,000 blocks, 512 seats",
            lambda: from_preset("sharegpt", n_replay, max_tokens=4096),
            lambda r: _replay(r, big(200_000, 512, 32768))),
        "replay-csv-80kb": ("Replay & metrics of the 80 KB CSV (20,000 requests of 5 + 5), "
                            "the page's default pool", lambda: parse_csv(b"5,5\n" * 20_000),
                            lambda r: _replay(r, big())),
        "chain-default": ("Batch chain, the page's default (1,000 ShareGPT-like, 2,048 blocks)",
                          lambda: from_preset("sharegpt", 1000, max_tokens=2048),
                          lambda r: _chain(r, big())),
        "chain-maxima": ("Batch chain at its maxima (20,000 requests, 4096, 200,000 blocks)",
                         lambda: from_preset("sharegpt", 20_000, max_tokens=4096),
                         lambda r: _chain(r, big(200_000, 512, 32768))),
        "fetch-drip": ("fetch from a server dripping a byte every 0.2 s", _drip_server,
                       _fetch),
    }


def _replay(requests, cfg) -> str:
    out = replay_both(requests, cfg, cost(), 0, lambda s: (s.iteration, summarize(s)))
    estimate = sum(likely_iterations(requests, replace(cfg, allocator=a)) for a in ALLOCATORS)
    return f"{sum(i for i, _ in out.values()):,} iterations (estimate {estimate:,})"


def _chain(requests, cfg) -> str:
    try:
        estimate = check_work(requests, chain_plan(cfg))
    except ReplayTooLong as err:
        return "refused: " + str(err)[:60]
    batch_chain(requests, cfg, cost(), 0, 0.05)
    return f"ran (estimate {estimate:.1f} CPU s)"


def _drip_server():
    from tests.hostile_server import hostile_server

    context = hostile_server()
    return context, context.__enter__()


def _fetch(made) -> str:
    from lab.vllm.fetch import fetch_metrics
    from lab.vllm.metrics_text import MetricsError

    context, server = made
    try:
        fetch_metrics(server.url + "/drip")
        return "read"
    except MetricsError:
        return "refused at the deadline"


def run_case(name: str) -> dict:
    what, build, work = _cases()[name]
    made = build()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    wall, cpu = time.perf_counter(), time.process_time()
    result = work(made)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"case": name, "what": what, "result": result, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "memory_mib": round((peak - base) / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.1f} at the start\n")
    print("| case | result | wall s | CPU s | memory MiB |\n|---|---|--:|--:|--:|")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    for name in _cases():
        out = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True,
                             text=True, env=env, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {r['what']} | {r['result']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
              f"{r['memory_mib']:,.0f} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
