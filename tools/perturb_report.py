"""What ``tools/perturb_megatron_configs.py`` and ``tools/perturb_serving_configs.py`` count for their draws, and
how they print it: ran, refused (by message, numbers blanked), crashed (with the last frames)."""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from timeline.errors import UserError


@dataclass
class Outcome:
    ran: int = 0
    refused: dict[str, list[str]] = field(default_factory=dict)  # message with numbers blanked → draws
    crashed: list[tuple[str, str, str]] = field(default_factory=list)  # (draw, exception, last frames)

    def attempt(self, draw: str, job: Callable[[], object]) -> None:
        """Run one draw's ``job``: it ran, was refused (a UserError) or crashed (anything else)."""
        try:
            job()
        except UserError as e:
            self.refuse(str(e), draw)
        except Exception as e:  # noqa: BLE001 — what the perturbation tools report
            self.crash(draw, e)
        else:
            self.ran += 1

    def refuse(self, message: str, draw: str) -> None:
        self.refused.setdefault(re.sub(r"\d+", "N", message.splitlines()[0] if message else "")[:160], []).append(draw)

    def crash(self, draw: str, exc: BaseException) -> None:
        frames = " | ".join(line.strip() for line in traceback.format_exc().strip().splitlines()[-4:-1])
        self.crashed.append((draw, f"{type(exc).__name__}: {exc}", frames))

    def lines(self, head: str, verb: str) -> list[str]:
        out = [f"{head}: {self.ran} {verb}, {sum(map(len, self.refused.values()))} refused, "
               f"{len(self.crashed)} crashed"]
        out += [f"  refused {len(draws):4d}  {message}"
                for message, draws in sorted(self.refused.items(), key=lambda kv: -len(kv[1]))]
        out += [f"CRASHED {draw}\n  {exc}\n  {frames}" for draw, exc, frames in self.crashed]
        return out
