"""What sharing the stock layers saves when the same texts are encoded stock and then calibrated.

``posfair.model.stock_layers``: below a calibration's first calibrated layer every layer is stock, so a
pipeline that encodes texts stock and then with calibrations (the audit, the demo, retrieval and
sweep) computes those layers once.  This script measures it in one run, on a bundled model
(``--model``: ``bundled`` = all-MiniLM-L6-v2, 6 layers; ``bundled:multilingual-e5-small``, 12 layers)
and ``--docs`` documents of the bundled corpus (three segments each, up to ``--max-seq-length``
tokens), batch ``--batch``, one torch thread:

* ``separate``: ``encode(stock)``, then ``encode(calibration)`` for each ``--calibration``;
* ``shared``: the same calls inside ``model.sharing_stock_layers(calibrations)``.

Both orders run ``--repeats`` times, alternating, and the median time of each is kept; the script
checks that the vectors are bit-identical and prints the ratio shared / separate beside what
the layer count predicts: (L + sum over calibrations of (L - K)) / ((1 + C) * L) for L layers and
first calibrated layers K (attention, feed-forward and pooling all scale with layers; the
embedding layer is not counted).

    python benchmarks/stock_layers.py --docs 96 --calibration default --calibration 64,0.25,1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bundled")
    p.add_argument("--docs", type=int, default=96)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--max-seq-length", type=int, default=512)
    p.add_argument("--calibration", action="append", default=None, help="a calibration spec (repeatable)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import numpy as np
    import torch

    import posfair
    from posfair import Calibration
    from posfair.calibration import STOCK
    from posfair.corpus import load_corpus

    torch.set_num_threads(1)
    model = posfair.load_model(args.model, max_seq_length=args.max_seq_length)
    cals = [Calibration.parse(c) for c in (args.calibration or ["default"])]
    df = load_corpus()
    texts = df[df["lang"].astype(str) == "en"]["text"].astype(str).tolist()
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(texts, 3, replace=False)) for _ in range(args.docs)]

    def separate():
        return [model.encode(docs, calibration=c, batch_size=args.batch) for c in (STOCK, *cals)]

    def shared():
        with model.sharing_stock_layers(cals) as share:
            out = [model.encode(docs, calibration=c, batch_size=args.batch) for c in (STOCK, *cals)]
        shared.summary = share.summary() if share is not None else "nothing shared"
        return out

    import warnings

    warnings.simplefilter("ignore")
    times = {"separate": [], "shared": []}
    results = {}
    for _ in range(args.repeats):
        for name, fn in (("separate", separate), ("shared", shared)):
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    for a, b in zip(results["separate"], results["shared"], strict=True):
        np.testing.assert_array_equal(a, b)
    layers = model.num_layers
    starts = [model.transformer_module.first_calibrated_layer(c) for c in cals]
    predicted = (layers + sum(layers - k for k in starts)) / ((1 + len(cals)) * layers)
    sep, sh = statistics.median(times["separate"]), statistics.median(times["shared"])
    print(
        f"model {model.display_name}, {layers} layers; {args.docs} documents up to {args.max_seq_length} tokens, batch {args.batch}"
    )
    print(
        f"calibrations: {', '.join(f'{c.label()} (first calibrated layer {k})' for c, k in zip(cals, starts, strict=True))}"
    )
    print(f"separate: {sep:.1f} s   shared: {sh:.1f} s   (medians of {args.repeats}; vectors bit-identical)")
    print(f"shared / separate: {sh / sep:.2f}x   predicted from the layer counts: {predicted:.2f}x")
    print(shared.summary)


if __name__ == "__main__":
    main()
