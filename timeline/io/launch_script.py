"""A launch script read as bash would hand its arguments to the Megatron-LM entry point — without running it.

Megatron-LM's own examples (``examples/gpt3/train_gpt3_175b_distributed.sh``, ``examples/llama/…``,
``examples/mixtral/…``) and most users' jobs are bash scripts: variables, arrays of arguments
(``MODEL_ARGS=( --num-layers 32 … )``), ``${ARR[@]}`` expansions on a ``torchrun … pretrain_gpt.py …`` line,
defaults (``${TP:-2}``), arithmetic (``$((GPUS_PER_NODE*NUM_NODES))``) and ``if`` blocks choosing arguments. This
module reads that subset of bash (bash(1): *QUOTING*, *PARAMETERS*, *EXPANSION*, *Arrays*, ``[[ … ]]`` / ``test``)
and nothing else — a script is never executed:

* assignments (``export`` too: the job's environment), indexed arrays and ``+=``; ``$NAME``, ``${NAME}``,
  ``${NAME:-word}`` / ``${NAME-word}`` / ``${NAME:=word}`` / ``${NAME:+word}``, ``${ARR[@]}`` (one word per element
  when quoted, split on whitespace when not), ``${ARR[i]}``, ``$((…))`` over integers, ``$#`` (0: the script runs
  without positional arguments, so ``$1`` is empty and ``${1:-default}`` is the default);
* ``if`` / ``elif`` / ``else`` on ``[ … ]`` / ``[[ … ]]`` conditions joined by ``&&``, ``||`` and ``!``: string
  (``=``, ``==``, ``!=``), integer (``-eq`` … ``-ge``) and ``-n`` / ``-z`` tests; ``while``/``until`` whose
  condition is false on entry;
* the invocation: the first command with a Megatron entry script (``pretrain_*.py``, ``train*.py`` and the like,
  possibly through a variable) — the words after it are the job's arguments, ``VAR=value`` words before the
  launcher its environment, and ``torchrun`` / ``python -m torch.distributed.run``'s ``--nproc_per_node`` ×
  ``--nnodes`` its world size.

A variable the script never sets is empty where bash would read it empty, except as an argument's value, which
keeps its ``$NAME`` text so the mapping can say which argument needs it. A file test, a command substitution or
a loop that decides an assignment or the invocation is refused with its line: deciding it means running the
script.
"""

from __future__ import annotations

import fnmatch
import operator
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from timeline.errors import UserError
from timeline.io.megatron_args import VAR_RE, ansi_c_body
from timeline.io.megatron_table import ENV_MAPPED

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
ASSIGN_RE = re.compile(rf"^({NAME})(\+?)=")
ENTRY_RE = re.compile(r"(^|/)(pretrain_[A-Za-z0-9_]+|train[A-Za-z0-9_]*|finetune[A-Za-z0-9_]*)\.py$")
#: commands that print their arguments rather than run them
PRINTERS = ("echo", "printf", "logger")
#: path utilities whose output is a path computed from their operands (:func:`_path_tool`)
PATH_TOOLS = ("dirname", "basename", "realpath", "readlink")
#: commands that handle an entry script as a file (copy it, patch it, show it) rather than run it
FILE_TOOLS = frozenset(("cp", "mv", "ln", "rm", "cat", "ls", "chmod", "chown", "touch", "scp", "rsync", "wget", "curl",
                        "sed", "awk", "grep", "head", "tail", "diff", "git", "tar", "vi", "vim", "less", "stat", "wc"))
#: a word is one or more (text, quoting) parts: "" unquoted, "'" single, '"' double; "$" a $(…) or `…` substitution
Part = tuple[str, str]
Word = list[Part]


@dataclass
class Launch:
    """The entry script's arguments, the environment, the launcher's world size (None when it does not say)."""

    words: list[str]
    script: str
    env: dict[str, str] = field(default_factory=dict)
    world_size: int | None = None
    launcher: list[str] = field(default_factory=list)
    jobs: int = 1  # how many Megatron invocations the script runs (a sweep's loop): this is the first
    notes: list[str] = field(default_factory=list)  # what reading assumed (a sourced file not found)


# --------------------------------------------------------------------------------------------- lexing
@dataclass
class _Cmd:
    """A simple command: its words and the operators among them (``&&``, ``||``, ``!``, ``|``), its line; or an
    array assignment (``array`` = the name, ``append``, the element words)."""

    words: list[Word | str]
    line: int
    array: str = ""
    append: bool = False
    guard: list[Word | str] = field(default_factory=list)  # `test && ARR+=( … )`: the list before the array


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """The index after the ``close`` matching ``text[i] == open_`` (quotes skipped)."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "'" and open_ != "'":
            j = text.index("'", j + 1) + 1 if "'" in text[j + 1:] else len(text)
            continue
        if c == '"' and open_ != '"':
            j = _dquote_end(text, j + 1)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise UserError(f"unclosed {open_!r} in the launch script")


def _dquote_end(text: str, j: int) -> int:
    while j < len(text) and text[j] != '"':
        if text[j] == "\\":
            j += 1
        elif text.startswith("$(", j) or text.startswith("${", j):
            j = _matching(text, j + 1, text[j + 1], ")" if text[j + 1] == "(" else "}") - 1
        j += 1
    return j + 1


def _dollar(text: str, i: int) -> int:
    """The index after a ``$…`` expansion starting at ``text[i] == '$'``."""
    if text.startswith("$((", i):
        return _matching(text, i + 1, "(", ")")
    if text.startswith("$(", i):
        return _matching(text, i + 1, "(", ")")
    if text.startswith("${", i):
        return _matching(text, i + 1, "{", "}")
    m = re.compile(rf"{NAME}|[0-9#@*?$!-]").match(text, i + 1)
    return m.end() if m else i + 1


def _lex(text: str) -> list[_Cmd]:
    """The script's simple commands in order (comments, continuations and quoting as bash reads them)."""
    cmds: list[_Cmd] = []
    words: list[Word | str] = []
    word: Word = []
    line = 1
    i = 0
    array: tuple[str, bool, int] | None = None  # inside NAME=( … ): name, append, line
    guard: list[Word | str] = []
    heredocs: list[tuple[str, bool]] = []  # here-documents begun on this line: (delimiter, leading tabs stripped)

    def end_word() -> None:
        nonlocal word
        if word:
            words.append(word)
            word = []
            if len(words) == 3 and array is None and all(isinstance(w, list) for w in words) \
                    and [_Shell._plain(words[0]), _Shell._plain(words[2])] == ["case", "in"]:
                end_cmd()  # `case WORD in` ends there: its first clause may follow on the same line
            elif len(words) == 1 and array is None and _Shell._plain(words[0]) in ("do", "then", "else"):
                end_cmd()  # a keyword opening a body is a command of its own (`do case $1 in`, `then A=1`)

    def end_cmd() -> None:
        nonlocal words
        end_word()
        if words and array is None:
            cmds.append(_Cmd(words, start))  # the line the command starts on, continuations after it
            words = []

    start = line
    while i < len(text):
        c = text[i]
        if not words and not word and array is None:
            start = line
        if c == "\n":
            if array is None:
                end_cmd()
            else:
                end_word()
            line += 1
            i += 1
            for delim, tabs in heredocs:  # a here-document's lines are its command's input, not commands
                while i < len(text):
                    end = text.find("\n", i)
                    body_line = text[i:end if end >= 0 else len(text)]
                    i = end + 1 if end >= 0 else len(text)
                    line += 1
                    if (body_line.lstrip("\t") if tabs else body_line).rstrip("\r") == delim:
                        break
            heredocs.clear()
        elif c in " \t\r":
            end_word()
            i += 1
        elif c == "#" and not word:
            i = text.find("\n", i) if "\n" in text[i:] else len(text)
        elif c == "\\" and text.startswith(("\n", "\r\n"), i + 1):
            # a line continuation (bash(1), QUOTING) — outside a comment only: a comment ends at its newline
            i += 2 if text[i + 1] == "\n" else 3
            line += 1
        elif c == "\\":
            word.append((text[i + 1:i + 2], "'"))
            i += 2
        elif c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise UserError(f"line {line}: unclosed ' in the launch script")
            word.append((text[i + 1:j], "'"))
            line += text.count("\n", i, j)
            i = j + 1
        elif text.startswith("$'", i):
            body, j = ansi_c_body(text, i + 2)
            word.append((body, "'"))
            i = j
        elif c == '"':
            j = _dquote_end(text, i + 1)
            # inside double quotes a backslash-newline is removed too; inside single quotes it stays
            word.append((re.sub(r"(?<!\\)\\\r?\n", "", text[i + 1:j - 1]), '"'))
            line += text.count("\n", i, j)
            i = j
        elif c == "$":
            j = _dollar(text, i)
            word.append((text[i:j], "$" if text.startswith("$(", i) and not text.startswith("$((", i) else ""))
            i = j
        elif c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise UserError(f"line {line}: unclosed ` in the launch script")
            word.append((text[i:j + 1], "$"))
            i = j + 1
        elif text.startswith("((", i) and not word and array is None:
            # an arithmetic command or a C-style for's header: one word to its matching ))
            j = _matching(text, i + 1, "(", ")")  # after the inner (…): the outer's ) comes next
            if j >= len(text) or text[j] != ")":
                raise UserError(f"line {line}: (( without its matching )) in the launch script")
            word.append((text[i + 2:j - 1], "("))
            line += text.count("\n", i, j)
            i = j + 1
        elif c == "(" and array is None and len(word) == 1 and word[0][1] == "" \
                and re.fullmatch(rf"{NAME}\+?=", word[0][0]):
            array = (word[0][0].split("+")[0].rstrip("="), word[0][0].endswith("+="), line)
            word = []
            guard, words = words, []  # the commands before it in its && / || list
            i += 1
        elif c == ")" and array is not None:
            end_word()
            cmds.append(_Cmd(words, array[2], array=array[0], append=array[1], guard=guard))
            words = []
            array = None
            i += 1
        elif c in ";&|" and array is None:
            op = text[i:i + 2] if text[i:i + 2] in ("&&", "||", ";;") else c
            end_word()
            if op in ("&&", "||", "|"):
                words.append(op)
            else:
                end_cmd()
                if op == ";;" and array is None:  # a `case` clause's end, kept for _case
                    cmds.append(_Cmd([[(";;", "")]], line))
            i += len(op)
        elif c in "<>" and array is None:
            if len(word) == 1 and word[0][1] == "" and word[0][0].isdigit():
                word = []  # 2>&1: the digits name the redirected descriptor, not a word
            end_word()
            j = i + 1
            while j < len(text) and text[j] in "<>&0123456789-":
                j += 1
            op, i = text[i:j], j
            if op == "<<<":  # a here-string: the word after it is the command's input (read by `read`)
                words.append([("<<<", "")])
                continue
            if op.startswith("<<"):  # a here-document: its delimiter word (quoted or not), the body from next line
                while i < len(text) and text[i] in " \t":
                    i += 1
                m = re.match(r"'([^']*)'|\"([^\"]*)\"|([^\s;&|<>]+)", text[i:])
                if m:
                    heredocs.append((next(g for g in m.groups() if g is not None), op.endswith("-")))
                    i += m.end()
                continue
            if re.search(r"&[0-9-]", op):  # >&2, 2>&1: a descriptor, no target word
                continue
            while i < len(text) and text[i] in " \t":
                i += 1
            while i < len(text) and text[i] not in " \t\n;&|":  # the redirection's target word
                i += 1
        else:
            j = i
            while j < len(text) and text[j] not in " \t\r\n'\"$`\\;&|<>#()":
                j += 1
            if j == i:  # a parenthesis outside an array: a subshell or a function's (), kept as a word
                j = i + 1
            word.append((text[i:j], ""))
            i = j
    if array is not None:
        raise UserError(f"line {array[2]}: the array {array[0]}=( … ) is never closed")
    end_cmd()
    return cmds


# --------------------------------------------------------------------------------------------- expansion


class _Undecidable(Exception):
    """An expansion or test that only running the script would decide."""


#: the value of a variable only an undecidable test assigns (``if [ -d /opt/x ]; then AUTO_RESUME=…; fi``): it
#: refuses where it reaches the job's arguments, a test or arithmetic, and drops from the launcher's words
UNDECIDED_RE = re.compile(rf"\x00undecided:({NAME})\x00")


def _undecided(name: str) -> str:
    """The value standing for ``name``'s undecided one (found again by :data:`UNDECIDED_RE`)."""
    return f"\x00undecided:{name}\x00"


def _only_assignments(cmds: list[_Cmd]) -> list[tuple[str, bool]] | None:
    """The names ``cmds`` assign, each with whether it is exported, when they are assignments only (``A=1``,
    ``export B="x y"``, with ``echo`` lines between), else None."""
    names = []
    for c in cmds:
        words = [w for w in c.words if isinstance(w, list)]
        if words and _Shell._plain(words[0]) in PRINTERS and all(isinstance(w, list) for w in c.words):
            continue  # `echo "enabling --auto-resume"`: prints, runs nothing
        exported = bool(words) and _Shell._plain(words[0]) == "export"
        if exported:
            words = words[1:]
        if c.array or len(words) != 1 or len(c.words) != len(words) + exported:
            return None
        m = ASSIGN_RE.match("".join(t for t, _ in words[0]))
        if not m or words[0][0][1] != "":
            return None
        names.append((m.group(1), exported))
    return names


_ARITH_TOKEN = re.compile(rf"\s*(?:(\d+)|({NAME})|(\*\*|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%()<>!~&|^?:]))")
#: bash's binary operators (bash(1) ARITHMETIC EVALUATION), loosest first
_BINARY = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, "<=": 7, ">": 7, ">=": 7,
           "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10, "**": 11}


def _c_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as C (and bash) divide."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _int64(x: int) -> int:
    """``x`` as bash's ``intmax_t`` holds it: 64-bit two's complement, wrapping."""
    return (x + (1 << 63)) % (1 << 64) - (1 << 63)


def _apply(op: str, a: int, b: int) -> int:
    return _int64(_apply_wide(op, a, b))


def _apply_wide(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        q = _c_div(a, b)
        return q if op == "/" else a - b * q
    if op == "**":
        if b < 0:
            raise ValueError("negative exponent")
        return pow(a, b, 1 << 64)
    if op in ("<<", ">>"):  # the shift count as the hardware masks it
        return a << (b & 63) if op == "<<" else a >> (b & 63)
    table = {"||": lambda: int(bool(a) or bool(b)), "&&": lambda: int(bool(a) and bool(b)), "|": lambda: a | b,
             "^": lambda: a ^ b, "&": lambda: a & b, "==": lambda: int(a == b), "!=": lambda: int(a != b),
             "<": lambda: int(a < b), "<=": lambda: int(a <= b), ">": lambda: int(a > b),
             ">=": lambda: int(a >= b), "+": lambda: a + b,
             "-": lambda: a - b, "*": lambda: a * b}
    return table[op]()


def _arith(text: str, lookup: Callable[[str], int]) -> int:
    """Evaluate bash integer arithmetic: the ternary ``?:``, the binary operators of :data:`_BINARY` at their
    precedence (``**`` right-associative), unary ``- + ! ~``, parentheses, numbers and names (``lookup``)."""
    tokens: list[str] = []
    i = 0
    while i < len(text):
        if text[i:].strip() == "":
            break
        m = _ARITH_TOKEN.match(text, i)
        if not m:
            raise ValueError(f"unexpected {text[i:]!r}")
        tokens.append(m.group(1) or m.group(2) or m.group(3))
        i = m.end()
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def unary() -> int:
        t = take()
        if t in ("-", "+", "!", "~"):
            v = unary()
            return _int64({"-": -v, "+": v, "!": int(not v), "~": ~v}[t])
        if t == "(":
            v = ternary()
            if take() != ")":
                raise ValueError("unbalanced parenthesis")
            return v
        if t.isdigit():
            return _int64(int(t))
        if re.fullmatch(NAME, t):
            return lookup(t)
        raise ValueError(f"unexpected {t!r}")

    def binary(level: int) -> int:
        left = unary()
        while (op := peek()) in _BINARY and _BINARY[op] >= level:
            take()
            right = binary(_BINARY[op] + (0 if op == "**" else 1))
            left = _apply(op, left, right)
        return left

    def ternary() -> int:
        cond = binary(1)
        if peek() != "?":
            return cond
        take()
        a = ternary()
        if take() != ":":
            raise ValueError("? without :")
        b = ternary()
        return a if cond else b

    value = ternary()
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r}")
    return value


class _Break(Exception):
    """``break`` inside a loop the reader runs."""


class _Exit(Exception):
    """``exit`` where the script is read with its positional arguments: bash ends there."""


#: loop rounds (all the script's loops together) after which the reader refuses a loop as one that does not end
LOOP_LIMIT = 10_000


class _Shell:
    def __init__(self, argv: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        # the environment the script is started in: exported, so both its variables and the job's environment
        self.vars: dict[str, str | list[str]] = {"OPTIND": "1", **(env or {})}  # bash starts OPTIND at 1
        self.env: dict[str, str] = dict(env or {})
        self.argv: list[str] = list(argv or [])  # the script's positional parameters ($1 …), shifted by `shift`
        #: read with the arguments the user gave (``--script-args``): an ``exit`` ends the script as in bash; without
        #: them a usage check's ``exit`` (``[ $# -lt 1 ]``) is the reader's artefact and does not end the reading
        self.given = argv is not None
        #: where ``source FILE`` looks (the folder the script is in, after the current one), and what it missed
        self.folder: Path | None = None
        self.notes: list[str] = []
        self.sourcing = 0  # nesting depth of sourced files
        self.entry: str | None = None  # the entry script's file name where it is not pretrain_*.py / train*.py
        self.functions: dict[str, list[_Cmd]] = {}  # the script's functions, by name
        self.calls = 0  # functions being run (nesting)
        #: where another program's invocation starts in a command's words (its arguments follow), if not Megatron's
        self.finder: Callable[[list[str]], int | None] | None = None
        self.rounds = 0  # loop rounds run so far (LOOP_LIMIT)
        #: variables whose assignment could not be evaluated (kept as written), with why
        self.undecided: dict[str, str] = {}
        #: inside a command substitution: what its echo / printf print (None: not capturing)
        self.capture: list[str] | None = None
        #: getopts' place: (OPTIND it last set, the character within that parameter: clustered flags)
        self.getopts_at = (1, 1)
        self.script = ""  # $0: the script's path as it was given

    # -- parameters
    def get(self, name: str) -> str | None:
        if name == "#":
            return str(len(self.argv))
        if name == "0":  # bash(1): the name of the script, as it was invoked
            return self.script or None
        if name in ("@", "*"):
            return " ".join(self.argv) if self.argv else None
        if name.isdigit():
            k = int(name)
            return self.argv[k - 1] if 0 < k <= len(self.argv) else None
        v = self.vars.get(name)
        return v[0] if isinstance(v, list) and v else v if isinstance(v, str) else None

    def arith(self, expr: str) -> str:
        """``$((expr))`` as bash evaluates it (:func:`_arith`): integers, the variables the script sets (an unset one
        is undecidable: its value comes from running), positional parameters."""
        text = re.sub(r"\$\{?([0-9]+|#)\}?", lambda m: self.get(m.group(1)) or "", expr)
        text = re.sub(rf"\$\{{?({NAME})\}}?", r"\1", text)

        def lookup(name: str) -> int:
            v = self.get(name)
            if v is None:
                raise _Undecidable(f"$(({expr})): {name} is not set (give its value with --script-env {name}=N, or "
                                   "check --script-args)")
            if UNDECIDED_RE.search(v):
                raise _Undecidable(f"$(({expr})): {name}'s value only running the script decides "
                                   f"({self.undecided.get(name, '')})")
            if not re.fullmatch(r"\s*-?\d+\s*", v):
                raise _Undecidable(f"$(({expr})): {name} is {v!r}, not a number (check --script-args)")
            return int(v)

        try:
            return str(_arith(text, lookup))
        except (ValueError, IndexError, ZeroDivisionError, RecursionError):
            raise _Undecidable(f"$(({expr})) is not integer arithmetic this reader evaluates") from None

    def arith_statements(self, text: str) -> int:
        """``(( … ))`` / a C-style for's parts: comma-separated statements, each ``NAME=expr``, ``NAME op= expr``,
        ``NAME++`` / ``NAME--`` / ``++NAME`` / ``--NAME`` (assigning) or an expression; the last one's value."""
        value = 0
        for stmt in (p.strip() for p in text.split(",")):
            if not stmt:
                continue
            m = re.fullmatch(rf"({NAME})\s*([-+*/%]?)=(?!=)\s*(.+)", stmt, re.S)
            inc = re.fullmatch(rf"({NAME})\s*(\+\+|--)|(\+\+|--)\s*({NAME})", stmt)
            if m:
                name, op, expr = m.groups()
                rhs = int(self.arith(expr))
                value = _apply(op, int(self.arith(name)) if op else 0, rhs) if op else rhs
                self.vars[name] = str(value)
            elif inc:
                name = inc.group(1) or inc.group(4)
                old = int(self.arith(name)) if self.get(name) not in (None, "") else 0
                new = old + (1 if (inc.group(2) or inc.group(3)) == "++" else -1)
                self.vars[name] = str(new)
                value = old if inc.group(1) else new
            else:
                value = int(self.arith(stmt))
        return value

    def param(self, body: str) -> list[str] | str | None:
        """``${body}``: a string, a list (an array's ``[@]``), or None (unset)."""
        m = re.fullmatch(rf"({NAME})\[([@*])\]", body)
        if m:
            v = self.vars.get(m.group(1))
            return list(v) if isinstance(v, list) else [] if v is None else [v]
        m = re.fullmatch(r"[@*]:(-?\d+)(?::(\d+))?", body)
        if m:  # "${@:2}": the positional parameters from the 2nd ($0 is the script, not among them here)
            start = int(m.group(1))
            items = list(self.argv[start - 1:] if start > 0 else self.argv)
            return items[:int(m.group(2))] if m.group(2) is not None else items
        m = re.fullmatch(rf"!({NAME})\[([@*])\]", body)
        if m:  # an array's indices (bash(1), Arrays): 0 … n-1, this reader's arrays being dense
            v = self.vars.get(m.group(1))
            return [str(k) for k in range(len(v) if isinstance(v, list) else 0 if v is None else 1)]
        m = re.fullmatch(rf"({NAME})\[([^\]@*]+)\]", body)
        if m:  # an indexed array's subscript is an arithmetic expression (bash(1), Arrays): ${A[$i]}, ${A[i+1]}
            v = self.vars.get(m.group(1))
            items = v if isinstance(v, list) else [] if v is None else [v]
            k = int(m.group(2)) if m.group(2).isdigit() else int(self.arith(m.group(2)))
            if k < 0:  # a negative subscript counts from the end
                k += len(items)
            return items[k] if 0 <= k < len(items) else None
        m = re.fullmatch(r"#(" + NAME + r")(\[[@*]\])?", body)
        if m:
            v = self.vars.get(m.group(1))
            return str(len(v)) if m.group(2) and isinstance(v, list) else str(len(self.get(m.group(1)) or ""))
        m = re.fullmatch(rf"({NAME}(?:\[[^\]@*]+\])?|[0-9]+|[#@*])(:?)([-=+?])(.*)", body, re.S)
        if m:
            name, colon, op, word = m.groups()
            got = self.param(name) if "[" in name else self.get(name)  # an array element: ${A[i+1]:-x}
            v = got if isinstance(got, str) or got is None else None
            unset = v is None or (colon and v == "")
            alt = self.expand_text(word)
            if op == "-":
                return alt if unset else v
            if op == "=":
                if unset and "[" not in name:
                    self.vars[name] = alt
                return alt if unset else v
            if op == "+":
                return "" if unset else alt
            return v if not unset else None
        if re.fullmatch(rf"{NAME}|[0-9]+|[#@*]", body):
            return self.get(body)
        raise _Undecidable(f"${{{body}}} is an expansion this reader does not evaluate")

    def dollar(self, text: str) -> list[str] | str | None:
        if text.startswith("$(("):
            return self.arith(text[3:-2])
        if text.startswith("${"):
            return self.param(text[2:-1])
        name = text[1:]
        return self.get(name) if name else "$"

    def expand_text(self, text: str) -> str:
        """The word of a ``${NAME:-word}``: its expansions and quote removal, joined (``${ARR[@]}`` with spaces)."""
        out, i = [], 0
        while i < len(text):
            if text[i] == "'" and "'" in text[i + 1:]:
                j = text.index("'", i + 1)
                out.append(text[i + 1:j])
            elif text[i] == '"':
                j = _dquote_end(text, i + 1)
                out.append(self._dq(text[i + 1:j - 1], False))
                j -= 1
            else:  # up to the next quote outside an expansion, expanded as in double quotes (an unset $NAME
                # kept as text); `$(cmd "…")` inside is one expansion, quotes and all
                j = i + 1 if text[i] in "'\"" else i  # (an unclosed quote is kept as a character)
                while j < len(text) and text[j] not in "'\"":
                    if text[j] == "\\":
                        j += 2
                    elif text[j] == "$":
                        j = max(_dollar(text, j), j + 1)
                    elif text[j] == "`" and "`" in text[j + 1:]:
                        j = text.index("`", j + 1) + 1
                    else:
                        j += 1
                j = min(j, len(text))
                out.append(self._dq(text[i:j], True))
                j -= 1
            i = j + 1
        return "".join(out)

    def substitute(self, text: str) -> str | None:
        """A command substitution's output (``$(…)`` or a backquoted command) where the commands inside are this
        reader's — tests, assignments, ``echo`` / ``printf`` (``$( [ "$X" = 1 ] && echo "--num-experts 8" )``);
        None where a command inside is another program, whose output only running decides. Trailing newlines
        go, as in bash."""
        inner = text[2:-1] if text.startswith("$(") else text[1:-1]
        saved, self.capture = self.capture, []
        saved_vars, saved_env, saved_argv = dict(self.vars), dict(self.env), list(self.argv)
        try:
            _run(self, _lex(inner), [])
            out = "".join(self.capture)
        except (_Undecidable, _Break, _Exit, UserError):
            return None
        finally:
            self.capture = saved
            # a substitution runs in a subshell: its assignments, exports and shifts do not outlive it
            self.vars, self.env, self.argv = saved_vars, saved_env, saved_argv
        return out.rstrip("\n")

    def words(self, word: Word, *, split: bool = True, keep_unset: bool = False) -> list[str]:
        """The words ``word`` expands to (unquoted expansions split on whitespace when ``split``)."""
        fields: list[str] = [""]
        quoted = False
        for text, q in word:
            if q == "'":
                fields[-1] += text
                quoted = True
            elif q == '"':
                if re.fullmatch(rf"\$\{{!?{NAME}\[@\]\}}|\$@|\$\{{@(?::-?\d+(?::\d+)?)?\}}", text):
                    # "${ARR[@]}", "${!ARR[@]}", "$@", "${@:2}": a word each
                    items = self.param(text[2:-1]) if text.startswith("${") and text != "${@}" else list(self.argv)
                    assert isinstance(items, list)
                    quoted = quoted or bool(items)  # none: no word at all, not an empty one
                    if items:
                        fields[-1] += items[0]
                        fields += items[1:]
                    continue
                quoted = True
                fields[-1] += self._dq(text, keep_unset)
            elif q == "$":
                out = self.substitute(text)
                if out is None:  # kept as written: _command refuses it where it stands as the job's arguments
                    fields[-1] += text
                    continue
                parts = out.split() if split else [out]
                for k, p in enumerate(parts):
                    if k:
                        fields.append("")
                    fields[-1] += p
            else:
                i = 0
                while i < len(text):
                    if text[i] == "$":
                        j = _dollar(text, i)
                        v = self.dollar(text[i:j])
                        if v is None:
                            v = text[i:j] if keep_unset and VAR_RE.fullmatch(text[i:j]) else ""
                        if isinstance(v, list):  # unquoted ${ARR[@]}: each element split again
                            parts = [p for item in v for p in (item.split() if split else [item])]
                        else:
                            parts = v.split() if split else [v]
                        if isinstance(v, str) and split and v and v[0].isspace():
                            fields.append("")
                        for k, p in enumerate(parts):
                            if k:
                                fields.append("")
                            fields[-1] += p
                        if isinstance(v, str) and split and v and v[-1].isspace():
                            fields.append("")
                        i = j
                    else:
                        fields[-1] += text[i]
                        i += 1
        return [f for f in fields if f or quoted]

    def _dq(self, text: str, keep_unset: bool) -> str:
        out, i = [], 0
        while i < len(text):
            if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in '$`"\\':
                out.append(text[i + 1])
                i += 2
            elif text[i] == "$":
                j = _dollar(text, i)
                if text.startswith("$(", i) and not text.startswith("$((", i):
                    # "$(cmd)": its output, not split (bash(1), Command Substitution); kept as written where
                    # only running decides it
                    sub = self.substitute(text[i:j])
                    out.append(text[i:j] if sub is None else sub)
                else:
                    v = self.dollar(text[i:j])
                    if v is None:
                        v = text[i:j] if keep_unset and VAR_RE.fullmatch(text[i:j]) else ""
                    out.append(" ".join(v) if isinstance(v, list) else v)
                i = j
            else:
                out.append(text[i])
                i += 1
        return "".join(out)

    def word(self, word: Word) -> str:
        """An assignment's value: expanded, not split."""
        return " ".join(self.words(word, split=False))

    # -- tests
    def test(self, items: list[Word | str], line: int) -> bool:
        """A condition: ``[ … ]`` / ``[[ … ]]`` commands joined by ``&&`` / ``||``, each maybe negated; inside
        ``[[ … ]]`` an ``&&`` / ``||`` joins two expressions as between two commands (left to right)."""
        inside, joined = False, list[Word | str]()
        for it in items:
            word = self._plain(it) if isinstance(it, list) else None
            if word == "[[":
                inside = True
            elif word == "]]":
                inside = False
            if inside and isinstance(it, str) and it in ("&&", "||"):
                close: Word = [("]]", "")]
                reopen: Word = [("[[", "")]
                joined += [close, it, reopen]
            else:
                joined.append(it)
        items = joined
        result: bool | None = None
        pending = "&&"
        i = 0
        while i < len(items):
            neg = False
            if isinstance(items[i], list) and self._plain(items[i]) == "!":
                neg, i = True, i + 1
            j = i
            while j < len(items) and items[j] not in ("&&", "||"):
                j += 1
            value = self._one_test(items[i:j], line) != neg
            result = value if result is None else (result and value) if pending == "&&" else (result or value)
            if j < len(items):
                pending = str(items[j])
            i = j + 1
        return bool(result)

    def getopts(self, args: list[str]) -> bool:
        """``getopts OPTSTRING NAME [ARG …]`` (bash(1), SHELL BUILTIN COMMANDS): the next option of the script's
        parameters (or the ARGs) into NAME and its value into OPTARG, ``$OPTIND`` the next parameter's index;
        clustered flags (``-ab``) and values glued to their option (``-t4``) as bash reads them; false after the
        last option (``--`` or the first word that is not one)."""
        if len(args) < 2:
            return False
        spec, name, params = args[0], args[1], args[2:] or self.argv
        index = int(self.get("OPTIND") or 1)
        if index != self.getopts_at[0]:  # OPTIND moved by the script (or a new loop): start at its word
            self.getopts_at = (index, 1)
        word = params[index - 1] if 0 < index <= len(params) else ""
        if not word.startswith("-") or word == "-" or word == "--":
            if word == "--":
                self.vars["OPTIND"] = str(index + 1)
            self.vars[name] = "?"
            return False
        pos = self.getopts_at[1]
        opt, after = word[pos], word[pos + 1:]
        takes = opt + ":" in spec
        if takes or not after:  # the word is used up: the next parameter next time
            index += 1
            pos = 1
        else:
            pos += 1
        value = ""
        if opt not in spec.lstrip(":") or opt == ":":
            self.vars[name], value = "?", (opt if spec.startswith(":") else "")
        elif takes:
            if after:
                value = after
            elif 0 < index <= len(params):
                value, index = params[index - 1], index + 1
            else:
                self.vars[name], value = (":" if spec.startswith(":") else "?"), opt
                self.vars["OPTIND"], self.getopts_at = str(index), (index, 1)
                self.vars["OPTARG"] = value
                return True
            self.vars[name] = opt
        else:
            self.vars[name] = opt
        self.vars["OPTARG"] = value
        self.vars["OPTIND"] = str(index)
        self.getopts_at = (index, pos)
        return True

    @staticmethod
    def _plain(word: Word | str) -> str:
        return word if isinstance(word, str) else "".join(t for t, _ in word)

    def _one_test(self, items: list[Word | str], line: int) -> bool:
        if len(items) == 1 and isinstance(items[0], list) and items[0] and items[0][0][1] == "(":
            try:  # if (( i < N )): the arithmetic command's status
                return self.arith_statements(items[0][0][0]) != 0
            except ValueError:
                raise _Undecidable(f"line {line}: (({items[0][0][0]})) is not arithmetic this reader evaluates") \
                    from None
        raw = [self._plain(w) for w in items]
        if raw and raw[0] == "getopts":
            return self.getopts([a for w in items[1:] if isinstance(w, list) for a in self.words(w)])
        if raw and raw[0] in ("[", "[[", "test"):
            end = {"[": "]", "[[": "]]", "test": None}[raw[0]]
            body = items[1:-1] if end and raw[-1] == end else items[1:]
        elif isinstance(items[0], list) and (self.words(items[0]) or [""])[0] in ("true", "false", ":"):
            # `if $USE_FP16; then` with the variable holding true / false: the command it names
            return self.words(items[0])[0] != "false"
        else:
            raise _Undecidable(f"line {line}: the condition `{' '.join(raw)}` is a command, not a test")
        args: list[str] = []
        for w in body:
            if isinstance(w, str):
                raise _Undecidable(f"line {line}: `{' '.join(raw)}` is a compound test")
            args += self.words(w, split=False) or [""]
        for arg in args:
            m = UNDECIDED_RE.search(arg)
            if m:
                raise _Undecidable(f"line {line}: `{' '.join(raw)}` reads {m.group(1)}, whose value only running the "
                                   f"script decides ({self.undecided.get(m.group(1), '')})")
        if any("$(" in arg or "`" in arg for arg in args):
            # a variable whose assignment could not be evaluated keeps its text: say why it could not
            kept = [why for name, why in self.undecided.items() if re.search(rf"\$\{{?{name}\b", " ".join(raw))]
            raise _Undecidable(f"line {line}: `{' '.join(raw)}` " + (
                f"reads a variable whose value is undecided: {kept[0]}" if kept else "tests a command's output"))
        neg = False
        while args and args[0] == "!":
            neg, args = not neg, args[1:]
        if len(args) == 1:
            return (args[0] != "") != neg
        if len(args) == 2 and args[0] in ("-n", "-z"):
            return ((args[1] != "") == (args[0] == "-n")) != neg
        if len(args) == 2 and args[0] == "-v":  # bash(1): true if the shell variable is set (empty or not)
            return (args[1].split("[", 1)[0] in self.vars) != neg
        if len(args) == 3 and args[1] in ("=", "==", "!="):
            if args[1] != "!=" and raw[0] == "[[" and any(c in args[2] for c in "*?["):
                return fnmatch.fnmatchcase(args[0], args[2]) != neg
            return ((args[0] == args[2]) == (args[1] != "!=")) != neg
        ints = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le, "-gt": operator.gt,
                "-ge": operator.ge}
        if len(args) == 3 and args[1] in ints and raw[0] == "[[":
            # inside [[ ]] each side of -eq … -ge is an arithmetic expression: an empty one is 0 (bash(1),
            # CONDITIONAL EXPRESSIONS), so `[[ $BATCH -eq 0 ]]` is true where BATCH is unset
            sides = [int(self.arith(a)) if a.strip() else 0 for a in (args[0], args[2])]
            return ints[args[1]](sides[0], sides[1]) != neg
        if len(args) == 3 and args[1] in ints:
            if not all(re.fullmatch(r"-?\d+", a.strip()) for a in (args[0], args[2])):
                raise _Undecidable(f"line {line}: `{' '.join(raw)}` compares values that are not numbers")
            return ints[args[1]](int(args[0]), int(args[2])) != neg
        raise _Undecidable(f"line {line}: the test `{' '.join(raw)}` (files, processes) is decided only by running "
                           "the script")


# --------------------------------------------------------------------------------------------- execution
_OPENERS = {"if": "fi", "while": "done", "until": "done", "for": "done", "case": "esac", "select": "done"}


def _head(cmd: _Cmd) -> str:
    w = cmd.words[0] if cmd.words and not cmd.array else None
    return "".join(t for t, _ in w) if isinstance(w, list) else ""


def _block_end(cmds: list[_Cmd], i: int) -> int:
    """The index of the command closing the compound command opened at ``cmds[i]``."""
    depth = 0
    for j in range(i, len(cmds)):
        head = _head(cmds[j])
        if head in _OPENERS:
            depth += 1
        elif head in ("fi", "done", "esac"):
            depth -= 1
            if depth == 0:
                return j
    raise UserError(f"line {cmds[i].line}: `{_head(cmds[i])}` is never closed")


#: what starts a serving engine (timeline.io.serve_command): its program as a command's first word, or its module
SERVE_PROGRAMS = ("vllm", "sglang")
SERVE_MODULES = ("vllm.entrypoints.openai.api_server", "sglang.launch_server")


def _touches(cmds: list[_Cmd], functions: dict[str, list[_Cmd]] | None = None) -> bool:
    """Whether these commands assign a variable (or source a file, which may), run a Python entry script or a
    serving engine, or call one of the script's ``functions`` (which may do either)."""
    for c in cmds:
        if c.array:
            return True
        first = c.words[0] if c.words else None
        if isinstance(first, list) and (ASSIGN_RE.match("".join(t for t, _ in first)) or
                                        "".join(t for t, _ in first) in ("export", "declare", "local", "readonly",
                                                                         "source", ".")):
            return True  # (a sourced file may assign anything)
        # an entry script (not `python setup.py build_ext` or a preprocessing tool), or a shell that runs a string
        texts = ["".join(t for t, _ in w) if isinstance(w, list) else "" for w in c.words]
        if any(ENTRY_RE.search(t) or t in ("eval", *SERVE_MODULES) for t in texts) or any(
                re.sub(r".*/", "", a) in ("bash", "sh", "dash", "zsh") and re.fullmatch(r"-[a-z]*c[a-z]*", b)
                for a, b in zip(texts, texts[1:], strict=False)):
            return True
        if isinstance(first, list) and re.sub(r".*/", "", "".join(t for t, _ in first)) in SERVE_PROGRAMS:
            return True
        if functions and isinstance(first, list) and "".join(t for t, _ in first) in functions:
            return True
    return False


def read_launch_script(text: str, source: str, argv: list[str] | None = None,
                       env: dict[str, str] | None = None, job: int = 1, entry: str | None = None,
                       finder: Callable[[list[str]], int | None] | None = None) -> Launch | None:
    """The Megatron invocation of the bash script ``text`` run with the positional arguments ``argv`` (none by
    default) in the environment ``env`` (the variables set before it starts: ``MP_PP0_LAYERS=6 sh run.sh``), or None
    when it runs none; of a script that runs several (a sweep), the ``job``-th (from 1). ``entry``: the entry
    script's file name where it is not named like Megatron's (``sft.py``); ``finder``: where another program's
    invocation starts in a command's words (a serving engine's), instead of a Megatron entry script."""
    # the environment sbatch gives the script from its own directives, under what the user gives
    shell = _Shell(argv, {**_sbatch_env(text), **(env or {})})
    shell.folder = Path(source).parent
    shell.script = source
    shell.entry = entry
    shell.finder = finder
    found: list[Launch] = []
    try:
        _run(shell, _lex(text), found)
    except _Undecidable as exc:
        raise UserError(f"{source}: {exc}; pass the job's arguments as a list instead") from None
    except _Break:
        raise UserError(f"{source}: `break` outside a loop") from None
    except _Exit as exc:
        raise UserError(f"{source}: line {exc.args[0]}: the script exits there before it runs the job, with the "
                        "positional arguments given (check --script-args)") from None
    if not found:
        return None
    if not 1 <= job <= len(found):
        raise UserError(f"--job {job}: {source} launches {len(found)} job{'s' if len(found) > 1 else ''} "
                        f"(give 1 … {len(found)})")
    launch = found[job - 1]
    launch.jobs = len(found)
    launch.notes = list(shell.notes)
    env = {**shell.env, **launch.env}
    for name, value in env.items():  # a variable only an undecidable test sets: refused where it sizes memory
        m = UNDECIDED_RE.search(value)
        if m and name in ENV_MAPPED:
            raise UserError(f"{source}: ${name} sizes the job's memory, and its value only running the script "
                            f"decides ({shell.undecided.get(m.group(1), '')}); give it with --script-env {name}=…")
    launch.env = {k: v for k, v in env.items() if not UNDECIDED_RE.search(v)}
    if launch.world_size is None:
        launch.world_size = _slurm_world_size(text, launch.launcher)
    return launch


SBATCH_RE = re.compile(r"^#SBATCH\s+(.*)$", re.M)


def _slurm_world_size(text: str, launcher: list[str]) -> int | None:
    """An ``srun``-launched job's ranks from the script's ``#SBATCH`` directives (sbatch(1): ``--nodes`` / ``-N``
    times ``--ntasks-per-node``, else ``--ntasks`` / ``-n``), or from ``srun``'s own ``-N`` / ``--ntasks-per-node``;
    None when the launcher is not ``srun`` or a count is not a number."""
    if not launcher or launcher[0] != "srun":
        return None
    opts: dict[str, str] = {}
    words = [w for m in SBATCH_RE.finditer(text) for w in m.group(1).split("#")[0].split()] + launcher[1:]
    aliases = {"-N": "nodes", "-n": "ntasks", "--nodes": "nodes", "--ntasks": "ntasks",
               "--ntasks-per-node": "ntasks_per_node"}
    for k, w in enumerate(words):
        name, eq, value = w.partition("=")
        if name in aliases:
            opts[aliases[name]] = value if eq else (words[k + 1] if k + 1 < len(words) else "")
    nodes, per, tasks = opts.get("nodes", "1"), opts.get("ntasks_per_node", ""), opts.get("ntasks", "")
    if per.isdigit() and nodes.isdigit():
        return int(nodes) * int(per)
    return int(tasks) if tasks.isdigit() else None


def _sbatch_env(text: str) -> dict[str, str]:
    """The output environment sbatch(1) gives the batch script for the script's own ``#SBATCH`` directives, where
    a directive fixes it: ``--nodes N`` / ``-N N`` (a single count) sets ``SLURM_JOB_NUM_NODES`` and
    ``SLURM_NNODES``; ``--ntasks-per-node`` sets ``SLURM_NTASKS_PER_NODE``; ``--ntasks`` / ``-n`` sets
    ``SLURM_NTASKS`` and ``SLURM_NPROCS``; ``--gpus-per-node`` (a count) sets ``SLURM_GPUS_PER_NODE``."""
    words = [w for m in SBATCH_RE.finditer(text) for w in m.group(1).split("#")[0].split()]
    sets = {"--nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"), "-N": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
            "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",), "--ntasks": ("SLURM_NTASKS", "SLURM_NPROCS"),
            "-n": ("SLURM_NTASKS", "SLURM_NPROCS"), "--gpus-per-node": ("SLURM_GPUS_PER_NODE",)}
    env: dict[str, str] = {}
    for k, w in enumerate(words):
        name, eq, value = w.partition("=")
        if name in sets:
            value = value if eq else (words[k + 1] if k + 1 < len(words) else "")
            if value.isdigit():
                env.update(dict.fromkeys(sets[name], value))
    return env


class _Return(Exception):
    """``return`` inside a function the reader runs."""


def _function(cmds: list[_Cmd], i: int) -> tuple[str, list[_Cmd], int] | None:
    """A function definition at ``cmds[i]`` (``name() {`` or ``function name [()] {``, its ``{`` maybe on the next
    line): its name, body and the index of the command that closes it; None for any other command."""
    words = [_Shell._plain(w) for w in cmds[i].words if isinstance(w, list)]
    if not words or any(not isinstance(w, list) for w in cmds[i].words):
        return None
    if words[0] == "function" and len(words) >= 2:
        name, rest = words[1].removesuffix("()"), words[2:]
    elif words[0].endswith("()") and re.fullmatch(NAME, words[0][:-2]):
        name, rest = words[0][:-2], words[1:]
    else:
        return None
    if not re.fullmatch(rf"{NAME}(?:[.:-][A-Za-z0-9_]+)*", name):
        return None
    start = i + 1
    if not rest:  # `f()` then `{` on its own line
        if start >= len(cmds) or [_Shell._plain(w) for w in cmds[start].words if isinstance(w, list)][:1] != ["{"]:
            return None
        rest = [_Shell._plain(w) for w in cmds[start].words if isinstance(w, list)]
        first = cmds[start].words[1:]
        start += 1
    else:
        first = cmds[i].words[len(cmds[i].words) - len(rest) + 1:]
    if rest[0] != "{":
        return None
    depth = 1
    for j in range(start, len(cmds)):
        plain = [_Shell._plain(w) for w in cmds[j].words if isinstance(w, list)]
        if plain[:1] == ["}"]:
            depth -= 1
            if depth == 0:
                body = ([_Cmd(list(first), cmds[i].line)] if first else []) + cmds[start:j]
                return name, body, j
        elif plain and plain[-1] == "{":
            depth += 1
    return None


def _run(shell: _Shell, cmds: list[_Cmd], found: list[Launch]) -> None:
    i = 0
    while i < len(cmds):
        cmd = cmds[i]
        head = _head(cmd)
        fn = _function(cmds, i)
        if fn is not None:  # defined here, run where it is called (with its own $1 …)
            shell.functions[fn[0]] = fn[1]
            i = fn[2] + 1
            continue
        if cmd.array:
            runs = _run_list(shell, cmd.guard, cmd.line, found) if cmd.guard else True
            if runs is None:
                raise _Undecidable(f"line {cmd.line}: a test only running the script decides whether {cmd.array} "
                                   "is set")
            if not runs:
                i += 1
                continue
            items: list[str] = []
            for w in cmd.words:
                if isinstance(w, list):  # argument words: an unset $NAME stays as text for the mapping to name
                    items += shell.words(w, keep_unset=True)
            old = shell.vars.get(cmd.array)
            base = (old if isinstance(old, list) else [] if old is None else [old]) if cmd.append else []
            shell.vars[cmd.array] = base + items
            i += 1
            continue
        if head == "if":
            i = _if(shell, cmds, i, found)
            continue
        if head == "case":
            i = _case(shell, cmds, i, found)
            continue
        if head == ";;":
            i += 1
            continue
        if head in ("while", "until", "for", "select"):
            end = _block_end(cmds, i)
            body = cmds[i + 1:end]
            if head in ("while", "until"):
                _loop(shell, cmd, body, found)
            elif head == "for" and _for(shell, cmd, body, found):
                pass
            elif _touches(body, shell.functions):
                raise _Undecidable(f"line {cmd.line}: a `{head}` block that sets variables or runs the job")
            i = end + 1
            continue
        if head == "return" and shell.calls:
            raise _Return
        if head in ("exit", "return") and not found:
            if shell.given:
                raise _Exit(cmd.line)
            return
        group = _brace_group(cmds, i)
        if group is not None:  # `test || { echo …; exit 1; }`: the group runs as one command of the list
            cond, body, end = group
            runs = _run_list(shell, cond, cmd.line, found)
            if runs is None and _touches(body, shell.functions):
                raise _Undecidable(f"line {cmd.line}: a test only running the script decides whether the `{{ … }}` "
                                   "group after it runs")
            if runs:
                _run(shell, body, found)
            i = end + 1
            continue
        _run_list(shell, cmd.words, cmd.line, found)
        i += 1


def _brace_group(cmds: list[_Cmd], i: int) -> tuple[list[Word | str], list[_Cmd], int] | None:
    """A ``{ …; }`` group that is the last command of ``cmds[i]``'s ``&&`` / ``||`` list: the list up to its
    operator, the group's commands, and the index of the command that closes it; None for any other command."""
    words = cmds[i].words
    at = next((k for k in range(1, len(words)) if words[k - 1] in ("&&", "||") and isinstance(words[k], list)
               and _Shell._plain(words[k]) == "{"), None)
    if at is None:
        return None
    end = next((j for j in range(i + 1, len(cmds)) if _head(cmds[j]) == "}"), None)
    if end is None:
        return None
    first = words[at + 1:]
    body = ([_Cmd(first, cmds[i].line)] if first else []) + cmds[i + 1:end]
    return words[:at], body, end


def _for(shell: _Shell, cmd: _Cmd, body: list[_Cmd], found: list[Launch]) -> bool:
    """``for NAME in WORDS`` (or ``for NAME``: over ``"$@"``): the body once per word, as bash runs it — a sweep's
    every job is found (``job`` of :func:`read_launch_script` picks one). False for a form this reader does not run (C-style
    ``for ((…))``), left to the caller."""
    words = [w for w in cmd.words[1:] if isinstance(w, list)]
    if words and words[0] and words[0][0][1] == "(":  # for (( init; cond; step ))
        parts = words[0][0][0].split(";")
        if len(parts) != 3:
            raise _Undecidable(f"line {cmd.line}: `for (({words[0][0][0]}))` is not `for (( init; test; step ))`")
        init, cond, step = parts
        if body and _head(body[0]) == "do":
            body = body[1:]
        shell.arith_statements(init)
        while not cond.strip() or shell.arith_statements(cond):
            shell.rounds += 1
            if shell.rounds > LOOP_LIMIT:
                raise _Undecidable(f"line {cmd.line}: a `for` loop past {LOOP_LIMIT} rounds")
            try:
                _run(shell, body, found)
            except _Break:
                break
            shell.arith_statements(step)
        return True
    if not words or not re.fullmatch(NAME, _Shell._plain(words[0])):
        return False
    name = _Shell._plain(words[0])
    if len(words) > 1 and _Shell._plain(words[1]) != "in":
        return False
    items = [x for w in words[2:] for x in shell.words(w)] if len(words) > 1 else list(shell.argv)
    if body and _head(body[0]) == "do":  # the lexer makes `do` a command of its own
        body = body[1:]
    for item in items:
        shell.rounds += 1
        if shell.rounds > LOOP_LIMIT:
            raise _Undecidable(f"line {cmd.line}: a `for` loop past {LOOP_LIMIT} rounds")
        shell.vars[name] = item
        try:
            _run(shell, body, found)
        except _Break:
            break
    return True


def _loop(shell: _Shell, cmd: _Cmd, body: list[_Cmd], found: list[Launch]) -> None:
    """A ``while`` / ``until`` loop: run while its test decides to (an argument loop over ``$#`` with ``case``
    and ``shift``); a test only running the script decides is refused where the body assigns or runs the job."""
    cond = list(cmd.words[1:])
    if body and _head(body[0]) == "do":  # the lexer makes `do` a command of its own
        body = body[1:]
    while shell.rounds < LOOP_LIMIT:  # one budget for every loop of the script: nested loops cannot multiply it
        shell.rounds += 1
        try:
            taken = shell.test(cond, cmd.line) != (_head(cmd) == "until")
        except _Undecidable:
            if _touches(body, shell.functions):
                raise _Undecidable(f"line {cmd.line}: a `{_head(cmd)}` loop that sets variables or runs the "
                                   "job") from None
            return
        if not taken:
            return
        try:
            _run(shell, body, found)
        except _Break:
            return
    raise _Undecidable(f"line {cmd.line}: a `{_head(cmd)}` loop still running after {LOOP_LIMIT} rounds (of the "
                       "script's loops together)")


def _if(shell: _Shell, cmds: list[_Cmd], i: int, found: list[Launch]) -> int:
    end = _block_end(cmds, i)
    # split the block into (condition, body) branches at depth 0
    branches: list[tuple[list[Word | str] | None, list[_Cmd], int]] = []
    cond: list[Word | str] | None = cmds[i].words[1:]
    line = cmds[i].line
    body: list[_Cmd] = []
    depth = 0
    j = i + 1
    while j < end:
        c, head = cmds[j], _head(cmds[j])
        if depth == 0 and head in ("then", "else", "elif"):  # `then` and `else` are commands of their own (_lex)
            if head != "then":
                branches.append((cond, body, line))
                body, line = [], c.line
                cond = c.words[1:] if head == "elif" else None
            j += 1
            continue
        if head in _OPENERS:
            depth += 1
        elif head in ("fi", "done", "esac"):
            depth -= 1
        body.append(c)
        j += 1
    branches.append((cond, body, line))
    for cond_words, branch, line in branches:
        if cond_words is None:
            _run(shell, branch, found)
            break
        try:
            taken = shell.test(cond_words, line)
        except _Undecidable as exc:
            if any(_touches(b, shell.functions) for _, b, _ in branches):
                assigned = [_only_assignments(b) for _, b, _ in branches]
                if any(names is None for names in assigned):
                    raise
                # branches that only assign: the value stays undecided, refused only where it matters
                for name, exported in sorted({n for names in assigned for n in names or ()}):
                    shell.vars[name] = _undecided(name)
                    shell.undecided[name] = str(exc)
                    if exported:
                        shell.env[name] = _undecided(name)
            break  # a file or process test around echo / exit / mkdir: not the job's arguments
        if taken:
            _run(shell, branch, found)
            break
    return end + 1


def _glob(shell: _Shell, word: Word) -> str:
    """A ``case`` pattern as an fnmatch pattern: quoted parts literal (their glob characters bracketed), unquoted
    parts glob, both expanded."""
    out = []
    for text, q in word:
        if q == "'":
            value = text
        elif q == '"':
            value = shell._dq(text, False)
        else:
            out.append(shell._dq(text, False) if "$" in text else text)
            continue
        out.append(re.sub(r"([*?\[])", r"[\1]", value))
    return "".join(out)


def _case_patterns(shell: _Shell, cmd: _Cmd) -> tuple[list[str], list[Word | str]]:
    """A clause's patterns (``a|"b"|c*)``, a leading ``(`` optional) and the command words after its ``)``."""
    patterns: list[str] = []
    for k, w in enumerate(cmd.words):
        if w == "|":
            continue
        if isinstance(w, str):
            break
        parts = list(w)
        if parts and parts[0][1] == "" and parts[0][0].startswith("(") and not patterns:
            parts[0] = (parts[0][0][1:], "")
        last = parts[-1] if parts else ("", "'")
        closes = last[1] == "" and last[0].endswith(")")
        if closes:
            parts[-1] = (last[0][:-1], "")
        patterns.append(_glob(shell, parts))  # `a|b`: the lexer splits at `|`, quoted or not
        if closes:
            return patterns, cmd.words[k + 1:]
    raise _Undecidable(f"line {cmd.line}: a `case` clause whose pattern does not end in `)`")


def _case(shell: _Shell, cmds: list[_Cmd], i: int, found: list[Launch]) -> int:
    """``case WORD in PATTERN) … ;; esac``: the first clause whose pattern matches the expanded word runs (bash's
    fnmatch rules, quoted pattern characters literal); a word only running the script gives is refused where a
    clause assigns or runs the job."""
    end = _block_end(cmds, i)
    head = cmds[i].words[1:]
    if len(head) != 2 or not isinstance(head[1], list) or _Shell._plain(head[1]) != "in" \
            or not isinstance(head[0], list):
        raise _Undecidable(f"line {cmds[i].line}: a `case` written other than `case WORD in` on its own line")
    clauses: list[tuple[list[str], list[_Cmd]]] = []
    body: list[_Cmd] | None = None
    depth = 0
    for c in cmds[i + 1:end]:
        h = _head(c)
        if depth == 0 and h == ";;":
            body = None
            continue
        if depth == 0 and body is None:
            if c.array:  # `pat) ARR=( … )`: the lexer read the pattern as the array's guard
                patterns, rest = _case_patterns(shell, _Cmd(c.guard, c.line))
                body = [_Cmd(c.words, c.line, array=c.array, append=c.append, guard=rest)]
            else:
                patterns, rest = _case_patterns(shell, c)
                body = [_Cmd(rest, c.line)] if rest else []
            clauses.append((patterns, body))
            continue
        if h in _OPENERS:
            depth += 1
        elif h in ("fi", "done", "esac"):
            depth -= 1
        assert body is not None
        body.append(c)
    try:
        subject = shell.word(head[0])
        if "$(" in subject or "`" in subject:
            raise _Undecidable(f"line {cmds[i].line}: `case` on a command's output")
    except _Undecidable:
        if any(_touches(b, shell.functions) for _, b in clauses):
            raise _Undecidable(f"line {cmds[i].line}: a `case` block that sets variables or runs the job on a "
                               "word only running the script gives") from None
        return end + 1
    for patterns, branch in clauses:
        if any(fnmatch.fnmatchcase(subject, p) for p in patterns):
            _run(shell, branch, found)
            break
    return end + 1


def _run_list(shell: _Shell, words: list[Word | str], line: int, found: list[Launch]) -> bool | None:
    """Run an ``&&`` / ``||`` list (``cd dir && torchrun …``; each pipeline's first command only: ``… | tee log``
    consumes its output) and return whether the command after it would run, were one there: the list may end in
    its operator (``test && ARR+=( … )``, the array read apart). None: a test only running the script decides it;
    the command it guards is refused when it assigns or runs the job."""
    part: list[Word | str] = []
    status: bool | None = True
    op = "&&"
    for w in [*words, "&&"] if not words or words[-1] not in ("&&", "||") else words:
        if w not in ("&&", "||"):
            part.append(w)
            continue
        cut = next((k for k, x in enumerate(part) if x == "|"), len(part))
        if part[:cut]:
            now = _Cmd(part[:cut], line)
            if status is None and _touches([now], shell.functions):
                raise _Undecidable(f"line {line}: a test only running the script decides whether "
                                   f"`{' '.join(''.join(t for t, _ in x) for x in now.words if isinstance(x, list))}` "
                                   "runs")
            if status is None or (status if op == "&&" else not status):
                status = _status(shell, now, found)
        part, op = [], str(w)
    return None if status is None else status if op == "&&" else not status


def _status(shell: _Shell, cmd: _Cmd, found: list[Launch]) -> bool | None:
    """Run one command of a list; its exit status as a truth value: a test's result (None: only running the
    script decides it), else success (``cd``, ``mkdir`` and the like are taken to succeed)."""
    head = _head(cmd)
    if head in ("[", "[[", "test"):
        try:
            return shell.test(cmd.words, cmd.line)
        except _Undecidable:
            return None
    if cmd.words and isinstance(cmd.words[0], list) and cmd.words[0] and cmd.words[0][0][1] == "(":
        try:  # (( expr )): its assignments, and a status of whether its value is non-zero
            return shell.arith_statements(cmd.words[0][0][0]) != 0
        except (_Undecidable, ValueError):
            return None
    if head in ("true", ":"):
        for w in cmd.words[1:]:  # its arguments are expanded all the same: `: "${NUM_LAYERS:=2}"` assigns
            if isinstance(w, list):
                shell.words(w, keep_unset=True)
        return True
    if head == "false":
        return False
    _command(shell, cmd, found)
    return True


def _command(shell: _Shell, cmd: _Cmd, found: list[Launch]) -> None:
    words = [w for w in cmd.words if isinstance(w, list)]
    here: Word | None = None  # `… <<< WORD`: the command's input
    at = next((k for k, w in enumerate(words) if w == [("<<<", "")]), None)
    if at is not None:
        here = words[at + 1] if at + 1 < len(words) else [("", "")]
        words = words[:at] + words[at + 2:]
    if not words:
        return
    first = "".join(t for t, _ in words[0])
    if first in ("export", "declare", "local", "readonly", "typeset"):
        for w in words[1:]:
            text = "".join(t for t, _ in w)
            if text.startswith("-"):
                continue
            m = ASSIGN_RE.match(text)
            if m:
                _assign(shell, w, m)
                if first == "export":
                    v = shell.get(m.group(1))
                    shell.env[m.group(1)] = v or ""
            elif first == "export" and re.fullmatch(NAME, text) and shell.get(text) is not None:
                shell.env[text] = shell.get(text) or ""
        return
    prefix_env: dict[str, str] = {}
    k = 0
    while k < len(words):
        m = ASSIGN_RE.match("".join(t for t, _ in words[k]))
        if not m or words[k][0][1] != "":
            break
        if k == len(words) - 1:  # a plain assignment
            _assign(shell, words[k], m)
            return
        value = shell.word(_after_equals(words[k], m))
        prefix_env[m.group(1)] = value
        k += 1
    argv: list[str] = []
    for w in words[k:]:
        argv += shell.words(w, keep_unset=True)
    while argv and argv[0] in ("(", "{", "exec", "time", "nohup"):  # a subshell, a group, exec / time / nohup
        argv = argv[1:]
    while argv and argv[-1] in (")", "}"):
        argv = argv[:-1]
    if argv and argv[0] in shell.functions:
        if shell.calls >= 64:
            raise _Undecidable(f"line {cmd.line}: `{argv[0]}` calls itself past 64 levels")
        saved = shell.argv
        shell.argv, shell.calls = argv[1:], shell.calls + 1
        try:
            _run(shell, shell.functions[argv[0]], found)
        except _Return:
            pass
        finally:
            shell.argv, shell.calls = saved, shell.calls - 1
        return
    if argv and argv[0] in ("source", ".") and len(argv) > 1:
        _source(shell, argv[1], argv[2:], cmd.line, found)
        return
    if argv and argv[0] == "eval":  # eval re-reads its arguments as a command
        _run(shell, _lex(" ".join(argv[1:])), found)
        return
    # `bash -c SCRIPT`, `sh -lc`, `bash -ec -- SCRIPT`: a flag word holding c (bash(1): the first argument after the
    # options is the script; `--` ends the options)
    shell_at = next((k for k in range(len(argv) - 2) if re.sub(r".*/", "", argv[k]) in ("bash", "sh", "dash", "zsh")
                     and re.fullmatch(r"-[a-z]*c[a-z]*", argv[k + 1])), None)
    script_at = None if shell_at is None else shell_at + 2 + (argv[shell_at + 2] == "--" and len(argv) > shell_at + 3)
    if shell_at is not None and script_at is not None and not any(ENTRY_RE.search(a) for a in argv[:shell_at]):
        # `srun … bash -c "RANK=\$SLURM_PROCID $CMD"`: the string is a script of its own (its $0, $1 … the words
        # after it), run once per rank by the launcher before it
        saved = shell.argv
        shell.argv = argv[script_at + 2:] if len(argv) > script_at + 1 else []
        try:
            _run(shell, _lex(argv[script_at]), found)
        finally:
            shell.argv = saved
        if found and found[-1].world_size is None:
            found[-1].world_size = _world_size(argv[:shell_at])
            found[-1].launcher = argv[:shell_at] + found[-1].launcher
        return
    if argv and argv[0] == "read":
        _read(shell, argv[1:], None if here is None else shell.word(here), prefix_env.get("IFS"), cmd.line)
        return
    if argv[:2] == ["printf", "-v"] and len(argv) > 3:  # printf -v NAME FORMAT ARGS: assigns what it would print
        shell.vars[argv[2]] = _printed(["printf", *argv[3:]])
        shell.undecided.pop(argv[2], None)
        return
    if argv and argv[0] in PRINTERS:  # `echo $cmd` shows the command; it runs nothing
        if shell.capture is not None:
            shell.capture.append(_printed(argv))
        return
    if argv and argv[0] in PATH_TOOLS:  # `$(dirname "$(readlink -f "$0")")`: a path computed, nothing run
        printed = _path_tool(argv)
        if printed is None:
            raise _Undecidable(f"line {cmd.line}: `{' '.join(argv)}` is not a path this reader computes")
        if shell.capture is not None:
            shell.capture.append(printed)
        return
    if shell.capture is not None and argv:
        raise _Undecidable(f"`{argv[0]}` inside a command substitution: its output only running decides")
    if argv and argv[0] == "shift":  # drops positional parameters (one, or the count given)
        n = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 1
        shell.argv = shell.argv[n:] if n <= len(shell.argv) else shell.argv
        return
    if argv and argv[0] == "break":
        raise _Break
    if shell.finder is not None:  # another program's invocation (a serving engine's: timeline.io.serve_command)
        entry = shell.finder(argv)
    else:
        # `python -m pretrain_gpt`, `torchrun … -m examples.mimo.pretrain_mimo`: the module's file
        files = [f"{a.rsplit('.', 1)[-1]}.py" if k and argv[k - 1] == "-m" else a for k, a in enumerate(argv)]
        entry = next((n for n, a in enumerate(files) if ENTRY_RE.search(a)
                      or (shell.entry is not None and re.sub(r".*/", "", a) == shell.entry)), None)
        if entry is not None and files[entry] != argv[entry]:
            argv = argv[:entry] + [files[entry]] + argv[entry + 1:]
    if entry is None or re.sub(r".*/", "", argv[0]) in FILE_TOOLS:  # `cp pretrain_gpt_synthetic.py …` runs no job
        return
    launcher = [w for w in argv[:entry] if not UNDECIDED_RE.search(w)]  # a launcher's option only a test decides
    job = argv[entry + 1:]
    for arg in [argv[entry], *job]:
        m = UNDECIDED_RE.search(arg)
        if m:
            raise _Undecidable(f"line {cmd.line}: {m.group(1)} reaches the job's arguments, and its value only "
                               f"running the script decides ({shell.undecided.get(m.group(1), '')})")
    for k, arg in enumerate(job):  # a command's output this reader cannot give, standing as arguments of its own
        if arg.startswith(("$(", "`")) and (k == 0 or not job[k - 1].startswith("--")):
            raise _Undecidable(f"line {cmd.line}: `{arg}`: the job's arguments include a command's output, which only "
                               "running the script decides")
    found.append(Launch(words=argv[entry + 1:], script=argv[entry], env=prefix_env,
                        world_size=_world_size(launcher), launcher=launcher))


def _read(shell: _Shell, args: list[str], text: str | None, ifs: str | None, line: int) -> None:
    """``read [-r] [-a ARRAY] [-d DELIM] [-p PROMPT] … NAME …`` (bash(1), SHELL BUILTIN COMMANDS): one line of the
    input split at ``$IFS`` (the command's own ``IFS=…`` first), each field to a name, the rest of the line to the
    last. Input other than a here-string (a file, a pipe, the terminal) only running decides: the names are
    undecided, refused only where they reach the job."""
    names: list[str] = []
    array: str | None = None
    delim = "\n"
    k = 0
    while k < len(args):
        a = args[k]
        if a in ("-a", "-d", "-p", "-t", "-n", "-N", "-u", "-i") and k + 1 < len(args):
            if a == "-a":
                array = args[k + 1]
            elif a == "-d":
                delim = args[k + 1][:1] or "\0"
            k += 2
            continue
        if a.startswith("-") and len(a) > 1 and not names:
            k += 1
            continue
        names.append(a)
        k += 1
    targets = [array] if array else names or ["REPLY"]
    if text is None:
        for name in targets:
            shell.vars[name] = _undecided(name)
            shell.undecided[name] = f"line {line}: `read {name}` reads input only running the script gives"
        return
    data = text.split(delim, 1)[0] if delim != "\0" else text
    sep = shell.get("IFS") if ifs is None else ifs
    sep = " \t\n" if sep is None else sep
    white = "".join(c for c in sep if c in " \t\n")
    other = "".join(c for c in sep if c not in " \t\n")
    ws, nws = (f"[{re.escape(white)}]" if white else ""), (f"[{re.escape(other)}]" if other else "")
    # a field ends at a run of IFS whitespace, or at one other IFS character with the whitespace around it
    pattern = f"{ws}*{nws}{ws}*|{ws}+" if ws and nws else nws or (f"{ws}+" if ws else "")
    fields: list[str] = []
    rest = data.strip(white) if white else data
    want = None if array else len(targets)
    while rest and pattern and (want is None or len(fields) < want - 1):
        m = re.search(pattern, rest)
        if not m:
            break
        fields.append(rest[:m.start()])
        rest = rest[m.end():]
    if rest or (want is not None and len(fields) < want):
        fields.append(rest)
    for name in targets:
        shell.undecided.pop(name, None)
    if array:
        shell.vars[array] = [f for f in fields if f or not white]
        return
    for n, name in enumerate(targets):
        shell.vars[name] = fields[n] if n < len(fields) else ""


def _fill(fmt: str, args: list[str]) -> str:
    """One pass of a printf format: each ``%s`` / ``%d`` takes the next argument (an empty one past the end)."""
    given = iter(args)
    return re.sub(r"%[sd]", lambda _: next(given, ""), fmt)


def _source(shell: _Shell, name: str, args: list[str], line: int, found: list[Launch]) -> None:
    """``source FILE [ARGS]`` / ``. FILE``: FILE's commands run in this shell (bash(1), SHELL BUILTIN COMMANDS),
    read where it is on this machine — relative to the current folder, else to the script's own (a recipe's
    ``source configs/model_7b_moe.sh``); a file not found leaves its variables unset, with a note."""
    path = Path(name).expanduser()
    tries = [path] if path.is_absolute() else [path, *([shell.folder / path] if shell.folder else [])]
    found_at = next((p for p in tries if p.is_file()), None)
    if found_at is None or shell.sourcing >= 16:
        shell.notes.append(f"line {line}: `source {name}`: not found here or beside the script; the variables it "
                           "sets are unset")
        return
    try:
        text = found_at.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _Undecidable(f"line {line}: `source {name}`: cannot read {found_at} ({exc})") from None
    saved = shell.argv
    if args:
        shell.argv = list(args)
    shell.sourcing += 1
    try:
        _run(shell, _lex(text), found)
    finally:
        shell.sourcing -= 1
        if args:
            shell.argv = saved


def _dirname(path: str) -> str:
    """POSIX ``dirname``: the path less its last component and trailing slashes (``.`` where none is left)."""
    p = path.rstrip("/")
    if not p:
        return "/" if path else "."
    if "/" not in p:
        return "."
    head = p.rsplit("/", 1)[0].rstrip("/")
    return head or "/"


def _path_tool(argv: list[str]) -> str | None:
    """What ``dirname``, ``basename``, ``realpath`` and ``readlink -f`` print for their operands (coreutils; the
    path resolved on this machine, as the script is), None for another form."""
    tool, args = argv[0], argv[1:]
    if any(UNDECIDED_RE.search(a) for a in args):
        return None
    if tool == "dirname":
        ops = [a for a in args if a != "--"]
        return "".join(_dirname(a) + "\n" for a in ops) if ops and not any(a.startswith("-") for a in ops) else None
    if tool == "basename":
        ops = [a for a in args if a != "--"]
        if not ops or len(ops) > 2 or any(a.startswith("-") for a in ops):
            return None
        base = ops[0].rstrip("/").rsplit("/", 1)[-1] or ("/" if ops[0] else "")
        if len(ops) == 2 and base.endswith(ops[1]) and base != ops[1]:
            base = base[:-len(ops[1])]
        return base + "\n"
    flags = [a for a in args if a.startswith("-")]
    ops = [a for a in args if not a.startswith("-")]
    if tool == "readlink" and not set(flags) & {"-f", "-e", "-m"}:
        return None  # plain readlink prints a link's target, only if the operand is a link
    if not ops or any(f not in ("-f", "-e", "-m", "-s", "-q", "-n", "--") for f in flags):
        return None
    return "".join(os.path.realpath(a) + "\n" for a in ops)


def _printed(argv: list[str]) -> str:
    """What ``echo [-n] [-e] WORDS`` / ``printf FORMAT ARGS`` print (bash(1), SHELL BUILTIN COMMANDS: ``printf``
    reuses its format until the arguments are used up; ``%s`` / ``%d`` and ``\\n`` / ``\\t`` escapes)."""
    if argv[0] == "printf" and argv[1:2] == ["--"]:  # the end of printf's options
        argv = argv[:1] + argv[2:]
    if argv[0] == "printf" and len(argv) > 1:
        fmt, args = argv[1].replace("\\n", "\n").replace("\\t", "\t"), argv[2:]
        slots = len(re.findall(r"%[sd]", fmt))
        out, k = [], 0
        while True:
            out.append(_fill(fmt, args[k:k + slots]))
            k += slots
            if not slots or k >= len(args):
                return "".join(out).replace("%%", "%")
    words, newline = argv[1:], True
    while words and words[0] in ("-n", "-e", "-E", "-ne", "-en"):
        newline = newline and "n" not in words[0]
        words = words[1:]
    return " ".join(words) + ("\n" if newline else "")


def _after_equals(word: Word, m: re.Match) -> Word:
    text, q = word[0]
    return [(text[m.end():], q)] + word[1:]


def _assign(shell: _Shell, word: Word, m: re.Match) -> None:
    name = m.group(1)
    try:
        value = shell.word(_after_equals(word, m))
        shell.undecided.pop(name, None)
    except _Undecidable as exc:  # kept as written: an argument that reads it names the variable, a test refuses
        value = "".join(t for t, _ in _after_equals(word, m))
        shell.undecided[name] = str(exc)
    if m.group(2):  # NAME+=word appends to a string (or to an array's first element in bash; rare)
        old = shell.vars.get(name)
        shell.vars[name] = (old if isinstance(old, str) else "") + value
    else:
        shell.vars[name] = value


def _world_size(launcher: list[str]) -> int | None:
    """torchrun's (``python -m torch.distributed.run``'s) ``--nproc_per_node`` × ``--nnodes`` when both are numbers
    (``--nnodes MIN:MAX`` with MIN = MAX)."""
    if not launcher or not any(a.endswith(("torchrun", "torch.distributed.run", "torch.distributed.launch"))
                               for a in launcher):
        return None
    opts: dict[str, str] = {}
    k = 0
    while k < len(launcher):
        a = launcher[k]
        name, eq, value = a.partition("=")
        key = name.lstrip("-").replace("-", "_")
        if a.startswith("--") and key in ("nproc_per_node", "nnodes"):
            opts[key] = value if eq else (launcher[k + 1] if k + 1 < len(launcher) else "")
        k += 1
    nproc, nnodes = opts.get("nproc_per_node", ""), opts.get("nnodes", "1")
    lo, _, hi = nnodes.partition(":")
    if hi and lo != hi:
        return None
    if not nproc.isdigit() or not lo.isdigit():
        return None
    return int(nproc) * int(lo)
