"""Read a request trace CSV: ``arrival_us,prompt_tokens,output_tokens,prefix_id``.

``prefix_id`` may be empty (no shared prefix). A fifth column ``prefix_tokens`` may say how many
leading prompt tokens the requests of one ``prefix_id`` share; without it they share the shortest
prompt of that id, the longest prefix every one of them can hold. Every problem names the file
and the line; rows keep their file order and get ids 0, 1, … in arrival order (ties by line).
"""

from __future__ import annotations

import csv
from pathlib import Path

from timeline.errors import UserError
from timeline.spec.serving import Request

HEADER = ("arrival_us", "prompt_tokens", "output_tokens", "prefix_id")
#: the most requests one trace may hold (a million-request day of a busy endpoint, times ten)
MAX_ROWS = 10_000_000
MAX_TOKENS = 2**26


def _int(text: str, what: str, where: str, least: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise UserError(f"{where}: {what} must be a whole number, got {text!r}") from None
    if not least <= value <= MAX_TOKENS and what != "arrival_us":
        raise UserError(f"{where}: {what} must be in {least}…{MAX_TOKENS:,}, got {value}")
    return value


def read_requests(path: Path) -> tuple[Request, ...]:
    """The trace's requests sorted by arrival; a UserError naming ``path:line`` for any bad row."""
    try:
        handle = open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    rows: list[tuple[float, int, int, int, str, int | None]] = []
    with handle:
        try:
            reader = csv.reader(handle)
            header = tuple(h.strip() for h in next(reader, ()))
            if header[:4] != HEADER or header[4:] not in ((), ("prefix_tokens",)):
                raise UserError(f"{path}:1: header must be {','.join(HEADER)}[,prefix_tokens], got "
                                f"{','.join(header) or 'nothing'}")
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                where = f"{path}:{line}"
                if len(row) != len(header):
                    raise UserError(f"{where}: expected {len(header)} fields, got {len(row)}")
                if len(rows) >= MAX_ROWS:
                    raise UserError(f"{path}: more than {MAX_ROWS:,} requests; split the trace")
                try:
                    arrival = float(row[0])
                except ValueError:
                    raise UserError(f"{where}: arrival_us must be a number, got {row[0]!r}") from None
                if not 0 <= arrival < 1e15:
                    raise UserError(f"{where}: arrival_us must be in 0…1e15 µs, got {row[0]!r}")
                prompt = _int(row[1], "prompt_tokens", where, 1)
                output = _int(row[2], "output_tokens", where, 1)
                prefix = row[3].strip()
                shared = _int(row[4], "prefix_tokens", where, 0) if len(row) > 4 and row[4].strip() else None
                if shared is not None and shared > prompt:
                    raise UserError(f"{where}: prefix_tokens {shared} exceeds prompt_tokens {prompt}")
                rows.append((arrival, line, prompt, output, prefix, shared))
        except UnicodeDecodeError:
            raise UserError(f"{path}: not a text file, expected a CSV request trace") from None
        except csv.Error as exc:
            raise UserError(f"{path}: invalid CSV ({exc})") from None
    if not rows:
        raise UserError(f"{path}: no requests (only a header)")
    shortest: dict[str, int] = {}
    for _, _, prompt, _, prefix, shared in rows:
        if prefix:
            size = prompt if shared is None else shared
            shortest[prefix] = min(shortest.get(prefix, size), size)
    rows.sort(key=lambda r: (r[0], r[1]))
    return tuple(Request(rid=i, arrival_us=a, prompt_tokens=p, output_tokens=o, prefix_id=x,
                         prefix_tokens=shortest[x] if x else 0)
                 for i, (a, _, p, o, x, _s) in enumerate(rows))
