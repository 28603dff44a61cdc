"""Writing independent outputs in two processes: each takes the next output from a shared queue.

A run directory's files do not depend on each other, and the exporters are single-threaded
Python; on a machine with two or more cores a forked child and this process both write. The
formats go into a pipe, costliest first (:data:`COST`, measured on the shipped DeepSeek-V3 run);
each process reads one, writes it, reads the next, so the two finish together whatever the run
makes expensive (a gzipped trace, a run without OOMs, the protobuf trace). The child shares the
finished Timeline copy-on-write, so nothing is pickled and the peak memory of either process stays
that of one exporter at a time. Each file is written by one process, start to end, so the bytes
are those of the sequential writer. ``TIMELINE_WRITE_PROCESSES=1``, one format, one core or no
``fork`` (Windows) write sequentially. An exception in the child is re-raised here.
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from collections.abc import Callable, Sequence

#: relative cost of each exporter (CPU ms on the shipped run, all default outputs, compiled writers;
#: perfetto measured before them): the order the queue hands them out
COST = {"perfetto": 3000, "trace": 600, "snapshot": 500, "events": 200, "memory": 130, "ops": 60, "summary": 40,
        "devices": 1}


def queue_order(formats: Sequence[str]) -> list[str]:
    """The formats costliest first (the given order among equal costs)."""
    return sorted(formats, key=lambda f: -COST.get(f, 1))


def parallel_enabled(formats: Sequence[str]) -> bool:
    wanted = os.environ.get("TIMELINE_WRITE_PROCESSES", "").strip()
    if wanted and wanted.isdigit() and int(wanted) <= 1:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return hasattr(os, "fork") and cores > 1 and len(formats) > 1


def write_in_two(formats: Sequence[str], write_one: Callable[[str], None]) -> None:
    """``write_one(fmt)`` for every format, in this process and a forked one, each taking the
    next format from the queue."""
    if not parallel_enabled(formats):
        for fmt in formats:
            write_one(fmt)
        return
    order = queue_order(formats)
    # the queue: one byte per format, read one at a time by whichever process is free (a read of
    # one byte from a pipe is atomic: each format is taken once)
    queue_read, queue_write = os.pipe()
    os.write(queue_write, bytes(range(len(order))))
    os.close(queue_write)

    def take() -> str | None:
        got = os.read(queue_read, 1)
        return order[got[0]] if got else None

    read_fd, write_fd = os.pipe()
    # Ctrl-C is held back across fork(): one arriving inside the interpreter's at-fork hooks would
    # be swallowed there ("Exception ignored …") and the run would go on as if nothing happened
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the child: write what it takes, report an exception through the pipe, never return
        # Ctrl-C reaches the whole process group: the child stops at once, the parent reports it
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(read_fd)
        code = 0
        try:
            while (taken := take()) is not None:
                write_one(taken)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            code = 1
            try:
                payload = pickle.dumps(exc)
            except Exception:  # noqa: BLE001 - an unpicklable exception still says what happened
                payload = pickle.dumps(RuntimeError("".join(traceback.format_exception(exc))))
            os.write(write_fd, payload)
        finally:
            os.close(write_fd)
            os._exit(code)
    os.close(write_fd)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a Ctrl-C held back arrives here
        while (taken := take()) is not None:
            write_one(taken)
    except BaseException:  # interrupted or failed here: the child's files are not wanted either
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(queue_read)
        with os.fdopen(read_fd, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(pid, 0)
    if payload:
        raise pickle.loads(payload)
    if os.waitstatus_to_exitcode(status) == 130:  # the child was interrupted (its Ctrl-C handler)
        raise KeyboardInterrupt
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the second process writing {', '.join(formats)} ended with status {status}")
