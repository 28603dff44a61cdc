"""Which Megatron-Core version an argument belongs to: the release a version string is read as, and
the one-line errors for a typo or an argument of another version."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.io.megatron_versions import check_argument, known, version_index


@pytest.mark.parametrize(("version", "label"), [
    ("0.12.0", "core_v0.12.0"), ("0.12", "core_v0.12.0"), ("0.13.0rc2", "core_v0.13.0"), ("0.14.0", "core_v0.14.0"),
    ("0.15.2", "core_v0.15.2"), ("0.17.5", "core_v0.17.1"), ("0.18.1", "core_v0.18.0"), ("0.19.0", "core_v0.19.0"),
    ("0.19.1", "core_v0.19.0"), ("0.20.0", "main"), ("0.21.0", "main"), ("0.11.0", "core_v0.12.0"),
])
def test_a_version_is_read_as_its_release_or_the_newest_before_it(version, label):
    from timeline.io.megatron_versions import _index

    assert _index()[0][version_index(version)][0] == label


def test_typos_name_the_closest_real_arguments():
    with pytest.raises(UserError, match=r"did you mean --recompute-granularity\? \(or --recompute-num-layers"):
        check_argument("--recompute-granularty", None)
    with pytest.raises(UserError, match=r"^--zzz-qqq: not an argument of Megatron-LM's training parser "
                                        r"\(core_v0\.12\.0 … main\); if it is a fork's \(or a pre-core_v0\.12 "
                                        r"Megatron-LM's\) own argument, --ignore-arg zzz-qqq passes over it; a job of "
                                        r"a Megatron-LM later than main \(--megatron-core 0\.20\.0 or later\) has "
                                        r"them passed over with a note$"):
        check_argument("--zzz-qqq", None)


def test_a_job_after_every_parser_read_has_unknown_arguments_passed_over_with_a_note():
    """Megatron-LM adds arguments every week: a job of main's release (0.20.0 at d98e8a64dd) or later may have
    arguments no parser read has; they are passed over as memory-neutral, said in a note, with a typo's likely
    intent. An earlier release refuses them as before (a typo or a fork's)."""
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    args = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
            "--vocab-size": 1000, "--tokenizer-type": "NullTokenizer", "--use-brand-new-thing": True,
            "--recompute-granularty": "full"}
    c = convert(from_mapping(args), world_size=8, megatron_core="0.21.0")
    assert c.neutral["--use-brand-new-thing"] == "in no parser read, the job's release later (unverified)"
    note = next(n for n in c.notes if n.startswith("--use-brand-new-thing, --recompute-granularty (or a typo of "
                                                    "--recompute-granularity"))
    assert "--megatron-core 0.21.0 is that release or later" in note and "these numbers miss it" in note
    assert c.sections["model"]["num_layers"] == 2
    with pytest.raises(UserError, match="^2 arguments are not arguments of Megatron-LM's training parser"):
        convert(from_mapping(args), world_size=8, megatron_core="0.19.0")


def test_deprecated_aliases_and_negations_are_arguments():
    assert known("--override-opt_param-scheduler") and known("--no-tp-comm-bulk-dgrad")
    assert known("--disable-tp-comm-bulk-dgrad") and not known("--num-experts-per-tok")


def test_version_of_an_argument():
    check_argument("--step-batch-size-schedule", "0.18.0")  # there: no error
    check_argument("--use-legacy-models", "0.17.1")
    with pytest.raises(UserError, match=r"introduced in Megatron-Core 0\.18\.0 \(core_v0\.18\.0\); "
                                        r"--megatron-core 0\.17\.1 does not have it"):
        check_argument("--step-batch-size-schedule", "0.17.1")
    with pytest.raises(UserError, match=r"removed after Megatron-Core 0\.17\.1 \(core_v0\.17\.1\)"):
        check_argument("--use-legacy-models", "0.18.0")
    # --no-tp-comm-bulk-dgrad: 0.12–0.15 as the only negation, and from 0.16 the dataclass alias too
    check_argument("--disable-tp-comm-bulk-dgrad", "0.12.0")
    with pytest.raises(UserError, match=r"introduced in Megatron-Core 0\.16\.0"):
        check_argument("--no-tp-comm-bulk-dgrad", "0.15.3")


def test_an_argument_of_main_between_releases():
    """``--initialize-socket-comms`` was on main and dev from a6c6250f9c (2025-08-26) to d9153a50ce (2025-10-21) only:
    an argument, of no release; a release's version refuses it saying so, a main snapshot's accepts it."""
    assert known("--initialize-socket-comms")
    check_argument("--initialize-socket-comms", None)
    check_argument("--initialize-socket-comms", "0.15.0rc4")
    with pytest.raises(UserError, match=r"^--initialize-socket-comms: in no release \(an argument of Megatron-LM "
                                        r"main or dev only between releases: a6c6250f9c 2025-08-26 … d9153a50ce 2025-10-21\); "
                                        r"--megatron-core 0.14.0 is a release"):
        check_argument("--initialize-socket-comms", "0.14.0")


def test_a_main_snapshot_has_what_its_neighbouring_releases_have():
    """A pre-release (X.Y.ZrcN, a main snapshot's package_info) lies after the release before X.Y.Z and, its version
    lagging behind main, possibly past later releases: it may have X.Y.Z's removals and later releases' additions,
    never what was gone before the release preceding it."""
    with pytest.raises(UserError, match="removed after Megatron-Core 0.17.1"):
        check_argument("--use-legacy-models", "0.18.0")
    check_argument("--use-legacy-models", "0.18.0rc2")  # the snapshot before 0.18.0 still had it
    check_argument("--step-batch-size-schedule", "0.17.0rc0")  # a lagging 0.17 snapshot may have 0.18's
    with pytest.raises(UserError, match="removed after Megatron-Core 0.17.1"):
        check_argument("--use-legacy-models", "0.19.0rc0")  # gone before 0.18.0, the release before 0.19.0
