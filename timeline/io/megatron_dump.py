"""Read a Megatron-LM job's log: the arguments block it printed, as the job's arguments.

Every Megatron-LM training job prints, at the end of ``validate_args``, every attribute of its
parsed and validated arguments (``megatron/training/arguments.py: _print_args``): a line
``------------------------ arguments ------------------------``, then one line per attribute,
``'  {} {} {}'.format(name, '.' * (48 - len(name)), value)`` sorted case-insensitively, then
``-------------------- end of arguments ---------------------``. So a log holds the whole job, every
default included, at the version that ran it, where a launch script holds only what it changed.

This module turns that block back into the arguments the job was given, through the parser's own
table (``megatron_parser_dests.json``, built from Megatron-LM's parser at every release from
core_v0.12.0 to main by ``tools/megatron_parser_args.py``):

- **The version.** The block names every dest of the parser that ran, so the versions whose parser
  has exactly the block's dests (and the attributes Megatron's training code assigns besides,
  ``args.world_size = …``) are the candidates; the newest of them is taken unless the user names one.
- **The arguments.** A dest whose printed value is its default at that version is left out (as the
  user left it out); any other becomes the option that sets it: ``store_true`` / ``store_false`` /
  ``--X`` / ``--no-X`` by the value, a value option with its value (a list's items for ``nargs``
  options). ``validate_args`` converts a few values before printing them (dtype names to
  ``torch.float32``, enum names to ``AttnBackend.auto``); they are written back as the option
  takes them.
- **What the parser does not define.** An attribute no version's parser has and Megatron's training
  code does not assign is a fork's argument (Megatron-DeepSpeed's, Pai-Megatron-Patch's): with a value
  (not None, False, 0 or empty) it is passed on as ``--name`` so that ``from-megatron`` classifies
  it as it classifies a fork's argument in a launch script (refused by name unless ``--ignore-arg``).
- **The world size** is the block's ``world_size``.
- **Releases before core_v0.12.0** (core_v0.4.0 … core_v0.11.0, ``megatron_parser_older.json``: their parsers read
  from source by ``tools/megatron_parser_older.py``, since they do not build under the stubs) are told by the names
  only they print: a block one of them matches better than every later release is read as that release. Its own
  arguments at their defaults there are left out; ``use_mcore_models`` False before core_v0.8.0 (where the legacy
  model was the default) is ``--use-legacy-models``; ``use_dist_ckpt`` / ``dist_ckpt_format`` (0.6 … 0.8) are
  ``--ckpt-format``; the timing-only and logging ones are passed over (:data:`OLDER_MEANING`); any other with a
  value is passed on by its option, to be refused by name. The other names are read with core_v0.12.0's parser,
  whose rules the simulation runs.

An fp16 job's first iterations skip the optimizer step while its loss scale comes down, which
``from-megatron`` assumes of an fp16 job; a log's iteration lines say how many of each interval's
iterations skipped it (``number of skipped iterations``), so where one interval up to the memory line
stepped, the Adam moments are counted.

The rest of the log says more of the job: the model its entry script built (``building BERT model
...``: the family), the tokenizer's vocabulary (``padded vocab (size: N)``), ``get_model``'s parameter
count per (tensor, pipeline) rank (held against the run's own by ``from-megatron``), and the memory lines
(``report_memory``: ``[Rank R] (after N iterations) memory (MB) | allocated: … | max allocated: … |
reserved: … | max reserved: …``), for the run file's notes: what the job measured, beside what the
simulation predicts.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

#: the block's first line; whatever precedes the dashes on it (a timestamp, ``[default0]:``) precedes every line
HEADER = re.compile(r"^(?P<prefix>.*?)-{8,} arguments -{8,}[ \t]*\r?$", re.M)
END = re.compile(r"-{8,} end of arguments -{8,}")
#: one attribute, after the line's prefix: two spaces, ``name``, its dots (none for a name of 48 characters or more),
#: the value; or, once an editor has stripped the trailing space of an empty value, the name and its dots alone
LINE = re.compile(r"  (?P<name>[A-Za-z_][A-Za-z0-9_]*) (?:(?:\.+ | )(?P<value>.*?)|\.*)\s*$")
#: ``report_memory``'s line (megatron/training/utils.py), MiB as printed
MEMORY = re.compile(r"\[Rank (?P<rank>\d+)\] \(after (?P<it>\d+) iterations\) memory \(MB\) \| allocated: "
                    r"(?P<a>\d+(?:\.\d+)?) \| max allocated: (?P<ma>\d+(?:\.\d+)?) \| reserved: (?P<r>\d+(?:\.\d+)?) \| "
                    r"max reserved: (?P<mr>\d+(?:\.\d+)?)")
#: torch dtypes ``validate_args`` puts in place of the dtype options' names (``map_dtype`` / the
#: ``--main-grads-dtype`` … conversion: fp32, bf16, fp16, and fp8 as uint8 for ``--exp-avg-dtype``)
TORCH_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "fp8"}
#: the tokenizer's vocabulary as the job printed it when padding it (megatron/training/vocab_utils.py:
#: _vocab_size_with_padding, and megatron/core/tokenizers/utils/build_tokenizer.py at d98e8a64dd)
PADDED_VOCAB = re.compile(r"> padded vocab \(size: (?P<size>\d+)\) with (?P<dummy>\d+) dummy tokens")
#: ``training_log``'s line (megatron/training/training.py): the iteration, and how many of the interval's iterations
#: skipped the optimizer step (an fp16 gradient overflow)
ITERATION = re.compile(r"\biteration\s+(?P<it>\d+)/\s*\d+ \|.*?number of skipped iterations:\s*(?P<skipped>\d+)")
#: the model the entry script builds, as its ``model_provider`` prints it (gpt_builders.py, pretrain_bert.py,
#: pretrain_t5.py, pretrain_vlm.py, hybrid_builders.py, pretrain_mamba.py at d98e8a64dd and before) → the family
BUILDING = re.compile(r"building (?P<model>GPT|BERT|T5|a multimodal|Hybrid|Mamba) model \.\.\.")
BUILT_FAMILIES = {"GPT": "gpt", "BERT": "bert", "T5": "t5", "a multimodal": "vlm", "Hybrid": "hybrid",
                  "Mamba": "mamba"}
#: ``get_model``'s count of the parameters on a rank (megatron/training/training.py; ``gtp_weight_remat`` from
#: d98e8a64dd's GTP, absent before): tensor rank, pipeline rank, count
PARAMS = re.compile(r"number of parameters on \(tensor, (?:gtp_\w+, )?pipeline\) model parallel rank "
                    r"\((?P<tp>\d+), (?:\d+, )?(?P<pp>\d+)\): (?P<n>\d+)")
#: ``load_checkpoint``'s line (megatron/training/checkpointing.py, every release: "  successfully loaded checkpoint from
#: {load_dir} [ t …, p … ] at iteration {iteration}"): the job resumed, or fine-tuned, from a checkpoint
LOADED = re.compile(r"successfully loaded checkpoint from")
#: an outer launcher's label before a line (srun --label's "0: "), taken off a line's continuation
LABEL = re.compile(r"^\s*\d+:\s?")


def memory_lines(text: str) -> list[re.Match[str]]:
    """``report_memory``'s lines of ``text``, each read whole where the launcher's buffering cut it over the next
    lines (their outer label taken off): the line is joined with up to three following ones until it matches, and
    while its last number ends the line (a number cut in two)."""
    lines = text.splitlines()
    out = []
    for k, line in enumerate(lines):
        if "memory (MB)" not in line:
            continue
        joined, more = line, iter(lines[k + 1:k + 4])
        m = MEMORY.search(joined)
        while m is None or m.end() == len(joined.rstrip()):
            nxt = next(more, None)
            rest = LABEL.sub("", nxt, count=1) if nxt is not None else ""
            if nxt is None or (m is not None and not re.match(r"\.?\d", rest)):
                break
            joined += rest
            m = MEMORY.search(joined)
        if m is not None:
            out.append(m)
    return out


#: ``validate_args``'s own line (megatron/training/arguments.py: "using world size: N, data-parallel size: …"), read
#: where the block does not reach its ``world_size`` (a truncated log)
WORLD = re.compile(r"using world size: (?P<n>\d+)")
ENUM_VALUE = re.compile(r"[A-Z][A-Za-z0-9]*\.([A-Za-z0-9_]+)")
NULL: tuple[Any, ...] = (None, False, 0, "", (), [])
#: dests ``validate_args`` fills from another when the user gave one of the two (megatron/training/arguments.py:
#: validate_args at d98e8a64dd, and at every release from core_v0.12.0): printed equal, the first is left out, since
#: from-megatron completes it as Megatron does
FILLED_FROM: tuple[tuple[str, str], ...] = (
    ("encoder_num_layers", "num_layers"),  # "args.encoder_num_layers = args.num_layers" (or the other way)
    ("encoder_seq_length", "seq_length"),  # "args.encoder_seq_length = args.seq_length" (or the other way)
    ("hybrid_layer_pattern", "hybrid_override_pattern"),  # "args.hybrid_layer_pattern = args.hybrid_override_pattern"
)
#: options whose printed value ``validate_args`` moved elsewhere (megatron/training/arguments.py: validate_args at
#: d98e8a64dd, "emerging optimizer check": Muon with --use-distributed-optimizer prints use_distributed_optimizer
#: False and use_layer_wise_distributed_optimizer True): (printed attribute, its value, the option it stands for)
RESTORED: tuple[tuple[str, Any, str], ...] = (
    ("use_layer_wise_distributed_optimizer", True, "--use-distributed-optimizer"),
)
#: an enum member as ``str()`` prints it inside a list (``[<CudaGraphModule.attn: 1>]``)
ENUM_REPR = re.compile(r"<[A-Z][A-Za-z0-9]*\.([A-Za-z0-9_]+): [^<>]*>")


@dataclass(frozen=True, slots=True)
class MemoryLine:
    """One ``report_memory`` line of the log (MiB)."""

    rank: int
    iteration: int
    allocated: float
    max_allocated: float
    reserved: float
    max_reserved: float

    def note(self) -> str:
        return (f"the log's report_memory, rank {self.rank} after {self.iteration} iterations: allocated "
                f"{self.allocated:,.1f} MiB, max allocated {self.max_allocated:,.1f} MiB, reserved "
                f"{self.reserved:,.1f} MiB, max reserved {self.max_reserved:,.1f} MiB")


@dataclass(frozen=True, slots=True)
class DumpArgs:
    """A printed arguments block read back: the options that set it, the version that printed it."""

    args: dict[str, Any]
    world_size: int | None
    version: str  # the parser's label (core_v0.15.0, main)
    megatron_core: str  # that version's Megatron-Core version
    notes: tuple[str, ...] = ()
    memory: tuple[MemoryLine, ...] = field(default=())
    #: the tokenizer's vocabulary the log printed (``padded vocab (size: N)``): the job's, where no tokenizer file
    #: is on this machine
    vocab_size: int | None = None
    #: ``get_model``'s parameter counts: (tensor rank, pipeline rank, parameters), each pair once
    param_counts: tuple[tuple[int, int, int], ...] = ()
    #: the model family the log says the entry script built (``building BERT model ...``); None where it says none
    family: str | None = None
    family_line: str = ""
    #: the iteration lines (up to the first memory line, where there is one) show an optimizer step taken (an
    #: interval with fewer skipped iterations than it ran)
    optimizer_stepped: bool = False
    #: the log says the job loaded a checkpoint before its iterations (``successfully loaded checkpoint from …``)
    loaded_checkpoint: bool = False


@cache
def table() -> dict[str, Any]:
    return dict(json.loads((Path(__file__).parent / "megatron_parser_dests.json").read_text()))


def has_arguments_block(text: str) -> bool:
    return HEADER.search(text) is not None


def printed_block(text: str) -> tuple[dict[str, str], int]:
    """The first arguments block of ``text``: name → the value as printed; and how many blocks the text holds
    (a job restarted in one log prints one each time). Each line carries the header's prefix, its digits free (a
    launcher's ``[default0]:``, a timestamp per line)."""
    blocks = list(HEADER.finditer(text))
    start = blocks[0]
    values: dict[str, str] = {}
    parts = start.group("prefix").split()
    # the prefix, and each of its leading parts (srun's "0: " of "0: [default0]:"), its digits free
    prefixes = [re.compile(_digits_free(start.group("prefix")))]
    prefixes += [re.compile(r"\s*".join(_digits_free(p) for p in parts[:k]) + r"\s?") for k in range(len(parts) - 1, -1, -1)]
    # the inner launcher's prefix ("[default0]:"), where an outer one precedes it
    inner = re.compile(_digits_free(parts[-1])) if len(parts) > 1 else None
    last: tuple[str, str] | None = None  # the last attribute's name and its line's text after the prefix
    head = ""  # the start of a line the outer launcher cut before its inner prefix ended ("0: [")
    end = END.search(text, start.end())
    again = blocks[1].start() if len(blocks) > 1 else None  # a restart's block: the first one ends before it
    if end is not None and again is not None and again < end.start():
        end = None
    closed = end is not None  # the block's closing line is there: a line in it that is no attribute's is skipped
    stop = end.start() if end is not None else again
    for line in text[start.end():stop].splitlines()[1:]:
        p = prefixes[0].match(line)
        m = LINE.fullmatch(line, p.end() if p else 0)
        cut = p or next(filter(None, (q.match(line) for q in prefixes[1:])), None) if m is None else None
        if cut is not None and last is not None:
            # a line the launcher's output buffering cut in two, its second part under the outer launcher's prefix
            # alone (srun's "0: " of "0: [default0]:"), or under the whole prefix where there is no inner one
            rest = line[cut.end():]
            piece = rest.strip()
            if not piece:
                continue  # an empty line between two attributes
            if inner is not None and not head and not inner.match(piece) and re.fullmatch(r"\[[A-Za-z]*\d*\]?:?", piece):
                head = piece  # "[" of "[default0]:": the next piece ends it
                continue
            if head and inner is not None and (p := inner.match(head + rest)) is not None:
                line, head = head + rest, ""
                m = LINE.fullmatch(line, p.end())
            elif not prefixes[0].match(rest.lstrip()) and (p is None or _continues(values[last[0]], rest)):
                # under the outer prefix alone the piece is the same process's (another's carries its own inner
                # prefix); under the whole prefix, only what cannot start a line of its own: the dots, a value the
                # line did not reach, a list or string left open, a number's digits
                joined = LINE.fullmatch(last[1] + rest)
                if joined is not None and joined.group("name") == last[0]:
                    values[last[0]] = (joined.group("value") or "").strip()
                    last = (last[0], last[1] + rest)
                    continue
        if m is None:
            if values and not closed:
                break  # the block ended without its closing line (a truncated log)
            continue  # another process's line among the block's (srun interleaves its tasks' output)
        values.setdefault(m.group("name"), m.group("value") or "")
        last = (m.group("name"), line[p.end() if p else 0:])
    return values, len(blocks)


def _digits_free(text: str) -> str:
    """``text`` as a pattern in which every run of digits matches any (a rank, a timestamp)."""
    return re.sub(r"\\?\d+", r"\\d+", re.escape(text))


def _continues(value: str, rest: str) -> bool:
    """Whether ``rest``, a line under the block's whole prefix that is no attribute's, is the rest of the attribute
    printed as ``value`` (srun's label alone is the whole prefix: another process's line carries it too)."""
    unclosed = value.count("[") > value.count("]") or value.count("'") % 2 == 1
    digits = bool(re.search(r"[\d.]$", value)) and bool(re.match(r"\d", rest))
    return rest.lstrip().startswith(".") or not value or unclosed or digits


def parse_value(text: str) -> Any:
    """A printed value (``str()`` of it) as Python: None, booleans, numbers, lists; an enum or torch dtype as the
    name the option takes; anything else the string itself."""
    if text in TORCH_DTYPES:
        return TORCH_DTYPES[text]
    m = ENUM_VALUE.fullmatch(text)
    if m and not text.startswith("torch."):
        return m.group(1)
    text = ENUM_REPR.sub(lambda e: repr(e.group(1)), text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def same(a: Any, b: Any) -> bool:
    """Printed value ``a`` equals default ``b`` (numbers by value, lists item by item)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def default_of(row: list[Any]) -> Any:
    """The option's default (its repr, as the parser table keeps it) as Python."""
    return parse_value(row[3]) if isinstance(row[3], str) else row[3]


def _scores(names: set[str], dests: dict[str, list[list[Any]]], assigned: dict[str, str],
            count: int) -> list[tuple[int, int, int]]:
    """Per version of a parser table: (printed names it does not know, its parser's dests not printed, index)."""
    out = []
    for i in range(count):
        parser = {d for d, rows in dests.items() if any(r[4][i] == "1" for r in rows)}
        known = parser | {a for a, bits in assigned.items() if bits[i] == "1"}
        out.append((len(names - known), len(parser - names), i))
    return out


def infer_version(names: set[str], megatron_core: str | None) -> tuple[int, str]:
    """The index of the parser version that printed ``names``, and a note on how it was chosen."""
    t = table()
    labels = [v[0] for v in t["versions"]]
    if megatron_core is not None:
        exact = [i for i, v in enumerate(t["versions"]) if v[1] == megatron_core]
        if exact:
            return exact[-1], ""
        older = [i for i, v in enumerate(t["versions"]) if _ver(v[1]) <= _ver(megatron_core)]
        i = older[-1] if older else 0
        return i, f"--megatron-core {megatron_core}: its arguments read with core {t['versions'][i][1]}'s parser"
    # first every printed name known to the version (a parser dest or an attribute its training code assigns);
    # then the fewest dests of its parser not printed (validate_args deletes its deprecated ones, and an
    # extra_args_provider's are there only where its package imports)
    scores = _scores(names, t["dests"], t["assigned"], len(labels))
    best = min(s[:2] for s in scores)
    tied = [i for *s, i in scores if tuple(s) == best]
    i = tied[-1]
    span = labels[tied[0]] if len(tied) == 1 else f"{labels[tied[0]]} … {labels[tied[-1]]}"
    if best[0] == 0:
        note = (f"the log's arguments block matches with every name the parser of {span}: read as Megatron-Core "
                f"{t['versions'][i][1]} ({labels[i]}); give --megatron-core to choose another")
    else:
        note = (f"the log's arguments block holds {best[0]} names no release's parser from core_v0.12.0 to main "
                f"prints (an older Megatron-LM's or a fork's): read with the nearest, {span}, as Megatron-Core "
                f"{t['versions'][i][1]}; give --megatron-core to choose another")
    return i, note


@cache
def older_table() -> dict[str, Any]:
    """The parsers of core_v0.4.0 … core_v0.11.0 (``tools/megatron_parser_older.py``, read from their source)."""
    return dict(json.loads((Path(__file__).parent / "megatron_parser_older.json").read_text()))


def older_release(names: set[str], megatron_core: str | None) -> tuple[int, str] | None:
    """The release before core_v0.12.0 that printed ``names`` (an index of :func:`older_table`'s versions, and a
    note), where one matches them better than every release from core_v0.12.0 (or ``megatron_core`` is one);
    None otherwise."""
    o, t = older_table(), table()
    labels = [v[0] for v in o["versions"]]
    if megatron_core is not None:
        if _ver(megatron_core) >= _ver(t["versions"][0][1]):
            return None
        older = [j for j, v in enumerate(o["versions"]) if _ver(v[1]) <= _ver(megatron_core)]
        j = older[-1] if older else 0
        return j, (f"--megatron-core {megatron_core}: the arguments only releases before core_v0.12.0 have read with "
                   f"{labels[j]}'s parser, the others with core_v0.12.0's")
    new = min(s[:2] for s in _scores(names, t["dests"], t["assigned"], len(t["versions"])))
    scores = _scores(names - set(t["assigned"]), o["dests"], o["assigned"], len(labels))
    best = min(s[:2] for s in scores)
    if best >= new:
        return None
    tied = [j for *s, j in scores if tuple(s) == best]
    j = tied[-1]
    span = labels[tied[0]] if len(tied) == 1 else f"{labels[tied[0]]} … {labels[tied[-1]]}"
    return j, (f"the log's arguments block is a release's before core_v0.12.0, {span} (its parser read from source: "
               f"{best[0]} printed names it lacks, {best[1]} of its dests not printed): read as Megatron-Core "
               f"{o['versions'][j][1]}, its own arguments with that parser and the others with core_v0.12.0's, "
               "whose rules the simulation runs; give --megatron-core to choose another")


#: arguments only releases before core_v0.12.0 have, given a value other than their default: what each does to the
#: job's memory (megatron/training/arguments.py, or megatron/arguments.py before core_v0.7.0, at those releases)
OLDER_MEANING: dict[str, str] = {
    "delay_grad_reduce": "timing only: whether the overlapped gradient reduce waits for the last stage "
                         "(--no-delay-grad-reduce; the buckets are the same)",
    "delay_param_gather": "timing only: the overlapped parameter all-gather delayed to the first micro-batch's "
                          "forward (the buffers are the same)",
    "log_batch_size_to_tensorboard": "logging", "log_learning_rate_to_tensorboard": "logging",
    "one_logger_entity": "logging", "use_mcore_models": "the Megatron-Core model, the default from core_v0.8.0",
}


def _older_arguments(printed: dict[str, str], j: int) -> tuple[dict[str, Any], list[str]]:
    """The options (and notes) of the printed names only releases before core_v0.12.0 have, at release ``j``."""
    o, t = older_table(), table()
    args: dict[str, Any] = {}
    at_default: list[str] = []
    neutral: list[str] = []
    has = {d for d, rows in o["dests"].items() if any(r[4][j] == "1" for r in rows)}
    # before core_v0.8.0 the legacy model unless --use-mcore-models: use_mcore_models says which model, no option
    mcore_flag = "use_mcore_models" in has and "use_legacy_models" not in has
    if mcore_flag and parse_value(printed.get("use_mcore_models", "True")) is False:
        args["--use-legacy-models"] = True
    if "ckpt_format" not in has:  # before core_v0.9.0: torch's own format unless --use-dist-ckpt (0.6 … 0.8)
        dist = parse_value(printed.get("use_dist_ckpt", "False")) is True
        ckpt = str(parse_value(printed.get("dist_ckpt_format", "torch_dist"))) if dist else "torch"
        if not same(ckpt, default_of(t["dests"]["ckpt_format"][0])):
            args["--ckpt-format"] = ckpt
    for name, raw in printed.items():
        if name in t["dests"] or name in t["assigned"] or name not in has:
            continue
        rows = [r for r in o["dests"][name] if r[4][j] == "1"]
        value = parse_value(raw)
        if same(value, parse_value(rows[0][3])) or (name == "use_mcore_models" and mcore_flag):
            at_default.append(name)
        elif name in ("use_dist_ckpt", "dist_ckpt_format"):
            continue  # read as --ckpt-format (above)
        elif name in OLDER_MEANING:
            neutral.append(f"{name} ({OLDER_MEANING[name]})")
        else:  # passed on by its option, for from-megatron to classify (refused by name unless --ignore-arg)
            row = rows[0]
            args[row[0]] = True if isinstance(value, bool) else str(value)
    notes = []
    if at_default:
        notes.append(f"{len(at_default)} arguments only releases before core_v0.12.0 have are at their default "
                     f"there: {', '.join(sorted(at_default)[:6])}" + (" …" if len(at_default) > 6 else ""))
    if neutral:
        notes.append("memory-neutral arguments of releases before core_v0.12.0, passed over: " + ", ".join(neutral))
    return args, notes


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def option_for(dest: str, value: Any, i: int) -> tuple[str, Any] | None:
    """The option (and its value: True for a flag) that gives ``dest`` the printed ``value`` at version ``i``;
    None where ``value`` is the default there."""
    rows = [r for r in table()["dests"][dest] if r[4][i] == "1"]
    if not rows or same(value, default_of(rows[0])):
        return None
    flags = [r for r in rows if r[1] in ("store_true", "store_false", "boolean_optional")]
    if flags and isinstance(value, bool):
        for r in flags:
            if r[1] == "store_true" and value or r[1] == "store_false" and not value:
                return r[0], True
            if r[1] == "boolean_optional" and r[0].startswith("--no-") != value:
                return r[0], True
        return None  # no option of this dest sets the value (a store_false's True is its default)
    row = next((r for r in rows if r[1] == "store"), rows[0])
    if row[1] != "store":
        return None  # store_const / append / count: not in a parser from core_v0.12 on with a printed value
    if isinstance(value, list | tuple) and row[2] not in (None, 0):
        return row[0], tuple(str(v) for v in value)
    if value is None:
        return None  # an option cannot give None back (a default computed elsewhere)
    return row[0], str(list(value)) if isinstance(value, list | tuple) else str(value)


def read_dump(text: str, megatron_core: str | None = None) -> DumpArgs:
    """The arguments the job printed in ``text`` was given (see the module docstring)."""
    t = table()
    labels = [v[0] for v in t["versions"]]
    printed, blocks = printed_block(text)
    i, how = infer_version(set(printed), megatron_core)
    older = older_release(set(printed), megatron_core)
    if older is not None:  # a release before core_v0.12.0: its own arguments read with its parser
        how = older[1]
        old_args, old_notes = _older_arguments(printed, older[0])
        printed = {k: v for k, v in printed.items() if k in t["dests"] or k in t["assigned"]
                   or k not in older_table()["dests"] and k not in older_table()["assigned"]}
    notes = [n for n in (how,) if n]
    if older is not None:
        notes += old_notes
    if blocks > 1:
        notes.append(f"the log holds {blocks} arguments blocks (a restarted job); the first is read")
    args: dict[str, Any] = {}
    foreign_null: list[str] = []
    filled = {a for a, b in FILLED_FROM if a in printed and b in printed and printed[a] == printed[b]}
    heads = parse_value(printed.get("num_attention_heads", "None"))
    if isinstance(heads, int) and heads > 0 and printed.get("kv_channels") == str(
            parse_value(printed.get("hidden_size", "0")) // heads):
        filled.add("kv_channels")  # validate_args: "args.kv_channels = args.hidden_size // args.num_attention_heads"
    for name, raw in printed.items():
        if name in filled:
            continue
        value = parse_value(raw)
        if any(r[4][i] == "1" for r in t["dests"].get(name, ())):
            got = option_for(name, value, i)
            if got is not None:
                args[got[0]] = got[1]
        elif name in t["assigned"] or name in t["dests"]:
            continue  # what parse_args / validate_args compute (world_size, params_dtype, …)
        elif value in NULL:
            foreign_null.append(name)
        else:  # a fork's own argument, passed on for from-megatron to classify by name
            opt = "--" + name.replace("_", "-")
            args[opt] = True if value is True else (tuple(str(v) for v in value) if isinstance(value, list)
                                                    else str(value))
    for name, value, option in RESTORED:
        if parse_value(printed.get(name, "None")) == value:
            args[option] = True
    if older is not None:
        args.update(old_args)
    if foreign_null:
        notes.append(f"{len(foreign_null)} printed names no Megatron-LM parser defines hold no value (None, False, "
                     f"0, empty) and are passed over: {', '.join(sorted(foreign_null)[:8])}"
                     + (" …" if len(foreign_null) > 8 else ""))
    world = parse_value(printed.get("world_size", "None"))
    if not isinstance(world, int) and (said := WORLD.search(text)):
        world = int(said["n"])
    memory = tuple(MemoryLine(int(m["rank"]), int(m["it"]), float(m["a"]), float(m["ma"]), float(m["r"]),
                              float(m["mr"])) for m in memory_lines(text))
    vocab = PADDED_VOCAB.search(text)
    built = BUILDING.search(text)
    counts = {(int(m["tp"]), int(m["pp"])): int(m["n"]) for m in PARAMS.finditer(text)}
    stepped, last = False, 0
    for m in ITERATION.finditer(text):
        it = int(m["it"])
        if memory and it > memory[0].iteration:
            break
        stepped |= int(m["skipped"]) < it - last
        last = it
    return DumpArgs(args=args, world_size=world if isinstance(world, int) and world > 0 else None,
                    version=older_table()["versions"][older[0]][0] if older else labels[i],
                    megatron_core=megatron_core or (older_table()["versions"][older[0]][1] if older
                                                    else t["versions"][i][1]), notes=tuple(notes),
                    memory=memory, vocab_size=int(vocab["size"]) if vocab else None,
                    optimizer_stepped=stepped, family=BUILT_FAMILIES[built["model"]] if built else None,
                    family_line=built.group(0) if built else "",
                    param_counts=tuple((t, p, n) for (t, p), n in sorted(counts.items())),
                    loaded_checkpoint=LOADED.search(text) is not None)
