"""Read a user's text file, every way it can fail becoming one error line naming the path and
what was expected there."""

from __future__ import annotations

from pathlib import Path

from timeline.errors import UserError


def read_user_text(path: Path, expected: str) -> str:
    """The UTF-8 text of ``path``; ``expected`` names what the file should be (e.g. "a run file (.toml)")."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected {expected}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file, expected {expected}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
