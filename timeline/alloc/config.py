"""Allocator constants, settings and size rounding of PyTorch's CUDA caching allocator (v2.6).

Holds :class:`AllocatorConfig` (the ``PYTORCH_CUDA_ALLOC_CONF`` knobs the model honours), the
parsers that build it from a config string, a run file's ``[allocator]`` section or a snapshot's
``allocator_settings``, and the pure size functions ``round_size`` and ``allocation_size``
(reference: ``../shared/reference/allocator.md`` §1, §2, §6). It holds no allocator state and
does not model the garbage-collection threshold or memory fractions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from timeline.errors import UserError

if TYPE_CHECKING:
    from timeline.spec.run import AllocatorSpec

MIB = 1 << 20
K_MIN_BLOCK_SIZE = 512  # every size rounded up to a multiple of this
K_SMALL_SIZE = 1 * MIB  # largest "small" request
K_SMALL_BUFFER = 2 * MIB  # segment size for small requests; small-pool page size
K_MIN_LARGE_ALLOC = 10 * MIB  # requests in (1, 10) MiB get a 20 MiB segment
K_ROUND_LARGE = 2 * MIB  # requests >= 10 MiB: segment rounded up to this
K_LARGE_BUFFER = 20 * MIB  # large segment size; large-pool page size
NUM_INTERVALS = 16  # power-of-two intervals 1 MiB ... 32 GiB+ for roundup_power2_divisions
UNLIMITED = (1 << 64) - 1  # PyTorch's SIZE_MAX: max_split_size when unset


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorConfig:
    """The caching allocator's knobs, in bytes; defaults are PyTorch's.

    ``roundup_power2_divisions`` holds one division count per power-of-two interval
    (index = floor(log2 size) - 20, clamped to [0, 15]); 0 or 1 means plain 512-byte rounding.
    """

    max_split_size_bytes: int = UNLIMITED
    max_non_split_rounding_bytes: int = 20 * MIB
    expandable_segments: bool = False
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * NUM_INTERVALS)

    def __post_init__(self) -> None:
        if self.max_split_size_bytes != UNLIMITED and self.max_split_size_bytes <= 20 * MIB:
            raise UserError(f"max_split_size must be > 20 MiB, got {self.max_split_size_bytes} bytes")
        if self.max_non_split_rounding_bytes < 0:
            raise UserError(f"max_non_split_rounding must be 0 or more, got {self.max_non_split_rounding_bytes} bytes")
        if len(self.roundup_power2_divisions) != NUM_INTERVALS:
            raise UserError(f"roundup_power2_divisions needs {NUM_INTERVALS} entries")
        for d in self.roundup_power2_divisions:
            if d not in (0, 1) and not _is_pow2(d):
                raise UserError(f"roundup_power2_divisions values must be powers of two, got {d}")

    @property
    def has_max_split(self) -> bool:
        return self.max_split_size_bytes != UNLIMITED

    def divisions(self, size: int) -> int:
        """Division count of the power-of-two interval ``size`` falls in."""
        index = size.bit_length() - 1 - 20
        return self.roundup_power2_divisions[0 if index < 0 else min(index, NUM_INTERVALS - 1)]

    def to_dict(self) -> dict[str, Any]:
        """Plain settings in the snapshot's spelling (``-1`` = unlimited max_split_size)."""
        return {
            "max_split_size": -1 if not self.has_max_split else self.max_split_size_bytes,
            "max_non_split_rounding_size": self.max_non_split_rounding_bytes,
            "expandable_segments": self.expandable_segments,
            "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(self.roundup_power2_divisions)},
        }

    # -- constructors ---------------------------------------------------------------------------

    @classmethod
    def from_options(
        cls,
        *,
        max_split_size_mb: int | None = None,
        max_non_split_rounding_mb: int | None = None,
        expandable_segments: bool = False,
        roundup_power2_divisions: int | Mapping[str, int] | None = None,
    ) -> AllocatorConfig:
        """Build from run-file style values; ``max_split_size_mb`` of 0/None means unlimited."""
        return cls(
            max_split_size_bytes=max_split_size_mb * MIB if max_split_size_mb else UNLIMITED,
            max_non_split_rounding_bytes=(20 if max_non_split_rounding_mb is None else max_non_split_rounding_mb) * MIB,
            expandable_segments=bool(expandable_segments),
            roundup_power2_divisions=parse_divisions(roundup_power2_divisions or 0),
        )

    @classmethod
    def from_spec(cls, spec: AllocatorSpec) -> AllocatorConfig:
        """Build from a run file's ``[allocator]`` section."""
        rpd = spec.roundup_power2_divisions
        return cls.from_options(
            max_split_size_mb=spec.max_split_size_mb or None,
            max_non_split_rounding_mb=spec.max_non_split_rounding_mb,
            expandable_segments=spec.expandable_segments,
            roundup_power2_divisions=dict(rpd) if isinstance(rpd, tuple) else rpd,
        )

    @classmethod
    def from_snapshot_settings(cls, settings: Mapping[str, Any] | None) -> AllocatorConfig:
        """Build from a snapshot's ``allocator_settings`` dict (absent in ~2023 dumps → defaults)."""
        if not settings:
            return cls()
        mss = settings.get("max_split_size", -1)
        rounding = settings.get("max_non_split_rounding_size", 20 * MIB)
        table = settings.get("roundup_power2_divisions") or {}
        divs = [0] * NUM_INTERVALS
        if isinstance(table, Mapping):
            for key, value in table.items():
                index = int(key).bit_length() - 1
                if 0 <= index < NUM_INTERVALS:
                    divs[index] = int(value)
        elif isinstance(table, list | tuple) and len(table) == NUM_INTERVALS:
            divs = [int(v) for v in table]
        return cls(
            max_split_size_bytes=UNLIMITED if mss is None or int(mss) < 0 or int(mss) >= UNLIMITED else int(mss),
            max_non_split_rounding_bytes=int(rounding),
            expandable_segments=bool(settings.get("expandable_segments", False)),
            roundup_power2_divisions=tuple(divs),
        )

    @classmethod
    def parse(cls, conf: str) -> AllocatorConfig:
        """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` string such as ``expandable_segments:True,max_split_size_mb:128``."""
        options: dict[str, Any] = {}
        for key, value in _split_conf(conf):
            if key == "max_split_size_mb":
                options[key] = int(value)
            elif key == "max_non_split_rounding_mb":
                options[key] = int(value)
            elif key == "expandable_segments":
                options[key] = value.strip().lower() == "true"
            elif key == "roundup_power2_divisions":
                if value.startswith("["):
                    pairs = (item.split(":") for item in value.strip("[]").split(",") if item)
                    options[key] = {k.strip(): int(v) for k, v in pairs}
                else:
                    options[key] = int(value)
            # other keys (backend, garbage_collection_threshold, pinned_*) do not change the model
        return cls.from_options(**options)


def _split_conf(conf: str) -> list[tuple[str, str]]:
    """Split ``a:1,b:[x:1,>:2]`` into ``[("a", "1"), ("b", "[x:1,>:2]")]``."""
    items: list[tuple[str, str]] = []
    depth, start = 0, 0
    text = conf.strip()
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            part = text[start:i].strip()
            start = i + 1
            if not part:
                continue
            key, sep, value = part.partition(":")
            if not sep:
                raise UserError(f"allocator config item {part!r} has no ':'")
            items.append((key.strip(), value.strip()))
    return items


def parse_divisions(value: int | Mapping[str, int]) -> tuple[int, ...]:
    """Per-interval divisions from one int, or a table keyed by interval start (``"1MB"``, ``"256"``
    in MiB, ``">"`` for every later interval) as PyTorch accepts."""
    if isinstance(value, int):
        if value not in (0, 1) and not _is_pow2(value):
            raise UserError(f"roundup_power2_divisions must be a power of two, got {value}")
        return (value,) * NUM_INTERVALS
    divs = [0] * NUM_INTERVALS
    last_index = -1
    for key, d in value.items():
        d = int(d)
        if key.strip() == ">":
            for i in range(last_index + 1, NUM_INTERVALS):
                divs[i] = d
            continue
        mib = int(key.strip().upper().removesuffix("MB").removesuffix("MIB"))
        if not _is_pow2(mib):
            raise UserError(f"roundup_power2_divisions interval {key!r} must be a power of two (MiB)")
        index = min(mib.bit_length() - 1, NUM_INTERVALS - 1)
        if last_index < 0:
            for i in range(index):
                divs[i] = d
        divs[index] = d
        last_index = index
    return tuple(divs)


def round_size(size: int, config: AllocatorConfig) -> int:
    """PyTorch's ``round_size``: 512-byte multiples, or the next 1/d of the power-of-two interval."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = config.divisions(size)
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        rounded = size & ~(step - 1)
        return size if rounded == size else rounded + step
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """Segment size ``cudaMalloc``'d when nothing cached fits a rounded request of ``size``."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
