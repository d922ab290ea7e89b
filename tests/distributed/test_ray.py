"""The Ray executor on a local instance with 2 CPU workers: identical vectors, resume after a killed worker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from posfair import Calibration
from posfair.calibration import STOCK
from posfair.distributed import ManifestMismatch, embed_texts
from posfair.encoding import encode_cached
from posfair.store import EmbeddingStore, embedding_namespace, text_key

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*truncated"),
    # a Ray hang (start-up, a lost worker) ends the test run with every thread's stack instead of blocking CI
    pytest.mark.timeout(300, method="thread"),
]
CAL = Calibration.parse("16,0.5,0.5")


class FailWorker:
    """Runs in the Ray worker after each shard: once ``after`` shards exist in the store, the shard function fails."""

    def __init__(self, root: str, after: int):
        self.root, self.after = root, after

    def written(self) -> int:
        return len(list(Path(self.root).glob("*/part-*.arrow")))

    def __call__(self, res: dict) -> None:
        if self.written() >= self.after:
            raise RuntimeError("worker failure")


@pytest.fixture(scope="module", autouse=True)
def _ship_this_module(ray_local):
    # workers cannot import the test module: send its hooks by value
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray_local.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def vectors(root, model, texts, calibration=STOCK):
    return embedding_namespace(EmbeddingStore(root), model.fingerprint, calibration).get([text_key(t) for t in texts])


def test_two_workers_match_the_single_process_path(tmp_path, texts, tiny_spec, tiny_fair):
    spec = tiny_spec(calibration=CAL.to_dict())
    rep = embed_texts(texts, tmp_path / "ray", spec, model=tiny_fair, shard_size=8, engine="ray", workers=2)
    assert (rep.engine, rep.workers, rep.shards, rep.written, rep.encoded) == ("ray", 2, 8, 8, 60)
    embed_texts(texts, tmp_path / "local", spec, model=tiny_fair, shard_size=8)
    got = vectors(tmp_path / "ray", tiny_fair, texts, CAL)
    np.testing.assert_array_equal(got, vectors(tmp_path / "local", tiny_fair, texts, CAL))  # same shard function
    ref = encode_cached(tiny_fair, texts, None, calibration=CAL, batch_size=8)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)  # vs sentence-transformers' batches: summation order only


def workers_released(ray, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) >= 2:
            return True
        time.sleep(0.5)
    return False


RAY_DRIVER = """
import json, sys, warnings
warnings.simplefilter("ignore")
from posfair.distributed import EmbedSpec, embed_texts
texts = json.loads(open(sys.argv[1]).read())
embed_texts(texts, sys.argv[2], EmbedSpec.from_dict(json.loads(sys.argv[3])), shard_size=4, engine="ray", workers=2)
"""


def ray_processes() -> list[str]:
    """Ray's servers and posfair's actors on this machine (Ray's side agents of a dead instance exit on their own)."""
    pattern = "ray/raylet|ray/gcs/gcs_server|ray::MapWorker|ray::Replicas"
    out = subprocess.run(["pgrep", "-a", "-f", pattern], capture_output=True, text=True)
    return [line[:100] for line in out.stdout.splitlines()]


def ray_processes_settle_to(before: list[str], timeout: float = 60.0) -> list[str]:
    """Waits until no process is alive beyond ``before``; returns those still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        extra = sorted(set(ray_processes()) - set(before))
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.5)


def test_resume_after_workers_are_killed(tmp_path, texts, tiny_spec, tiny_fair, ray_local):
    spec = tiny_spec()
    root = tmp_path / "store"
    before = ray_processes()
    # run 1: the shard function fails in the workers once 3 shards exist: the run stops
    with pytest.raises(RuntimeError, match="worker failure"):
        embed_texts(texts, root, spec, model=tiny_fair, shard_size=4, engine="ray", workers=2,
                    after_shard=FailWorker(str(root), after=3))  # fmt: skip
    assert workers_released(ray_local), "the failed run's workers still hold their CPUs"  # killed by the job
    left = ray_processes_settle_to(before)
    assert not left, f"the failed run's replicas are still alive: {left}"
    files = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in root.glob("*/part-*.arrow")}
    assert 3 <= len(files) <= 3 + 2 * 2 and not list(root.glob("*/.part-*"))  # only complete shards, no temporaries
    # run 2 resumes; a worker process is killed mid-run, Ray restarts it and retries its shard
    armed = tmp_path / "armed"
    armed.mkdir()
    with pytest.warns(UserWarning, match=r"a Ray replica died \(ActorDiedError: .*\); starting a new pool for the \d+ "
                                         r"shards left \(replacement 1 of at most 3\)") as said:  # fmt: skip
        rep = embed_texts(texts, root, spec, model=tiny_fair, shard_size=4, engine="ray", workers=2,
                          after_shard=KillOnce(str(root), str(armed), after=len(files) + 1))  # fmt: skip
    assert not armed.exists()  # the second kill happened
    assert len([w for w in said if "a Ray replica died" in str(w.message)]) == 1  # one death, one replacement
    # skipped: the shards of run 1, the shard written just before the kill and any other the first pool finished
    # without reporting it (found complete by the new pool); every shard counted once
    assert rep.skipped + rep.written == 15 and len(files) + 1 <= rep.skipped <= len(files) + 1 + 2 * 2, rep
    after = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in root.glob("*/part-*.arrow")}
    assert {k: after[k] for k in files} == files  # finished shards were not recomputed
    embed_texts(texts, tmp_path / "ref", spec, model=tiny_fair, shard_size=4)
    assert set(after) == {f.name for f in (tmp_path / "ref").glob("*/part-*.arrow")}
    np.testing.assert_array_equal(vectors(root, tiny_fair, texts), vectors(tmp_path / "ref", tiny_fair, texts))


def test_replicas_that_keep_dying_stop_the_job_after_the_replacements(tmp_path, texts, tiny_spec, tiny_fair,
                                                                      ray_local, monkeypatch):  # fmt: skip
    """A shard that kills every replica does not loop forever: after MAX_POOL_REPLACEMENTS new pools the job stops,
    each replacement said, every shard written before a death kept."""
    from posfair.distributed import ray_engine

    monkeypatch.setattr(ray_engine, "MAX_POOL_REPLACEMENTS", 1)
    root = tmp_path / "store"
    with pytest.warns(UserWarning, match=r"replacement 1 of at most 1"):
        with pytest.raises(RuntimeError, match=r"replicas died 2 times \(ActorDiedError: .*\); finished shards are "
                                               r"kept, \d+ shards are left: rerun to resume"):  # fmt: skip
            embed_texts(texts, root, tiny_spec(), model=tiny_fair, shard_size=4, engine="ray", workers=2,
                        after_shard=KillAlways(str(root), after=0))  # fmt: skip
    assert workers_released(ray_local)
    written = list(root.glob("*/part-*.arrow"))
    assert 1 <= len(written) < 15  # the job did not finish
    # stopping the job ends the surviving replica too, possibly inside a shard's write: that leaves at most the
    # atomic writer's own temporary (.part-<shard>.arrow.<random>.tmp, never read as a shard), no partial shard
    left = [f.name for f in root.glob("*/.part-*")]
    assert all(re.fullmatch(r"\.part-[0-9a-f]+\.arrow\.[^.]+\.tmp", name) for name in left), left
    # every shard kept is complete, and a rerun finishes the job from them with the same vectors as one clean run
    rep = embed_texts(texts, root, tiny_spec(), model=tiny_fair, shard_size=4)
    assert rep.skipped == len(written) and rep.skipped + rep.written == 15, rep
    embed_texts(texts, tmp_path / "ref", tiny_spec(), model=tiny_fair, shard_size=4)
    np.testing.assert_array_equal(vectors(root, tiny_fair, texts), vectors(tmp_path / "ref", tiny_fair, texts))


class KillAlways(FailWorker):
    """Kills the worker process after every shard (a shard that always takes its replica down)."""

    def __call__(self, res: dict) -> None:
        os._exit(1)


class KillOnce(FailWorker):
    """Kills the worker process the first time ``after`` shards exist while ``armed`` exists (and disarms)."""

    def __init__(self, root: str, armed: str, after: int):
        super().__init__(root, after)
        self.armed = armed

    def __call__(self, res: dict) -> None:
        if self.written() >= self.after:
            try:
                os.rmdir(self.armed)
            except FileNotFoundError:
                return
            os._exit(1)  # as a killed worker: no exception, no cleanup


def test_refusals_before_any_worker_starts(tmp_path, texts, tiny_spec, tiny_fair, tiny_model, ray_local):
    spec = tiny_spec()
    root = tmp_path / "store"
    embed_texts(texts[:8], root, spec, model=tiny_fair, shard_size=4)  # a store built from another corpus
    with pytest.raises(ManifestMismatch, match="another corpus"):
        embed_texts(texts, root, spec, model=tiny_fair, shard_size=4, engine="ray", workers=2)
    # a replica whose weights differ from the driver's (here: the driver holds another model) refuses to write
    other = tiny_model("bert-mean")
    with pytest.raises(ManifestMismatch, match="^worker model fingerprint .* differs from the driver's"):
        embed_texts(texts, tmp_path / "other", spec, model=other, shard_size=4, engine="ray", workers=2)
    assert workers_released(ray_local)
    assert not list((tmp_path / "other").glob("*/part-*.arrow"))


def test_cli_runs_on_a_ray_instance_it_starts_and_stops(tmp_path, texts, tiny_spec, tiny_fair):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:20]))
    spec = tiny_spec()
    cmd = [sys.executable, "-c", "from posfair.cli import main; main()", "embed", "--out", str(tmp_path / "ray"),
           "--corpus", str(corpus), "--model", spec.model, "--pooling", spec.pooling,
           "--max-seq-length", str(spec.max_seq_length), "--shard-size", "4", "--batch-size", "8",
           "--max-tokens", "256", "--ray-address", "local", "--workers", "2"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    before = ray_processes()
    # the process starts its own local Ray instance, and must end (Ray shut down, no replica left) on its own
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    left = ray_processes_settle_to(before)
    assert not left, f"the CLI's Ray instance outlived it: {left}"
    assert "engine: a local Ray instance, 2 workers" in res.stdout
    # Ray's notice about its own token authentication is not passed on to the user (it is, with --debug)
    assert "Token authentication" not in res.stderr, res.stderr
    # nor Ray's C++ log lines (core_worker.cc's about restartable actors printed on every successful run)
    assert not re.search(r"\.cc:\d+", res.stderr), res.stderr
    assert (
        "20 distinct texts (stock)" in res.stdout and "5 shards written" in res.stdout and "2 worker(s)" in res.stdout
    )
    embed_texts(texts[:20], tmp_path / "local", spec, model=tiny_fair, shard_size=4)
    np.testing.assert_array_equal(
        vectors(tmp_path / "ray", tiny_fair, texts[:20]), vectors(tmp_path / "local", tiny_fair, texts[:20])
    )


def test_killed_driver_takes_its_ray_instance_along_and_the_rerun_resumes(
    tmp_path, texts, tiny_spec, tiny_fair, ray_local
):
    spec = tiny_spec()
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    root = tmp_path / "store"
    before = ray_processes()  # this session's own instance: its servers, and no replica of an earlier job
    proc = subprocess.Popen([sys.executable, "-c", RAY_DRIVER, str(tmp_path / "texts.json"), str(root), json.dumps(spec.to_dict())],
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    try:
        deadline = time.monotonic() + 200
        while len(list(root.glob("*/part-*.arrow"))) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, "the driver ended before it was killed"
        os.kill(proc.pid, signal.SIGKILL)  # the driver, mid-run, without any cleanup
    finally:
        proc.wait(timeout=60)
    left = ray_processes_settle_to(before)
    assert not left, f"the killed driver's Ray instance (or its replicas) outlived it: {left}"
    files = {f.name: f.stat().st_mtime_ns for f in root.glob("*/part-*.arrow")}
    assert 2 <= len(files) < 15 and not list(root.glob("*/.part-*"))
    rep = embed_texts(texts, root, spec, model=tiny_fair, shard_size=4, engine="ray", workers=2)
    assert (rep.skipped, rep.written) == (len(files), 15 - len(files))
    assert {
        k: v for k, v in ((f.name, f.stat().st_mtime_ns) for f in root.glob("*/part-*.arrow")) if k in files
    } == files
    embed_texts(texts, tmp_path / "ref", spec, model=tiny_fair, shard_size=4)
    np.testing.assert_array_equal(vectors(root, tiny_fair, texts), vectors(tmp_path / "ref", tiny_fair, texts))
