"""Where a plan's simulations run: one small interface, two engines.

An :class:`Engine` maps a picklable top-level function over a list of picklable items and
returns the results in input order — so a plan's outputs never depend on which engine ran it,
how many workers it had, or the order results came back.

- ``local``: a process pool on this machine (the default; one worker runs in-process).
- ``ray``: Ray's task API, one task per item; ``address`` joins a running cluster (``auto``, or
  ``ray://HOST:PORT``), else a local one is started with ``workers`` CPUs. Workers import the
  same ``timeline`` package through Ray's runtime environment (``py_modules``). Ray is an
  optional extra (``pip install 'timeline[ray]'``), imported only here and only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol

from timeline.errors import UserError

ENGINES = ("local", "ray")


class Engine(Protocol):
    """``map(fn, items)`` → ``[fn(x) for x in items]``, computed wherever the engine runs work."""

    workers: int

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]: ...

    def close(self) -> None: ...


def _quiet_on_interrupt() -> None:
    import signal

    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


class LocalEngine:
    """A process pool of ``workers`` processes (in-process when ``workers`` is 1)."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool: ProcessPoolExecutor | None = None

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if self.workers == 1 or len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_quiet_on_interrupt)
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class RayEngine:
    """Ray tasks; results gathered in submission order (``ray.get`` of the list)."""

    def __init__(self, workers: int, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--engine ray needs Ray: pip install 'timeline[ray]' (or pip install ray)") from None
        import timeline

        self._ray = ray
        self.workers = max(1, workers)
        env = {"py_modules": [os.path.dirname(timeline.__file__)]}
        try:
            if address:
                ray.init(address=address, runtime_env=env, log_to_driver=False, ignore_reinit_error=True)
            else:
                ray.init(num_cpus=self.workers, runtime_env=env, log_to_driver=False, include_dashboard=False,
                         ignore_reinit_error=True)
        except Exception as exc:  # noqa: BLE001 — Ray raises many kinds; the user needs one line
            raise UserError(f"--engine ray: cannot start or join a Ray cluster"
                            f"{f' at {address}' if address else ''} ({type(exc).__name__}: {exc})") from None
        self._remote: dict[Callable, Any] = {}

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        task = self._remote.get(fn)
        if task is None:
            task = self._remote[fn] = self._ray.remote(num_cpus=1)(fn)
        return self._ray.get([task.remote(x) for x in items])

    def close(self) -> None:
        self._ray.shutdown()


def make_engine(name: str, workers: int, address: str | None = None) -> Engine:
    if name == "local":
        if address:
            raise UserError("--address applies to --engine ray only")
        return LocalEngine(workers)
    if name == "ray":
        return RayEngine(workers, address)
    raise UserError(f"--engine {name!r}: use one of {', '.join(ENGINES)}")
