"""Two processes registering the same targets in one store at the same instant (two `tuner run` on a fresh database,
or `tuner run` and `tuner judge`): both get the same ids, neither dies on the unique name. Real processes, released
together by a barrier, many trials."""

from __future__ import annotations

import multiprocessing

from tuner.store.db import open_engine
from tuner.store.store import Store

_FORK = multiprocessing.get_context("fork")
TARGETS = 10


def _register(db: str, trials: int, barrier, results) -> None:
    engine = open_engine(f"sqlite:///{db}")
    got = []
    for i in range(trials):
        store = Store(engine)  # a fresh process's store: nothing cached
        barrier.wait(60)
        try:
            got.append([store.ensure_target(f"t{i}-{k}", "vllm", "http://127.0.0.1:9") for k in range(TARGETS)])
        except Exception as exc:  # noqa: BLE001  (the IntegrityError this test must not see)
            got.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    results.put(got)
    engine.dispose()


def test_two_processes_register_the_same_targets_at_once(store):
    trials = 40
    db = store.engine.url.database
    barrier, results = _FORK.Barrier(2), _FORK.Queue()
    procs = [_FORK.Process(target=_register, args=(db, trials, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    a, b = results.get(timeout=120), results.get(timeout=120)
    for p in procs:
        p.join(30)
    died = [x if isinstance(x, str) else y for x, y in zip(a, b) if isinstance(x, str) or isinstance(y, str)]
    assert not died, f"{len(died)}/{trials} trials died: {died[0]}"
    assert a == b  # the same ids in both processes
    assert len(store.target_names()) == trials * TARGETS
