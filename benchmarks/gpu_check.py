"""The GPU check (issue 43): correctness against the float64 reference, time and peak memory, throughput.

One prepared script for one lent GPU (about 8 minutes on one H100; PyTorch, transformers 5.x and
sentence-transformers 6.x there, nothing downloadable: every model is built here from a seeded random
config, with a word-level tokenizer made in code). It writes one JSON (``--out``) and prints one table.

(a) correctness: seeded tiny models of every attention kind tests/tiny_models.py builds (BERT, XLM-R,
    ModernBERT's sliding windows, Qwen3's grouped-query causal attention), each with its own pooling
    (CLS / last token: the stock kernel + one row) and mean pooling (every row: on CUDA the per-basket
    path of posfair.calibration.cuda_rows where it is exact, else the tiled one), float32 and bfloat16,
    against tests/reference.py's float64 forward on the CPU.  The error of an embedding is
    ``||fast - ref|| / ||ref||``; :data:`TOLERANCE` states the bound per dtype; the path that ran is counted.
(b) time and peak memory, calibrated / plain, interleaved in one process (the order alternating by round,
    median of the timed rounds): an XLM-R-shaped 12x384 encoder, a Qwen3-0.6B-shaped one (28 layers,
    hidden 1,024, 16 heads: Qwen3 itself is causal, and a causal model's every row takes the tiled path)
    and Qwen3-0.6B's own shape for the last-token row; bfloat16; ``--lengths`` tokens; batch 1 and a real
    batch (``--batch-tokens`` tokens in all).  Peak memory = the model's weights + the forward's peak
    allocation above what was allocated before it (so the two pooling instances of one model do not count
    each other's weights).  Targets (issue 43): every row <= 1.3x time and <= 1.1x peak memory at 8,192 and
    32,768 tokens; the pooling row <= 1.05x time.
(c) throughput: ``posfair audit`` documents / s and ``posfair embed`` texts / s on the XLM-R-shaped model
    (wall time of the command, model loading included).

A time budget (``--budget-s``) skips what would not fit, and says so in the table and the JSON.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json               # on the GPU machine
    python benchmarks/gpu_check.py --device cpu --small --out /tmp/g.json  # CPU, small sizes (tests run this)

On CPU the every-row rows of (a) run the CUDA path's code (its switch turned on, the fused CPU path off), so
the check cannot rot between lent machines.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "src", ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}  # ||fast - ref|| / ||ref|| per embedding, at most
TARGETS = {"every-row": (1.30, 1.10), "pool-row": (1.05, None)}  # (time, peak memory) ratios at >= 8192 tokens
CAL = dict(basket_size=128, layers=0.5, strength=0.5)  # benchmarks/calibration_speed.py's
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega river stone light market policy court season engine signal harbour").split()  # fmt: skip
SPECIAL = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer made in code (nothing downloaded): specials at BERT's ids, WORDS from 1000."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = dict(SPECIAL, **{w: 1000 + i for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 101), ("[SEP]", 102)]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"],
    ).save_pretrained(folder)  # fmt: skip


def build(config, folder: Path, dtype=torch.float32, seed: int = 0) -> Path:
    from transformers import AutoModel

    torch.manual_seed(seed)
    AutoModel.from_config(config).eval().to(dtype).save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def texts(n: int, words: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(words // 3, words))) for _ in range(n)]


class PathCount:
    """Counts the per-basket CUDA path's calls (``posfair.calibration.cuda_rows.basket_attention``)."""

    def __enter__(self):
        import posfair.calibration.cuda_rows as cr

        self.mod, self.inner, self.calls = cr, cr.basket_attention, 0

        def spy(*a, **kw):
            self.calls += 1
            return self.inner(*a, **kw)

        cr.basket_attention = spy
        return self

    def __exit__(self, *exc):
        self.mod.basket_attention = self.inner


@contextlib.contextmanager
def cuda_path_on(device: str):
    """On CPU, within: the CUDA path's switch on and the fused CPU path off, so (a) runs the CUDA path's code
    there (restored after: a test runs :func:`main` in its own process)."""
    import posfair.calibration.cuda_rows as cr
    import posfair.calibration.fused as fused

    saved = cr.cuda_every_row_available, fused.ENABLED
    if device == "cpu":
        cr.cuda_every_row_available = lambda device: True
        fused.ENABLED = False
    try:
        yield
    finally:
        cr.cuda_every_row_available, fused.ENABLED = saved


def correctness(device: str, archs: list[str], tmp: Path) -> list[dict]:
    import posfair
    from reference import reference_mode
    from tiny_models import _configs

    rows = []
    sample = texts(3, 60, seed=1) + ["alpha beta"]  # padded batch; one text shorter than a basket
    cal = posfair.Calibration(basket_size=8, layers=0.5, strength=1.0, isolate_bos=True)
    for arch in archs:
        config, native = _configs()[arch]
        folder = build(config, tmp / f"tiny-{arch}")
        for pooling in dict.fromkeys([native, "mean"]):
            ref_model = posfair.load_model(str(folder), pooling=pooling)
            with torch.no_grad():  # peaked attention (as tests/calibration/test_low_precision.py): calibration moves it
                for name, param in ref_model.named_parameters():
                    if name.endswith(("query.weight", "q_proj.weight", "Wqkv.weight")):
                        param.mul_(4.0)
            features = ref_model.tokenize(sample)
            with torch.no_grad():
                stock = ref_model(ref_model.tokenize(sample))["sentence_embedding"].double()
                resolved = ref_model.transformer_module.resolve(cal)
                with reference_mode(ref_model, resolved, features["attention_mask"]):
                    ref = ref_model(ref_model.tokenize(sample))["sentence_embedding"].double()
            for dtype in ("float32", "bfloat16"):
                fast_model = copy.deepcopy(ref_model).to(device=device, dtype=getattr(torch, dtype))
                feats = {k: v.to(device) if torch.is_tensor(v) else v for k, v in ref_model.tokenize(sample).items()}
                row = {"arch": arch, "pooling": pooling, "dtype": dtype, "device": device}
                try:
                    with torch.no_grad(), fast_model.using(cal), PathCount() as count:
                        fast = fast_model(feats)["sentence_embedding"].double().cpu()
                    err = ((fast - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
                    moved = ((stock - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
                    row.update(rel_error=err, calibration_moved=moved, cuda_path_calls=count.calls,
                               ok=bool(err <= TOLERANCE[dtype] and moved > err))  # fmt: skip
                except Exception as exc:  # noqa: BLE001 -- recorded and shown, never a silent pass
                    row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
                rows.append(row)
                del fast_model
    return rows


class Timer:
    def __init__(self, device: str):
        self.device = device

    def sync(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def run(self, fn) -> tuple[float, int]:
        """(seconds, peak bytes allocated above what was allocated before; 0 on CPU)."""
        cuda = self.device.startswith("cuda")
        self.sync()
        if cuda:
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        fn()
        self.sync()
        elapsed = time.perf_counter() - t0
        return elapsed, (torch.cuda.max_memory_allocated() - before) if cuda else 0


def timing_models(small: bool):
    from transformers import Qwen3Config, XLMRobertaConfig

    if small:
        enc = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
        return {"xlmr-12x384": ("enc", enc)}, Qwen3Config, XLMRobertaConfig
    return {
        "xlmr-12x384": ("enc", dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536)),
        "qwen3-0.6b-encoder": ("enc", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                                           intermediate_size=3072, vocab_size=151936)),
        "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                                     num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936)),
    }, Qwen3Config, XLMRobertaConfig  # fmt: skip


def timing(device: str, lengths: list[int], batch_tokens: int, rounds: int, small: bool, tmp: Path, deadline: float):
    import posfair

    models, Qwen3Config, XLMRobertaConfig = timing_models(small)
    rows = []
    timer = Timer(device)
    for name, (kind, shape) in models.items():
        if time.time() > deadline:
            rows.append({"model": name, "skipped": "time budget"})
            continue
        top = max(lengths)
        shape = dict({"vocab_size": 30522}, **shape)
        if kind == "enc":
            config = XLMRobertaConfig(**shape, max_position_embeddings=top + 2, pad_token_id=0)
            configs = {"plain": ("mean", None), "pool-row": ("cls", CAL), "every-row": ("mean", CAL)}
        else:
            config = Qwen3Config(**shape, max_position_embeddings=top + 8, pad_token_id=0)
            configs = {"plain": ("lasttoken", None), "pool-row": ("lasttoken", CAL)}
        folder = build(config, tmp / name, dtype=torch.bfloat16)
        loaded = {}
        for pooling in {p for p, _ in configs.values()}:
            loaded[pooling] = posfair.load_model(str(folder), pooling=pooling, max_seq_length=top).to(
                device=device, dtype=torch.bfloat16
            )
        weights = sum(p.numel() * p.element_size() for p in next(iter(loaded.values())).parameters())
        for L in lengths:
            for batch in dict.fromkeys([1, max(1, batch_tokens // L)]):
                if time.time() > deadline:
                    rows.append({"model": name, "length": L, "batch": batch, "skipped": "time budget"})
                    continue
                g = torch.Generator().manual_seed(L + batch)
                feats = {"input_ids": torch.randint(1000, 1000 + len(WORDS), (batch, L), generator=g).to(device),
                         "attention_mask": torch.ones(batch, L, dtype=torch.long, device=device)}  # fmt: skip
                times = {c: [] for c in configs}
                peaks = dict.fromkeys(configs, 0)
                errors = {}
                for r in range(rounds + 1):  # round 0: the warm-up
                    for c in list(configs) if r % 2 else list(configs)[::-1]:
                        if c in errors:
                            continue
                        pooling, cal = configs[c]
                        model = loaded[pooling]
                        cal_obj = posfair.Calibration(**cal) if cal else posfair.STOCK

                        def fwd(model=model, cal_obj=cal_obj, feats=feats):
                            with torch.no_grad(), model.using(cal_obj):
                                model(dict(feats))

                        try:
                            t, peak = timer.run(fwd)
                        except torch.OutOfMemoryError as exc:
                            errors[c] = f"out of memory: {exc}"[:200]
                            continue
                        if r:
                            times[c].append(t)
                            peaks[c] = max(peaks[c], peak)
                row = {"model": name, "length": L, "batch": batch, "rounds": rounds, "errors": errors}
                for c in configs:
                    if times[c]:
                        row[c] = {"time_s": statistics.median(times[c]), "peak_bytes": weights + peaks[c]}
                for c in ("pool-row", "every-row"):
                    if c in row and "plain" in row:
                        row[f"{c}_time_ratio"] = row[c]["time_s"] / row["plain"]["time_s"]
                        row[f"{c}_memory_ratio"] = row[c]["peak_bytes"] / row["plain"]["peak_bytes"]
                rows.append(row)
                print(f"  timed {name} L={L} batch={batch}", flush=True)
        del loaded
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def throughput(device: str, tmp: Path, small: bool, deadline: float) -> dict:
    """``posfair audit`` documents / s and ``posfair embed`` texts / s (wall time, model loading included)."""
    from transformers import XLMRobertaConfig

    if time.time() > deadline:
        return {"skipped": "time budget"}
    shape = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536)
    folder = build(XLMRobertaConfig(vocab_size=30522, **shape, max_position_embeddings=514, pad_token_id=0),
                   tmp / "xlmr-throughput")  # fmt: skip
    import pandas as pd

    n_texts, docs = (64, 8) if small else (4096, 96)
    corpus = tmp / "texts.parquet"
    pd.DataFrame({"text": texts(n_texts, 400, seed=3)}).to_parquet(corpus)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    common = ["--model", str(folder), "--device", device, "--calibration", "default", "--max-seq-length", "512"]
    cmds = {
        "embed": ([sys.executable, "-m", "posfair", "embed", "--corpus", str(corpus), "--out", str(tmp / "store"),
                   "--pooling", "mean", *common], n_texts, "texts_per_s"),
        "audit": ([sys.executable, "-m", "posfair", "audit", "--corpus", "bundled", "--langs", "en", "--n", "3",
                   "--docs", str(docs), "--no-control", "--out", str(tmp / "audit"), *common], docs, "docs_per_s"),
    }  # fmt: skip
    out = {}
    for name, (cmd, count, unit) in cmds.items():
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max(30, deadline - time.time()))
        wall = time.perf_counter() - t0
        out[name] = {"count": count, "wall_s": wall, "rc": res.returncode}
        if res.returncode == 0:
            out[name][unit] = count / wall
        else:
            out[name]["error"] = (res.stderr or res.stdout)[-600:]
    return out


def table(result: dict) -> str:
    lines = ["(a) correctness: ||fast - ref|| / ||ref|| against the float64 reference (tolerance "
             + ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items()) + ")"]  # fmt: skip
    lines.append(f"{'arch':<11} {'pooling':<10} {'dtype':<9} {'rel error':>10} {'moved':>9} {'cuda path':>9}  verdict")
    for r in result["correctness"]:
        err = f"{r['rel_error']:.2e}" if "rel_error" in r else "-"
        moved = f"{r['calibration_moved']:.2e}" if "calibration_moved" in r else "-"
        verdict = "ok" if r["ok"] else f"FAILED {r.get('error', '')}"
        lines.append(f"{r['arch']:<11} {r['pooling']:<10} {r['dtype']:<9} {err:>10} {moved:>9} "
                     f"{r.get('cuda_path_calls', '-'):>9}  {verdict}")  # fmt: skip
    lines.append("(b) calibrated / plain, bfloat16, interleaved (targets at >= 8192 tokens: every row <= 1.30x time, "
                 "<= 1.10x peak; pooling row <= 1.05x time)")  # fmt: skip
    lines.append(
        f"{'model':<19} {'L':>6} {'batch':>5} {'plain s':>8} {'row t':>7} {'row m':>7} {'all t':>7} {'all m':>7}"
    )
    for r in result["timing"]:
        if "skipped" in r:
            lines.append(
                f"{r['model']:<19} {r.get('length', '-'):>6} {r.get('batch', '-'):>5}  skipped: {r['skipped']}"
            )
            continue

        def mark(key, target, r=r):
            if key not in r:
                return "-"
            flag = "" if target is None or r["length"] < 8192 or r[key] <= target else "!"
            return f"{r[key]:.2f}{flag}"

        plain = f"{r['plain']['time_s']:.3f}" if "plain" in r else "-"
        lines.append(f"{r['model']:<19} {r['length']:>6} {r['batch']:>5} {plain:>8} "
                     f"{mark('pool-row_time_ratio', 1.05):>7} {mark('pool-row_memory_ratio', None):>7} "
                     f"{mark('every-row_time_ratio', 1.30):>7} {mark('every-row_memory_ratio', 1.10):>7}"
                     + (f"  errors: {r['errors']}" if r["errors"] else ""))  # fmt: skip
    lines.append("('!': a target missed)")
    tp = result["throughput"]
    lines.append("(c) throughput, XLM-R 12x384, wall time with model loading: " + "; ".join(
        f"{k}: " + (f"{v.get('texts_per_s', v.get('docs_per_s', 0)):.1f}/s of {v['count']}" if v.get("rc") == 0
                    else f"FAILED rc={v.get('rc')}" if "rc" in v else str(v)) for k, v in tp.items()))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (small sizes: --small)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_check.json")
    ap.add_argument("--lengths", type=int, nargs="+", default=None, help="default 2048 8192 32768 (--small: 64 160)")
    ap.add_argument("--batch-tokens", type=int, default=None, help="the real batch's tokens (default 65536)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up")
    ap.add_argument("--archs", nargs="+", default=None, help="(a)'s tiny architectures (default: all)")
    ap.add_argument("--kernel", choices=["sdpa", "flex"], default=None, help="cuda_rows.KERNEL for this run")
    ap.add_argument("--small", action="store_true", help="small models and lengths (CPU)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["correctness", "timing", "throughput"])
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip timing / throughput left after this")
    args = ap.parse_args(argv)
    start = time.time()
    deadline = start + args.budget_s
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here (use --device cpu --small)", file=sys.stderr)
        return 2
    import posfair.calibration.cuda_rows as cr
    from tiny_models import ARCHS

    kernel_before = cr.KERNEL
    if args.kernel:
        cr.KERNEL = args.kernel
    lengths = args.lengths or ([64, 160] if args.small else [2048, 8192, 32768])
    batch_tokens = args.batch_tokens or (256 if args.small else 65536)
    result = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "kernel": cr.KERNEL, "calibration": CAL, "tolerance": TOLERANCE,
              "targets": TARGETS, "lengths": lengths, "batch_tokens": batch_tokens}  # fmt: skip
    import sentence_transformers
    import transformers

    result["transformers"], result["sentence_transformers"] = (
        transformers.__version__,
        sentence_transformers.__version__,
    )
    with tempfile.TemporaryDirectory() as tmp, cuda_path_on(args.device):
        tmp = Path(tmp)
        result["correctness"] = (
            [] if "correctness" in args.skip else correctness(args.device, args.archs or list(ARCHS), tmp)
        )
        result["timing"] = (
            []
            if "timing" in args.skip
            else timing(args.device, lengths, batch_tokens, args.rounds, args.small, tmp, deadline)
        )
        result["throughput"] = {} if "throughput" in args.skip else throughput(args.device, tmp, args.small, deadline)
    cr.KERNEL = kernel_before
    result["wall_s"] = time.time() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"wrote {args.out} ({result['wall_s']:.0f} s)")
    return 0 if all(r["ok"] for r in result["correctness"]) else 1


if __name__ == "__main__":
    sys.exit(main())
