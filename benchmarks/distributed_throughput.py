"""Throughput of ``posfair embed``: single process vs a 2-worker local Ray pool, and padding waste.

Measured in one run on a sample of the bundled corpus (``--limit`` texts, every
k-th ``section`` row so the length mix is kept), with the bundled MiniLM
(or ``--model``), stock, into fresh stores:

  padding waste (pad tokens / real tokens) of three batchings of the same shards:
    naive       fixed batches of --batch-size in corpus order
    st-sorted   fixed batches after sorting by characters (what sentence-transformers' encode does)
    length      sorted by tokens, batches within --max-batch-tokens padded tokens (posfair embed's default)
  throughput (texts/s, wall time of the job, model already loaded in the driver):
    single      engine=local, length batching, torch threads = all cores  } alternated --repeats
    single-st   engine=local, sentence-transformers' batching (= encode_cached)  } times, fastest kept
    ray-2       engine=ray, 2 workers x 1 thread on a local Ray instance (actor start-up and
                model loading included; Ray start-up reported separately)

Then the per-token cost of the single-process run and, from it, an estimate of the wall
time of a PosIR-sized calibrated run on N GPUs; every assumption is a flag and is printed.

    python benchmarks/distributed_throughput.py                 # 600 texts, ~5 min on 2 idle cores
    python benchmarks/distributed_throughput.py --limit 200 --no-ray
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import numpy as np


def sample_texts(limit: int) -> list[str]:
    from posfair.corpus import load_corpus

    df = load_corpus()  # bundled, unit=section
    step = max(1, len(df) // limit)
    return df.text.tolist()[::step][:limit]


def padding_table(
    raw: np.ndarray, texts: list[str], limit: int, shard_size: int, batch_size: int, max_tokens: int
) -> dict[str, float]:
    from posfair.distributed import fixed_batches, length_aware_batches, padded_tokens

    lengths = np.minimum(raw, limit)
    totals = {"naive": [0, 0], "st-sorted": [0, 0], "length": [0, 0]}
    for s in range(0, len(texts), shard_size):
        lens = lengths[s : s + shard_size]
        chars = np.array([len(t) for t in texts[s : s + shard_size]])
        order = np.argsort(-chars, kind="stable")
        batchings = {
            "naive": fixed_batches(len(lens), batch_size),
            "st-sorted": [order[i : i + batch_size] for i in range(0, len(order), batch_size)],
            "length": length_aware_batches(lens, max_tokens, batch_size),  # as the job batches
        }
        for name, b in batchings.items():
            real, padded = padded_tokens(lens, b)
            totals[name][0] += real
            totals[name][1] += padded
    return {name: (p - r) / r for name, (r, p) in totals.items()} | {
        "real_tokens": totals["naive"][0],
        "truncated": int((raw > lengths).sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the bundled all-MiniLM-L6-v2")
    ap.add_argument("--limit", type=int, default=600)
    ap.add_argument("--shard-size", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-batch-tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each single-process configuration (fastest kept)")
    ap.add_argument("--no-ray", action="store_true")
    # PosIR estimate assumptions
    ap.add_argument(
        "--posir-texts",
        type=float,
        default=310 * 2000,
        help="assumed texts to embed: 310 datasets x 2,000 (docs + queries)",
    )
    ap.add_argument("--posir-tokens-per-text", type=float, default=1500, help="assumed mean tokens per text")
    ap.add_argument(
        "--posir-passes",
        type=float,
        default=10,
        help="assumed encodings of the corpus (stock + calibration settings x models)",
    )
    ap.add_argument(
        "--model-cost-ratio",
        type=float,
        default=25,
        help="assumed per-token cost of the PosIR models relative to this model",
    )
    ap.add_argument(
        "--gpu-speedup", type=float, default=100, help="assumed speed-up of one GPU over this machine's CPU run"
    )
    args = ap.parse_args()

    warnings.filterwarnings("ignore", message=".*truncated.*")
    import torch

    from posfair.distributed import EmbedSpec, embed_texts, ray_available

    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    spec = EmbedSpec(model=args.model, batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens)
    model = spec.load_model("cpu")
    texts = sample_texts(args.limit)
    print(f"load average before: {os.getloadavg()[0]:.1f} (other processes share these cores; numbers move with it)")
    print(f"model {args.model or 'bundled all-MiniLM-L6-v2'} (max_seq_length {model.max_seq_length}), {len(texts)} bundled-corpus texts, "
          f"{cores} cores, shards of {args.shard_size}, batch {args.batch_size}, token budget {args.max_batch_tokens}")  # fmt: skip

    raw = model.token_lengths(texts)
    print("\npadding waste (pad tokens / real tokens) of the same shards:")
    print(f"  {'limit':>6s} {'naive':>8s} {'st-sorted':>10s} {'length':>8s}  (real tokens, texts truncated)")
    # this model's limit; and a long-context model's (tokenizer lengths only: the budget then caps batches)
    for limit in (model.max_seq_length, 8192):
        pad = padding_table(raw, texts, limit, args.shard_size, args.batch_size, args.max_batch_tokens)
        print(
            f"  {limit:6d} {pad['naive']:8.1%} {pad['st-sorted']:10.1%} {pad['length']:8.1%}  ({pad['real_tokens']}, {pad['truncated']})"
        )

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        embed_texts(texts[:16], f"{tmp}/warm-up", spec, model=model, shard_size=16)  # not timed
        st = EmbedSpec(model=args.model, batch_size=args.batch_size, batching="fixed")
        best: dict[str, object] = {}
        for r in range(args.repeats):  # alternate the two single-process runs; keep each one's fastest
            for name, sp in (("single", spec), ("single-st", st)):
                rep = embed_texts(texts, f"{tmp}/{name}-{r}", sp, model=model, shard_size=args.shard_size)
                if name not in best or rep.seconds < best[name].seconds:
                    best[name] = rep
        rows += list(best.items())
        ray_init = None
        if not args.no_ray and ray_available():
            import ray

            t0 = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
            ray_init = time.perf_counter() - t0
            rows.append(
                (
                    "ray-2",
                    embed_texts(
                        texts, f"{tmp}/ray", spec, model=model, shard_size=args.shard_size, engine="ray", workers=2
                    ),
                )
            )
            ray.shutdown()
    print("\nthroughput:")
    for name, r in rows:
        print(f"  {name:10s} {r.texts_per_second:7.1f} texts/s  ({r.encoded} texts in {r.seconds:6.1f} s, {r.workers} worker(s), "
              f"padding waste {r.padding_waste:.1%})")  # fmt: skip
    if ray_init is not None:
        print(f"  (ray.init(num_cpus=2) took {ray_init:.1f} s, not included)")

    print(f"  load average after: {os.getloadavg()[0]:.1f}")
    single = rows[0][1]
    per_token = single.seconds / single.tokens
    print(f"\nper-token cost (single process, {cores} CPU cores): {per_token * 1e6:.1f} us per real token "
          f"({single.seconds / single.padded * 1e6:.1f} us per padded token)")  # fmt: skip
    tokens = args.posir_texts * args.posir_tokens_per_text * args.posir_passes
    gpu_hours_1 = tokens * per_token * args.model_cost_ratio / args.gpu_speedup / 3600
    print("\nPosIR calibrated-run estimate, assumptions (flags):")
    print(
        f"  texts {args.posir_texts:,.0f} x {args.posir_tokens_per_text:,.0f} tokens x {args.posir_passes:g} passes = {tokens:.3g} tokens"
    )
    print(f"  model cost x{args.model_cost_ratio:g} of this model per token; one GPU = x{args.gpu_speedup:g} this CPU run; "
          "linear scaling over GPUs (shards are independent)")  # fmt: skip
    print(
        f"  => {gpu_hours_1:,.0f} GPU-hours;", ", ".join(f"{n} GPUs: {gpu_hours_1 / n:,.1f} h" for n in (1, 8, 64, 256))
    )


if __name__ == "__main__":
    main()
