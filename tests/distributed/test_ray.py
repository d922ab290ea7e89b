"""The Ray executor on a local instance with 2 CPUs: identical vectors, resume after a killed worker or driver.

Each Ray pool starts fresh replica processes that import torch, transformers and sentence-transformers
(~7 s of CPU each): a test runs one replica where the number of replicas is not what it checks, and two
where it is (two replicas' shards against the single-process path; a replica killed beside a live one).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from forked import server
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.distributed import ManifestMismatch, embed_texts
from posfair.encoding import encode_cached
from posfair.store import EmbeddingStore, embedding_namespace, text_key
from ray_sessions import session_of, session_processes, session_settles, sessions

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


def workers_released(ray, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) >= 2:
            return True
        time.sleep(0.5)
    return False


#: the processes a job starts in an instance: its replicas (Ray Data's map workers) and its registry actor
JOB_ACTORS = ("ray::MapWorker", "ray::Replicas")
#: an instance's servers and a job's actors (a killed driver's side agents, e.g. ray::DashboardAgent, notice the
#: dead instance on their own a minute or two later: `ray stop` ends them at once, as the README says)
SERVERS_AND_ACTORS = ("ray/raylet", "ray/gcs/gcs_server", *JOB_ACTORS)


def test_resume_after_workers_are_killed(tmp_path, texts, tiny_spec, tiny_fair, ray_local):
    spec = tiny_spec()
    root = tmp_path / "store"
    # run 1 (one replica): the shard function fails in the worker once 3 shards exist: the run stops
    with pytest.raises(RuntimeError, match="worker failure"):
        embed_texts(texts, root, spec, model=tiny_fair, shard_size=4, engine="ray", workers=1,
                    after_shard=FailWorker(str(root), after=3))  # fmt: skip
    assert workers_released(ray_local), "the failed run's workers still hold their CPUs"  # killed by the job
    # this process started the instance (ray_local): the newest session folder named after it
    left = session_settles(session_of(os.getpid(), set()), JOB_ACTORS)
    assert not left, f"the failed run's replicas are still alive: {left}"
    files = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in root.glob("*/part-*.arrow")}
    assert 3 <= len(files) <= 3 + 2 * 2 and not list(root.glob("*/.part-*"))  # only complete shards, no temporaries
    # run 2 (two replicas) resumes; a worker process is killed mid-run beside a live one: a new pool finishes
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
            embed_texts(texts, root, tiny_spec(), model=tiny_fair, shard_size=4, engine="ray", workers=1,
                        after_shard=KillAlways(str(root), after=0))  # fmt: skip
    assert workers_released(ray_local)
    written = list(root.glob("*/part-*.arrow"))
    assert 1 <= len(written) < 15  # the job did not finish
    # a replica ended inside a shard's write (here: none, each dies after its first shard; in the resume test the
    # live replica is ended by the job) leaves at most the atomic writer's own temporary
    # (.part-<shard>.arrow.<random>.tmp, never read as a shard), no partial shard
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
        embed_texts(texts, tmp_path / "other", spec, model=other, shard_size=4, engine="ray", workers=1)
    assert workers_released(ray_local)
    assert not list((tmp_path / "other").glob("*/part-*.arrow"))


def test_killed_driver_takes_its_ray_instance_along_and_a_two_replica_rerun_resumes_with_the_same_vectors(
    tmp_path, texts, tiny_spec, tiny_fair, ray_local
):
    """A driver killed mid-run (its own Ray instance, one replica) takes its instance along; a rerun on two
    replicas writes only the shards left, and the store then holds, bit for bit, what the single-process
    path writes (the same shard function), and sentence-transformers' own encoding to summation order."""
    spec = tiny_spec(calibration=CAL.to_dict())
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    root = tmp_path / "store"
    # the driver: `posfair embed` on a local Ray instance of its own, one replica (forked as the script runs it)
    args = ["embed", "--out", str(root), "--corpus", str(corpus), "--model", spec.model, "--pooling", spec.pooling,
            "--max-seq-length", str(spec.max_seq_length), "--calibration", "16,0.5,0.5", "--shard-size", "4",
            "--batch-size", "8", "--max-batch-tokens", "256", "--ray-address", "local", "--workers", "1"]  # fmt: skip
    before = sessions()
    driver = server().start(args, tmp_path)
    try:
        deadline = time.monotonic() + 200
        while len(list(root.glob("*/part-*.arrow"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(root.glob("*/part-*.arrow"))) >= 2, "the driver wrote no shard in time"
        session = session_of(driver.pid, before)
        alive = session_processes(session, SERVERS_AND_ACTORS) if session is not None else []
    finally:
        os.kill(driver.pid, signal.SIGKILL)  # the driver, mid-run, without any cleanup
        done = server().wait(driver, timeout=60)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)  # killed, not finished
    assert "engine: a local Ray instance, 1 worker\n" in done.stdout, done.stdout  # printed before the job starts
    assert session is not None, "the driver started no Ray instance of its own"
    # while it ran, its instance's processes were found by their session folder: the servers and the replica
    for kind in SERVERS_AND_ACTORS[:3]:
        assert any(kind in p for p in alive), (kind, alive)
    left = session_settles(session, SERVERS_AND_ACTORS)
    assert not left, f"the killed driver's Ray instance (or its replicas) outlived it: {left}"
    files = {f.name: f.stat().st_mtime_ns for f in root.glob("*/part-*.arrow")}
    assert 2 <= len(files) < 15 and not list(root.glob("*/.part-*"))
    rep = embed_texts(texts, root, spec, model=tiny_fair, shard_size=4, engine="ray", workers=2)
    assert (rep.engine, rep.workers, rep.shards) == ("ray", 2, 15), rep
    assert (rep.skipped, rep.written) == (len(files), 15 - len(files))
    assert {
        k: v for k, v in ((f.name, f.stat().st_mtime_ns) for f in root.glob("*/part-*.arrow")) if k in files
    } == files
    embed_texts(texts, tmp_path / "ref", spec, model=tiny_fair, shard_size=4)
    got = vectors(root, tiny_fair, texts, CAL)
    np.testing.assert_array_equal(got, vectors(tmp_path / "ref", tiny_fair, texts, CAL))  # same shard function
    ref = encode_cached(tiny_fair, texts, None, calibration=CAL, batch_size=8)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)  # vs sentence-transformers' batches: summation order only
