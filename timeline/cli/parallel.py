"""Writing independent outputs in two processes: the one expensive exporter beside the rest.

A run directory's files do not depend on each other, and the exporters are single-threaded
Python; on a machine with two or more cores, the formats are split into two groups of about
equal cost (:data:`COST`, measured on the shipped DeepSeek-V3 run) and one group is written by a
forked child while this process writes the other. The child shares the finished Timeline
copy-on-write, so nothing is pickled and the peak memory of either process stays that of one
exporter at a time. Each file is written by one process, start to end, so the bytes are those of
the sequential writer. ``TIMELINE_WRITE_PROCESSES=1``, one format, one core or no ``fork``
(Windows) write sequentially. An exception in the child is re-raised here.
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from collections.abc import Callable, Sequence

#: relative cost of each exporter (seconds on the shipped run, all default outputs)
COST = {"snapshot": 16, "trace": 11, "perfetto": 30, "events": 3, "summary": 1, "memory": 1, "ops": 1, "devices": 1}


def split(formats: Sequence[str]) -> tuple[list[str], list[str]]:
    """(child's, parent's) formats: the costliest first, each to the lighter group; each group
    keeps the order the formats were given in."""
    groups: tuple[list[str], list[str]] = ([], [])
    load = [0, 0]
    for fmt in sorted(formats, key=lambda f: -COST.get(f, 1)):
        g = 0 if load[0] <= load[1] else 1
        groups[g].append(fmt)
        load[g] += COST.get(fmt, 1)
    return [f for f in formats if f in groups[0]], [f for f in formats if f in groups[1]]


def parallel_enabled(formats: Sequence[str]) -> bool:
    wanted = os.environ.get("TIMELINE_WRITE_PROCESSES", "").strip()
    if wanted and wanted.isdigit() and int(wanted) <= 1:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return hasattr(os, "fork") and cores > 1 and len(formats) > 1


def write_in_two(formats: Sequence[str], write_one: Callable[[str], None]) -> None:
    """``write_one(fmt)`` for every format, the child's group in a forked process."""
    if not parallel_enabled(formats):
        for fmt in formats:
            write_one(fmt)
        return
    theirs, mine = split(formats)
    read_fd, write_fd = os.pipe()
    # Ctrl-C is held back across fork(): one arriving inside the interpreter's at-fork hooks would
    # be swallowed there ("Exception ignored …") and the run would go on as if nothing happened
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the child: write its group, report an exception through the pipe, never return
        # Ctrl-C reaches the whole process group: the child stops at once, the parent reports it
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(read_fd)
        code = 0
        try:
            for fmt in theirs:
                write_one(fmt)
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
        for fmt in mine:
            write_one(fmt)
    except BaseException:  # interrupted or failed here: the child's files are not wanted either
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        with os.fdopen(read_fd, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(pid, 0)
    if payload:
        raise pickle.loads(payload)
    if os.waitstatus_to_exitcode(status) == 130:  # the child was interrupted (its Ctrl-C handler)
        raise KeyboardInterrupt
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the process writing {', '.join(theirs)} ended with status {status}")
