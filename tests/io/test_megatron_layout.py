"""``--pipeline-model-parallel-layout`` as Megatron-LM reads it: every layout its functional tests
publish, the documented examples, the grammar's edge cases, Megatron's refusals as one line naming
the argument and the place, the launcher's quoting removed, and round trips of random layouts.

Expected stage lists are facts read off Megatron-LM's own class: ``PipelineParallelLayerLayout(text,
pp)`` (``megatron/core/transformer/pipeline_parallel_layer_layout.py``) and its
``validate_layer_layout`` run from checkouts of core_v0.13.0 (c550cf6c41), core_v0.15.0 (0d7e02bd26)
and main d98e8a64dd, stage ``i`` being ``layout[i % pp][i // pp]``."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timeline.cli import main
from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping, parse_arg_list, parse_yaml, unquote
from timeline.io.megatron_layout import layout_places_mtp, layout_stages, parse_layout, parse_layout_mtp
from timeline.io.megatron_write import convert
from timeline.pipeline.placement import stage_placement

ARG = "--pipeline-model-parallel-layout"
BASE = {"--hidden-size": 128, "--num-attention-heads": 4, "--seq-length": 256, "--micro-batch-size": 1,
        "--global-batch-size": 8, "--bf16": True}


def symbols(text: str) -> list[str]:
    return ["".join(c for c, _ in stage) for stage in layout_stages(text)]


def run_file(layout: str, pp: int, layers: int, mtp: int | None, **kw) -> dict:
    args = BASE | {"--num-layers": layers, "--pipeline-model-parallel-size": pp, ARG: layout}
    if mtp:
        args["--mtp-num-layers"] = mtp
    return convert(from_mapping(args), world_size=pp, **kw).sections


DSV3 = ["Ett", "tt", "tt", "tt", "tt", "tt", "t", "tmL"]
GPT16 = ["Ettt"] + ["tt"] * 6 + ["tmL"]
MOE15 = ["Ettt"] + ["tt"] * 6 + ["mL"]
MOE15_NO_MTP = ["Ettt"] + ["tt"] * 6 + ["L"]
CUDAGRAPH = ["Et"] + ["tt"] * 6 + ["mL"]
GB200 = ["Ettttttt", "tttttttmL"]

#: every layout in a model_config.yaml of Megatron-LM (git grep of tests/functional_tests/test_cases at
#: core_v0.13.0 … core_v0.19.0 and d98e8a64dd; no example script sets one): (file under test_cases/,
#: first … last release holding the line, the line as written, pp, --num-layers, --mtp-num-layers,
#: the stages Megatron's class lists for what the harness passes). The escaped lines are the
#: harness's xargs + eval era (``tests/functional_tests/shell_test_utils/_run_training.sh``).
PUBLISHED = [
    ("moe/gpt3_mr_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental/model_config.yaml",
     "core_v0.14.0 … core_v0.15.3", r"--pipeline-model-parallel-layout: Et*3\\|\\(tt\\|\\)*6tmL # Et*3|(tt|)*6tmL",
     2, 16, 1, GPT16),
    ("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etc1cp1_release_sm/model_config.yml", "core_v0.15.0 … core_v0.15.3",
     r"--pipeline-model-parallel-layout: Et*2\\|\\(tt\\|\\)*5t\\|tmL # Et*2|(tt|)*5t|tmL", 4, 14, 1, DSV3),
    ("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release/model_config.yaml", "core_v0.15.0 … core_v0.16.1",
     r"--pipeline-model-parallel-layout: Et*2\\|\\(tt\\|\\)*5t\\|tmL # Et*2|(tt|)*5t|tmL", 4, 14, 1, DSV3),
    ("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_gb_200_release/model_config.yaml", "core_v0.16.0 … core_v0.16.1",
     r"--pipeline-model-parallel-layout: Et*2\\|\\(tt\\|\\)*5t\\|tmL # Et*2|(tt|)*5t|tmL", 4, 14, 1, DSV3),
    ("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_gb_200_release_sm/model_config.yaml",
     "core_v0.16.0 … core_v0.16.1", r"--pipeline-model-parallel-layout: Et*2\\|\\(tt\\|\\)*5t\\|tmL # Et*2|(tt|)*5t|tmL",
     4, 14, 1, DSV3),
    ("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm/model_config.yaml", "core_v0.16.0 … core_v0.16.1",
     r"--pipeline-model-parallel-layout: Et*2\\|\\(tt\\|\\)*5t\\|tmL # Et*2|(tt|)*5t|tmL", 4, 14, 1, DSV3),
    ("moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental/model_config.yaml",
     "core_v0.16.0 … core_v0.16.1", r"--pipeline-model-parallel-layout: Et*3\\|\\(tt\\|\\)*6tmL # Et*3|(tt|)*6tmL",
     2, 16, 1, GPT16),
    ("moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/model_config.yaml", "core_v0.16.0 … core_v0.16.1",
     r"--pipeline-model-parallel-layout: Et*3\\|\\(tt\\|\\)*6mL # Et*3|(tt|)*6mL", 2, 15, 1, MOE15),
    ("moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading/model_config.yaml",
     "core_v0.16.0 … core_v0.16.1", r"--pipeline-model-parallel-layout: Et*3\\|\\(tt\\|\\)*6L # Et*3|(tt|)*6L",
     2, 15, None, MOE15_NO_MTP),
    ("moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/model_config.yaml", "core_v0.16.0 … core_v0.16.1",
     r"--pipeline-model-parallel-layout: Et\\|\\(tt\\|\\)*6mL # Et|(tt|)*6mL", 2, 13, 1, CUDAGRAPH),
    ("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release/model_config.yaml", "core_v0.17.0 … d98e8a64dd",
     "--pipeline-model-parallel-layout: Et*2|(tt|)*5t|tmL", 4, 14, 1, DSV3),
    ("mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release_sm/model_config.yaml", "core_v0.17.0 … d98e8a64dd",
     "--pipeline-model-parallel-layout: Et*2|(tt|)*5t|tmL", 4, 14, 1, DSV3),
    ("mixtral/deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release/model_config.yaml", "core_v0.17.0 … d98e8a64dd",
     '--pipeline-model-parallel-layout: "Et*7|t*7mL"', 2, 14, 1, GB200),
    ("mixtral/deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_release_sm/model_config.yaml",
     "core_v0.17.0 … d98e8a64dd", '--pipeline-model-parallel-layout: "Et*7|t*7mL"', 2, 14, 1, GB200),
    ("moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental/model_config.yaml",
     "core_v0.17.0 … d98e8a64dd", "--pipeline-model-parallel-layout: Et*3|(tt|)*6tmL", 2, 16, 1, GPT16),
    ("moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading/model_config.yaml", "core_v0.17.0 … d98e8a64dd",
     "--pipeline-model-parallel-layout: Et*3|(tt|)*6mL", 2, 15, 1, MOE15),
    ("moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading/model_config.yaml",
     "core_v0.17.0 … d98e8a64dd", "--pipeline-model-parallel-layout: Et*3|(tt|)*6L", 2, 15, None, MOE15_NO_MTP),
    ("moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/model_config.yaml", "core_v0.17.0 … d98e8a64dd",
     "--pipeline-model-parallel-layout: Et|(tt|)*6mL", 2, 13, 1, CUDAGRAPH),
]


@pytest.mark.parametrize(("source", "releases", "line", "pp", "layers", "mtp", "stages"), PUBLISHED,
                         ids=[f"{r[0].split('/')[1]}@{r[1].split()[0]}" for r in PUBLISHED])
def test_published_layouts(source, releases, line, pp, layers, mtp, stages):
    value = parse_yaml(f"MODEL_ARGS:\n  {line}\n", Path(source)).args[ARG]
    assert symbols(value) == stages
    counts = [s.count("t") for s in stages]
    assert parse_layout(value, pp, num_layers=layers, mtp_layers=mtp) == (counts, len(stages) // pp)
    par = run_file(value, pp, layers, mtp)["parallel"]
    assert (par["layout"], par["vpp"]) == (counts, len(stages) // pp)


def test_virtual_stage_i_is_vp_stage_i_div_pp_of_rank_i_mod_pp():
    """Megatron's golden layer numbers per (pp rank, vp stage) for this layout, pp 4, vpp 2
    (``tests/unit_tests/transformer/test_transformer_block.py: test_layout_layer_number``@d98e8a64dd),
    from the counts and the run file's interleaved placement."""
    counts, vpp = parse_layout("E|t|t*2|t||t|t|t*2L", 4, num_layers=8)
    first = [sum(counts[:c]) + 1 for c in range(len(counts))]
    numbers = [[list(range(first[c], first[c] + counts[c])) for c in chunks]
               for chunks in stage_placement("interleaved", 4, vpp)]
    assert numbers == [[[], []], [[1], [5]], [[2, 3], [6]], [[4], [7, 8]]]


#: documented examples: arguments.py's --help, docs/user-guide (pipeline_parallel_layout.md,
#: multi_token_prediction.md), transformer_config.py's docstring, at d98e8a64dd: (text, pp, layers, mtp,
#: Megatron's stages, None where d98e8a64dd accepts and the run file can hold it, else what we say)
DOCUMENTED = [
    ("E|(t|)*3,m|m||L", 2, 3, 2, ["E", "t", "t", "t", "m", "m", "", "L"], "last virtual stage of their rank"),
    ("Et*3|(tt|)*29,m|L", 16, 61, 1, ["Ettt"] + ["tt"] * 29 + ["m", "L"], "apart from the loss"),
    ("E|(tt|)*2,(t|)*4,mL", 4, 8, 1, ["E", "tt", "tt", "t", "t", "t", "t", "mL"], None),
    ("E|t*3|(t|)*5mL", 4, 8, 1, ["E", "ttt", "t", "t", "t", "t", "t", "mL"], None),
    ("E|t*3|(t|)*4tm|L", 4, 8, 1, ["E", "ttt", "t", "t", "t", "t", "tm", "L"], "apart from the loss"),
    ("E|t*3|(t|)*3tt|m|L", 4, 8, 1, ["E", "ttt", "t", "t", "t", "tt", "m", "L"], "apart from the loss"),
]


@pytest.mark.parametrize(("text", "pp", "layers", "mtp", "stages", "refusal"), DOCUMENTED)
def test_documented_layouts(text, pp, layers, mtp, stages, refusal):
    assert symbols(text) == stages
    if refusal is None:
        assert parse_layout(text, pp, num_layers=layers, mtp_layers=mtp)[0] == [s.count("t") for s in stages]
    else:
        with pytest.raises(UserError, match=refusal):
            parse_layout(text, pp, num_layers=layers, mtp_layers=mtp)


#: the grammar's corners, each checked against Megatron's class (d98e8a64dd and core_v0.13.0 agree):
#: stages, or the 1-based character Megatron's assertion stops at
CORNERS = [
    ("E(*0t|tL", ["Et", "tL"]),            # x*n takes any character: '(' times 0
    ("Et|*2tL", ["Et", "", "tL"]),         # '|' times 2: an empty stage
    ("Et*1,2|L", ["E" + "t" * 12, "L"]),   # commas go first, so 1,2 is 12
    ("(t|)*0Et|L", ["Et", "L"]),
    ("E(t|)*2,t*0L", ["Et", "t", "L"]),
    ("Et|(|)*3tL", ["Et", "", "", "", "tL"]),
    ("E(tt|)*2*2L", ["Ett", "tt", "", "L"]),  # groups unroll first, then '|*2'
    ("((tt|)*2|t)*2", 2),                  # no nesting: the body stops at the first ')'
    ("E t|tL", 2),                         # no whitespace
    ("E(tt)|L", 2),                        # a group needs *n
    ("Et**2|L", 3),
]


@pytest.mark.parametrize(("text", "expected"), CORNERS)
def test_grammar_corners_as_megatron(text, expected):
    if isinstance(expected, list):
        assert symbols(text) == expected
    else:
        with pytest.raises(UserError, match=rf"^{ARG} .*: character {expected} "):
            symbols(text)


@pytest.mark.parametrize(("text", "pp", "layers", "mtp", "needle"), [
    ("Et|tt|tL", 2, 4, None, "3 stages do not divide over --pipeline-model-parallel-size 2"),
    ("tE|L", 1, 1, None, "first layer must be the embedding E, got 't' (character 1)"),
    ("|", 1, 0, None, "got nothing"),
    ("Et|tLt", 2, 3, None, "last layer must be the loss L, got 't' (character 6)"),
    ("Et|EtL", 2, 2, None, "embedding E must appear exactly once; again at character 4"),
    ("EtL|tL", 2, 2, None, "loss L must appear exactly once; again at character 6"),
    ("Et*3|tL", 2, 5, None, "lists 4 decoder layers (t); --num-layers is 5"),
    ("Et|tmL", 2, 2, None, "lists 1 MTP layers (m); --mtp-num-layers is 0"),
    ("Et|mtL", 2, 2, 1, "the t at character 5 follows an m"),
    ("Et|t|m|||L", 2, 2, 1, "virtual stage 2 (pp rank 0, vp stage 1) is not"),
    ("Et|t|m|mL", 2, 2, 2, "in virtual stage 2 (pp rank 0, vp stage 1) and virtual stage 3"),
    ("Et|tm|L", 3, 2, 1, "on virtual stage 1 (pp rank 1, vp stage 0), apart from the loss"),
])
def test_megatrons_refusals_name_the_place(text, pp, layers, mtp, needle):
    with pytest.raises(UserError) as exc:
        parse_layout(text, pp, num_layers=layers, mtp_layers=mtp)
    assert str(exc.value).startswith(f"{ARG} {text!r}: ") and needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_repetition_past_any_job_is_refused_not_expanded():
    with pytest.raises(UserError, match=r"repetition \*99999999999 at character 2 expands the layout past 1,048,576"):
        symbols("Et*99999999999|L")
    assert symbols("E(t|)*1000L") == ["Et"] + ["t"] * 999 + ["L"]


def test_versions():
    """core_v0.13.0 refuses m in a layout and builds --mtp-num-layers on the last stage without counting."""
    assert parse_layout("Et|tL", 2, num_layers=2, mtp_layers=1, megatron_core=(0, 13, 0)) == ([1, 1], 1)
    with pytest.raises(UserError, match="Megatron-Core 0.14.0 or later"):
        parse_layout("Et|tmL", 2, num_layers=2, mtp_layers=1, megatron_core=(0, 13, 0))
    with pytest.raises(UserError, match="--mtp-num-layers is 1"):
        parse_layout("Et|tL", 2, num_layers=2, mtp_layers=1, megatron_core=(0, 15, 0))
    with pytest.raises(UserError, match="0.14.0 or later"):
        run_file("Et|tmL", 2, 2, 1, megatron_core="0.13.1")


@pytest.mark.parametrize(("version", "places"), [("0.13.1", False), ("0.14.0rc0", False), ("0.14.0rc7", False),
                                                 ("0.14.0", True), ("0.14.1", True), ("0.15.0rc0", True),
                                                 ("0.16.0", True), ("1.0.0rc1", True)])
def test_only_releases_from_core_v0_14_0_place_mtp_by_the_layout(version, places):
    """validate_layer_layout raised NotImplementedError for an m through core_v0.14.0rc7 (main's 0.14.0rcN too, up to
    d7bf5aaaa8 at 0.15.0rc0), building --mtp-num-layers on the last stage whatever the layout said."""
    assert layout_places_mtp(version) is places
    if not places:  # the layout of moe/gpt3_mr_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental at 0.14.0rc2
        sections = run_file("Et*3|(tt|)*6tL", 2, 16, 1, megatron_core=version)
        assert "mtp_stage" not in sections["parallel"] and sections["model"]["mtp_layers"] == 1
        with pytest.raises(UserError, match="core_v0.14.0rc7 raise NotImplementedError"):
            run_file("Et*3|(tt|)*6tmL", 2, 16, 1, megatron_core=version)


@pytest.mark.parametrize("other", [("--num-virtual-stages-per-pipeline-rank", 2),
                                   ("--decoder-first-pipeline-num-layers", 1),
                                   ("--account-for-loss-in-pipeline-split", True)])
def test_another_split_beside_a_layout_is_refused(other):
    args = BASE | {"--num-layers": 2, "--pipeline-model-parallel-size": 2, ARG: "Et|tL", other[0]: other[1]}
    with pytest.raises(UserError, match=f"{ARG} cannot be given with {other[0]}"):
        convert(from_mapping(args), world_size=2)


#: Megatron's documented DeepSeek-V3 layout without the comma, as launch scripts quote it
SCRIPT_FORMS = ['"Et*3|(tt|)*29m|L"', "'Et*3|(tt|)*29m|L'", r"Et*3\|\(tt\|\)*29m\|L", "$'Et*3|(tt|)*29m|L'",
                r"$'Et*3\x7c(tt|)*29m|L'", r'"Et*3\\|\\(tt\\|\\)*29m\\|L"', "Et*3'|('tt'|)'*29m\"|\"L"]


@pytest.mark.parametrize("word", SCRIPT_FORMS)
def test_launch_script_quoting(word):
    text = f"torchrun pretrain_gpt.py \\\n  --num-layers 61 {ARG} {word} # it's the V3 split\n  --bf16\n"
    value = parse_arg_list(text).args[ARG]
    assert value == "Et*3|(tt|)*29m|L"
    assert symbols(value) == ["Ettt"] + ["tt"] * 29 + ["m", "L"]


def test_yaml_quoting_and_what_is_left_alone():
    for written in ('"Et|tL"', "'Et|tL'", r"Et\\|tL", "'\"Et|tL\"'"):
        assert parse_yaml(f"MODEL_ARGS:\n  {ARG}: {written}\n", Path("m.yaml")).args[ARG] == "Et|tL"
    assert unquote("$PP_LAYOUT") == "$PP_LAYOUT"  # a variable stays for the reader to refuse by name
    assert unquote('"Et|tL') == '"Et|tL'  # unbalanced: the parser names the stray quote
    args = parse_arg_list("--prompts 'a\\\\b' --stop-words \"'x'\"").args
    assert args == {"--prompts": "a\\\\b", "--stop-words": "'x'"}  # only the layout is un-quoted further


def test_a_bad_layout_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "model_config.yaml"
    args = {k.removeprefix("--"): v for k, v in BASE.items()}
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {k}: {v}\n" for k, v in args.items())
                    + f"  num-layers: 4\n  pipeline-model-parallel-size: 2\n  {ARG}: Et|(tt|)*2|tL\n")
    assert main(["from-megatron", str(path), "--world-size", "2", "-o", str(tmp_path / "x.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {ARG} 'Et|(tt|)*2|tL': 5 stages do not divide over --pipeline-model-parallel-size 2; "
                   "Megatron needs pp·vpp stages, one per virtual stage"]  # Et, tt, tt, the empty one, tL
    assert not (tmp_path / "x.toml").exists()


# -- round trips: a random list of stages, written with grouping, repetition and commas ------------------

def _write_stage(stage: str, draw) -> str:
    """One stage's symbols, runs written as x*n (or a group (xy)*n) where the draw says so."""
    out, i = [], 0
    while i < len(stage):
        run = len(stage) - i - len(stage[i:].lstrip(stage[i]))
        k = draw(st.integers(1, run))
        out.append(f"{stage[i]}*{k}" if k > 1 or draw(st.booleans()) else stage[i])
        i += k
    if len(out) > 1 and draw(st.booleans()):
        out.append(f"{out[-1][0]}*0")  # repeats nothing
    return "".join(out)


@st.composite
def written_layouts(draw) -> tuple[list[str], str]:
    """(stages, a text for them): runs of equal stages as (body|)*k or (|body)*k where the draw says."""
    runs = st.lists(st.tuples(st.sampled_from("EtmL"), st.integers(1, 12)), max_size=3)
    pool = draw(st.lists(runs.map(lambda rs: "".join(c * n for c, n in rs)), min_size=1, max_size=3))
    stages = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=9))  # a small pool: equal neighbours
    text, sep, i = "", False, 0  # sep: the next stage still needs its '|'
    while i < len(stages):
        same = next((j for j in range(i, len(stages)) if stages[j] != stages[i]), len(stages)) - i
        k, form = draw(st.integers(1, same)), draw(st.sampled_from(["plain", "trailing", "leading"]))
        body = _write_stage(stages[i], draw)
        if form == "trailing" and i + k < len(stages):  # a trailing '|' after the last stage would add one
            text += ("|" if sep else "") + f"({body}|)*{k}"
            sep = False
        elif form == "leading" and sep:
            text += f"(|{body})*{k}"
        else:
            text += ("|" if sep else "") + body
            sep, k = True, 1
        i += k
    for _ in range(draw(st.integers(0, 3))):  # commas are dropped before anything else
        at = draw(st.integers(0, len(text)))
        text = text[:at] + "," + text[at:]
    return stages, text


@settings(max_examples=150, deadline=None)
@given(written_layouts())
def test_written_layouts_parse_back(case):
    stages, text = case
    assert symbols(text) == stages


@settings(max_examples=80, deadline=None)
@given(written_layouts(), st.integers(1, 3))
def test_quoted_layouts_parse_back(case, times):
    _, text = case
    word = text
    for _ in range(times):
        word = shlex.quote(word)
    assert unquote(word) == text
    assert parse_arg_list(f"{ARG} {shlex.quote(text)}").args[ARG] == text


#: the documented layouts with MTP apart from the loss (``mtp_standalone``), from Megatron-Core 0.16.0 on:
#: (text, pp, layers, the virtual stage of the m)
APART = [("Et*3|(tt|)*29,m|L", 16, 61, 30), ("E|t*3|(t|)*4tm|L", 4, 8, 6), ("E|t*3|(t|)*3tt|m|L", 4, 8, 6)]


@pytest.mark.parametrize(("text", "pp", "layers", "stage"), APART)
def test_mtp_apart_from_the_loss_maps_to_mtp_stage_from_0_16(text, pp, layers, stage):
    counts, vpp, at = parse_layout_mtp(text, pp, num_layers=layers, mtp_layers=1, megatron_core=(0, 16, 0))
    assert at == stage and counts == [s.count("t") for s in symbols(text)]
    args = from_mapping(BASE | {"--num-layers": layers, "--pipeline-model-parallel-size": pp, ARG: text,
                                "--mtp-num-layers": 1, "--global-batch-size": 2 * pp})
    par = convert(args, world_size=pp, megatron_core="0.16.0").sections["parallel"]
    assert (par["layout"], par["vpp"], par["mtp_stage"]) == (counts, vpp, stage)
    with pytest.raises(UserError, match="apart from the loss, which Megatron-Core allows from 0.16.0 on"):
        convert(args, world_size=pp, megatron_core="0.15.3")  # before 5247a1f460
    # a job that names no version is read at MEGATRON_DEFAULT (0.19.0), which places it
    assert convert(args, world_size=pp).sections["parallel"]["mtp_stage"] == stage


def test_mtp_with_the_loss_sets_no_mtp_stage():
    assert "mtp_stage" not in run_file("E|t*3|(t|)*5mL", 4, 8, 1, megatron_core="0.16.0")["parallel"]


def test_from_megatron_simulates_a_standalone_mtp_stage(tmp_path, capsys):
    """Megatron's documented ``E|t*3|(t|)*3tt|m|L`` at pp 4 (vpp 2): the MTP stage is pp rank 2's second chunk."""
    args = tmp_path / "args.txt"
    args.write_text(" ".join(f"{k} {v}" if v is not True else k for k, v in (BASE | {
        "--num-layers": 8, "--pipeline-model-parallel-size": 4, "--mtp-num-layers": 1,
        ARG: shlex.quote("E|t*3|(t|)*3tt|m|L")}).items()))
    out = tmp_path / "run.toml"
    assert main(["from-megatron", str(args), "--world-size", "4", "--megatron-core", "0.16.0", "-o", str(out)]) == 0
    assert "mtp_stage = 6" in out.read_text()
    assert main(["simulate", str(out), "-o", str(tmp_path / "sim"), "--format", "summary", "--no-progress"]) == 0


def test_layers_per_virtual_stage_count_the_embedding_and_loss_when_the_split_accounts_for_them():
    """arguments.py: validate_args (core_v0.16.0): under --account-for-embedding/loss-in-pipeline-split the embedding
    and the loss are a layer each before --num-layers-per-virtual-pipeline-stage divides (Megatron-MoE-ModelZoo's
    Qwen3-235B-A22B: 94 layers, pp 8, 3 a virtual stage → 96 / 24 = 4 virtual stages)."""
    from timeline.errors import UserError
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    args = {"--num-layers": 94, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 64, "--bf16": True,
            "--vocab-size": 1000, "--pipeline-model-parallel-size": 8, "--num-layers-per-virtual-pipeline-stage": 3,
            "--account-for-embedding-in-pipeline-split": True, "--account-for-loss-in-pipeline-split": True}
    par = convert(from_mapping(args), world_size=8, megatron_core="0.16.0").sections["parallel"]
    assert par["vpp"] == 4 and sum(par["layout"]) == 94 and len(par["layout"]) == 32
    assert par["layout"][0] == 2 and par["layout"][-1] == 2  # the embedding's and the loss's stages hold one less
    with pytest.raises(UserError, match="94 layers do not divide"):
        convert(from_mapping({k: v for k, v in args.items() if not k.startswith("--account")}), world_size=8,
                megatron_core="0.16.0")
