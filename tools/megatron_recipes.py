"""Which CI recipe product ran a measured Megatron-LM case, and so on how many GPUs.

A recipe product lists test cases (``megatron_case_record.recipe_worlds``); the one that ran a golden lists
its case in the golden's environment (the dev or lts CI image) on the golden's platform — on any platform
when the golden's name has none, if all such products agree on the world size. The recipes at the golden's
recording commit decide. Where none there lists the case — a golden written in a merge that also moved its
test to another platform or scope, a release branch's golden whose recipe lived on main only — the recipes
of the other commits on Megatron-LM's release lines decide: the listing nearest the recording commit in
commit time, provided every listing in that history agrees on the world size (else it stays unknown).

It never infers a world size from measured numbers, and it reads only git objects (no working tree).
"""

from __future__ import annotations

from typing import Any, Protocol

import megatron_case_record as rec

Product = dict[str, Any]


class GitObjects(Protocol):
    def read(self, spec: str) -> str | None: ...

    def git(self, *args: str) -> str: ...


def world(product: Product) -> int:
    return int(product["nodes"]) * int(product["gpus"])


def fitting(products: list[Product], tag: dict[str, Any]) -> list[Product]:
    """The products that run a golden of ``tag`` (``rec.golden_tag``): its environment, then its platform."""
    ran = [p for p in products if p.get("environments") is None or tag["environment"] in p["environments"]]
    return [p for p in ran if p["gpu"] == tag["gpu"]] if tag["gpu"] else ran


def chosen(products: list[Product], tag: dict[str, Any]) -> Product | None:
    """The product of one commit's recipes that ran the golden (None: none, or a golden naming no platform
    whose fitting products disagree on the world size)."""
    fits = fitting(products, tag)
    if not fits or (tag["gpu"] is None and len({world(p) for p in fits}) > 1):
        return None
    return fits[0]


class Recipes:
    """The recipes of any commit (each recipe file's blob parsed once) and their history on ``refs``."""

    def __init__(self, repo: GitObjects, refs: list[str]) -> None:
        self.repo = repo
        self.refs = refs
        self._blobs: dict[str, dict] = {}
        self._trees: dict[str, dict] = {}
        self._history: list[tuple[int, str, dict]] | None = None

    def at(self, commit: str) -> dict[tuple[str, str], list[Product]]:
        """(family, test case) → the products of ``commit``'s recipes listing it."""
        if commit not in self._trees:
            listing = self.repo.git("ls-tree", "-r", commit, "--", *rec.RECIPES)
            files = sorted((line.split("\t", 1)[1], line.split()[2]) for line in listing.splitlines()
                           if line.endswith(".yaml"))
            out: dict[tuple[str, str], list[Product]] = {}
            for path, blob in files:  # in path order, as recipe_worlds reads a whole tree
                if blob not in self._blobs:
                    self._blobs[blob] = rec.recipe_worlds({path: self.repo.read(blob) or ""})
                for key, products in self._blobs[blob].items():
                    out.setdefault(key, []).extend(products)
            self._trees[commit] = out
        return self._trees[commit]

    def history(self) -> list[tuple[int, str, dict]]:
        """(committer time, commit, recipes) of every commit on ``refs`` that changed a recipe file."""
        if self._history is None:
            log = self.repo.git("log", "--format=%H %ct", *self.refs, "--", *rec.RECIPES) if self.refs else ""
            self._history = [(int(ct), sha, self.at(sha)) for sha, ct in (line.split() for line in log.splitlines())]
        return self._history

    def product(self, name: str, tag: dict[str, Any], commit: str) -> tuple[Product | None, str | None, str | None]:
        """(product, the commit whose recipes list it, why none) for the golden of case ``name`` and ``tag``
        recorded at ``commit``."""
        key = tuple(name.split("/", 1))
        found = chosen(self.at(commit).get(key, []), tag)  # type: ignore[arg-type]
        if found is not None:
            return found, commit, None
        listings = [(ct, sha, p) for ct, sha, recipes in self.history() for p in fitting(recipes.get(key, []), tag)]
        if not listings:
            return None, None, ("no CI recipe lists this case in its environment on its platform, at the recording "
                                "commit or any other of the release lines (world size unknown)")
        if len({world(p) for _ct, _sha, p in listings}) > 1:
            return None, None, ("no CI recipe at the recording commit lists this case on its platform and the "
                                "recipes of other commits disagree on its world size (world size unknown)")
        when = int(self.repo.git("log", "-1", "--format=%ct", commit).strip())
        _ct, sha, product = min(listings, key=lambda x: (abs(x[0] - when), x[0]))
        return product, sha, None
