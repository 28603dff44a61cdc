"""Which CI recipe product ran a measured Megatron-LM golden (``tools/megatron_recipes.py``, the recipe readers of
``tools/megatron_case_record.py``): both recipe layouts, the golden's environment, and the release lines' history
of recipes where the recording commit's own list no product (issue 31 item 5)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MEGATRON_GIT = ROOT.parent / ".mirror" / "NVIDIA+Megatron-LM" / "repo"
needs_git = pytest.mark.skipif(not MEGATRON_GIT.exists(), reason="no Megatron-LM mirror here (CI has none)")
sys.path.insert(0, str(ROOT / "tools"))  # the tools import their siblings by name

import collect_megatron_cases as collect  # noqa: E402
import megatron_case_record as rec  # noqa: E402
import megatron_recipes as recipes  # noqa: E402

#: 2024's jet_recipes layout (tests/functional_tests/jet_recipes/gpt.yaml before 522e567ea3): a product names its cases
JET_2024 = """
spec: {model: gpt, nodes: 1, gpus: 8, script: "TRAINING_SCRIPT_PATH=pretrain_gpt.py"}
products:
  - environment: [lts, dev]
    scope: [mr]
    platforms: [dgx_a100]
    test_case: [gpt3_a, gpt3_b]
"""
#: the later layout (tests/test_utils/recipes/gpt.yaml at eb48e81bd7): a case names its products; the lts product
#: takes the spec's platform
RECIPE_2025 = """
spec: {model: gpt, nodes: 1, gpus: 8, platforms: dgx_a100}
products:
  - test_case: [gpt3_c]
    products:
      - {environment: [dev], scope: [mr], platforms: [dgx_h100]}
      - {environment: [lts], scope: [nightly]}
  - test_case: [gpt3_d]
    products:
      - {environment: [dev], platforms: [dgx_h100], nodes: 2}
"""


def test_both_recipe_layouts_list_products_with_their_environments():
    old = rec.recipe_worlds({"jet_recipes/gpt.yaml": JET_2024})
    assert [(p["gpu"], p["environments"], p["nodes"] * p["gpus"], p["script_family"]) for p in old[("gpt", "gpt3_b")]] \
        == [("A100", ["lts", "dev"], 8, "gpt")]
    new = rec.recipe_worlds({"recipes/gpt.yaml": RECIPE_2025})
    assert [(p["gpu"], p["environments"]) for p in new[("gpt", "gpt3_c")]] == [("H100", ["dev"]), ("A100", ["lts"])]
    assert new[("gpt", "gpt3_d")][0]["nodes"] == 2


def test_the_golden_s_environment_picks_the_product():
    """An lts golden naming no platform ran on the lts product's A100, not the dev product's H100 (the
    golden_values_lts.json files of eb48e81bd7 and 23a1dcaf74 were read as H100 before)."""
    products = rec.recipe_worlds({"recipes/gpt.yaml": RECIPE_2025})[("gpt", "gpt3_c")]
    assert recipes.chosen(products, rec.golden_tag("x/golden_values_lts.json"))["gpu"] == "A100"
    assert recipes.chosen(products, rec.golden_tag("x/golden_values_dev.json"))["gpu"] == "H100"
    assert recipes.chosen(products, rec.golden_tag("x/golden_values_dev_dgx_a100.json")) is None
    assert recipes.chosen(products, rec.golden_tag("x/golden_values_lts_dgx_h100.json")) is None


class FakeRepo:
    """Commits (sha, committer time, recipe text or None) on one release line, oldest first."""

    def __init__(self, commits: list[tuple[str, int, str | None]]) -> None:
        self.commits = commits

    def read(self, spec: str) -> str | None:
        return next((text for sha, _t, text in self.commits if spec == f"blob-{sha}"), None)

    def git(self, *args: str) -> str:
        if args[0] == "ls-tree":
            text = next(text for sha, _t, text in self.commits if sha == args[2])
            return "" if text is None else f"100644 blob blob-{args[2]}\ttests/test_utils/recipes/gpt.yaml\n"
        if args[:2] == ("log", "-1"):
            return str(next(t for sha, t, _ in self.commits if sha == args[-1]))
        assert args[0] == "log"
        return "\n".join(f"{sha} {t}" for sha, t, _ in reversed(self.commits))


def _listing(nodes: int) -> str:
    return f"spec: {{model: gpt, nodes: {nodes}, gpus: 8, platforms: dgx_a100}}\nproducts:\n  - test_case: [gpt3_x]\n"


def test_a_case_unlisted_at_its_commit_takes_the_nearest_listing_of_the_release_lines():
    unlisted = "spec: {model: gpt}\nproducts: []\n"
    repo = FakeRepo([("a", 100, _listing(1)), ("b", 200, unlisted), ("c", 250, _listing(1)), ("d", 900, _listing(1))])
    tag = rec.golden_tag("x/golden_values_dev_dgx_a100.json")
    product, commit, why = recipes.Recipes(repo, ["refs/heads/main"]).product("gpt/gpt3_x", tag, "b")
    assert (product["nodes"] * product["gpus"], commit, why) == (8, "c", None)  # 50 s after beats 100 s before
    product, commit, _ = recipes.Recipes(repo, ["refs/heads/main"]).product("gpt/gpt3_x", tag, "a")
    assert commit == "a"  # listed at its own commit
    assert recipes.Recipes(repo, ["refs/heads/main"]).product("gpt/other", tag, "b")[2].startswith(
        "no CI recipe lists this case in its environment on its platform")


def test_recipes_that_disagree_on_the_world_size_leave_it_unknown():
    repo = FakeRepo([("a", 100, _listing(1)), ("b", 200, "spec: {model: gpt}\n"), ("c", 300, _listing(2))])
    product, commit, why = recipes.Recipes(repo, ["refs/heads/main"]).product(
        "gpt/gpt3_x", rec.golden_tag("x/golden_values_dev_dgx_a100.json"), "b")
    assert product is None and commit is None and "disagree on its world size" in why


@needs_git
def test_a_golden_written_where_its_recipe_had_moved_platform_takes_the_release_lines_recipe():
    """gpt3_7b_mr_dgx_a100_1N8G_tp1_pp4_memory_speed's A100 golden was rewritten by 2795ebde97 (2025-07-05), whose
    gpt.yaml runs the case on dgx_h100 only; 629b6150f8 (26 days earlier, on main) lists it on dgx_a100, 1 node × 8."""
    repo = collect.Repo(MEGATRON_GIT)
    book = recipes.Recipes(repo, ["629b6150f8^!"])  # one commit of the release lines' history
    tag = rec.golden_tag("x/golden_values_dev_dgx_a100.json")
    name = "gpt/gpt3_7b_mr_dgx_a100_1N8G_tp1_pp4_memory_speed"
    assert recipes.chosen(book.at("2795ebde97").get(tuple(name.split("/", 1)), []), tag) is None
    product, commit, why = book.product(name, tag, "2795ebde97")
    assert why is None and commit.startswith("629b6150f8")
    assert (product["nodes"], product["gpus"], product["gpu"], product["path"]) == (
        1, 8, "A100", "tests/test_utils/recipes/gpt.yaml")
