"""Training options declared once (pipeline/core/config.py): the CLI, the checks, the resume rule,
run identity and docs/OPTIONS.md are all derived from TrainConfig's fields; the registries are
the one list of names; --help reads no torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from conftest import ROOT

from cli.main import cli
from cli.train_options import given_values, options_markdown, train_options
from pipeline.core import registry
from pipeline.core.config import (
    TrainConfig,
    execution_only,
    old_defaults,
    option,
    resume_config,
    resume_may_change,
)
from pipeline.core.errors import VseError


@dataclasses.dataclass
class WithOneMoreOption(TrainConfig):
    """TrainConfig plus one option, declared the one way an option is declared."""

    warmup_lr: float = option(0.0, "Linear lr warm-up from this value.", minimum=0, before=0.0)
    report_every: int = option(5, "A resume-changeable option.", minimum=1, resume=True, identity=False)


def _command(config_class):
    @click.command()
    @train_options(config_class=config_class)
    @click.pass_context
    def command(ctx, loss_option, **options):
        values, given = given_values(ctx, options, loss_option)
        click.echo(repr(config_class.from_dict({"features": "x.h5", **values})))

    return command


def test_a_new_option_is_one_field_seen_by_help_checks_resume_and_identity():
    command = _command(WithOneMoreOption)
    help_text = " ".join(CliRunner().invoke(command, ["--help"]).output.split())
    assert "--warmup-lr FLOAT Linear lr warm-up from this value. [default: 0.0]" in help_text
    assert "--report-every INTEGER" in help_text and "--warmup-lr" not in " ".join(
        CliRunner().invoke(_command(TrainConfig), ["--help"]).output.split())
    assert "warmup_lr=0.25" in CliRunner().invoke(command, ["--warmup-lr", "0.25"]).output
    # the checks: type and range, from a flag or a config file alike
    with pytest.raises(VseError, match="warmup_lr must be at least 0, got -1.0"):
        WithOneMoreOption.from_dict({"features": "x.h5", "warmup_lr": -1})
    with pytest.raises(VseError, match="warmup_lr must be a number, got 'fast'"):
        WithOneMoreOption.from_dict({"features": "x.h5", "warmup_lr": "fast"})
    # the resume rule: a changed warmup_lr is refused, a changed report_every is allowed
    saved = WithOneMoreOption(features="x.h5", run_dir="r").to_dict()
    new = WithOneMoreOption(features="x.h5", run_dir="r", warmup_lr=0.5)
    with pytest.raises(VseError, match=r"--resume may not change warmup_lr 0.5 \(the run's: 0.0\)"):
        resume_config(saved, new, {"warmup_lr"}, "r/last.pt", cls=WithOneMoreOption)
    config, _, notes = resume_config(saved, WithOneMoreOption(features="x.h5", run_dir="r", report_every=9),
                                     {"report_every"}, "r/last.pt", cls=WithOneMoreOption)
    assert config.report_every == 9 and notes == ["report_every 9 (was 5)"]
    assert "report_every" in resume_may_change(WithOneMoreOption)
    assert "warmup_lr" not in resume_may_change(WithOneMoreOption)
    # identity and runs that predate it
    assert "report_every" in execution_only(WithOneMoreOption)
    assert old_defaults(WithOneMoreOption)["warmup_lr"] == 0.0
    older = {k: v for k, v in saved.items() if k != "warmup_lr"}
    resumed, _, _ = resume_config(older, WithOneMoreOption(**saved), None, "r", cls=WithOneMoreOption)
    assert resumed.warmup_lr == 0.0


def test_what_the_lists_used_to_say_now_comes_from_the_fields():
    assert resume_may_change() == ("run_dir", "epochs", "val_every", "workers", "preload", "device",
                                   "log_every")
    # grid is implied by rc + image_pool (it only says it aloud), so it adds nothing to a run's identity
    assert set(execution_only()) == {"run_dir", "seed", "workers", "log_every", "preload", "device", "grid"}
    assert old_defaults()["adam_kernel"] == "default" and old_defaults()["max_caption_tokens"] == 100


def test_choices_come_from_the_registries_and_are_checked_in_config_files_too():
    assert TrainConfig.default("loss") in registry.LOSSES
    with pytest.raises(VseError, match="--crop must be one of random, random-resized, not 'centre'"):
        TrainConfig.from_dict({"features": "x.h5", "crop": "centre"})
    with pytest.raises(VseError, match="--backbone must be one of efficientnet-lite0"):
        TrainConfig.from_dict({"features": "x.h5", "backbone": "resnet50"})
    with pytest.raises(VseError, match="--projection must be one of linear, mlp, not 'deep'"):
        TrainConfig.from_dict({"features": "x.h5", "projection": "deep"})


def test_every_registry_name_resolves_to_its_part():
    from pipeline.backbones.cnns import BUILDERS
    from pipeline.networks.heads import pool_class
    from pipeline.reports.report import LAYOUTS

    assert tuple(LAYOUTS) == registry.REPORT_LAYOUTS  # `vse report --columns` offers what report.py has
    LOSSES = registry.LOSSES.resolved()
    assert tuple(LOSSES) == registry.LOSSES.names
    for name, cls in LOSSES.items():
        assert cls.name == name  # the class says the name it is registered under
    assert tuple(BUILDERS) == registry.BACKBONES.names and all(map(callable, BUILDERS.values()))
    for name in registry.SET_POOLS:
        assert pool_class(name).__name__ == registry.SET_POOLS[name].rpartition(":")[2]
    with pytest.raises(VseError, match="unknown loss 'triplet'"):
        registry.LOSSES.check("triplet")


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_help_reads_no_torch(command):
    code = ("import sys\nfrom cli.main import cli\ntry:\n"
            f"    cli.main([{command!r}, '--help'], standalone_mode=False, prog_name='vse')\n"
            "except SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'pipeline.training.trainer' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    assert "--epochs INTEGER" in result.stdout  # the help was shown ...
    assert result.stdout.split()[-2:] == ["False", "False"], result.stderr  # ... without torch


def test_the_options_table_in_docs_is_the_generated_one():
    assert (ROOT / "docs" / "OPTIONS.md").read_text(encoding="utf-8") == options_markdown(), (
        "docs/OPTIONS.md is stale: python -m cli.train_options > docs/OPTIONS.md")


def test_sweep_takes_the_training_options_as_overrides_of_base(tmp_path, tiny_cache):
    path = tmp_path / "grid.yaml"
    path.write_text(f"runs_dir: {tmp_path / 'runs'}\nbase:\n  features: {tiny_cache}\n  epochs: 3\n"
                    "  loss_options: {warmup_epochs: 1}\ngrid:\n  loss: [sh, mh]\n")
    result = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--epochs", "1",
                                      "--negative-set-size", "4"])
    assert result.exit_code == 0, result.output
    from pipeline.training.sweep import load_sweep

    runs = load_sweep(path, overrides={"epochs": 1, "loss_options": {"negative_set_size": 4}}).runs
    assert [r.config["epochs"] for r in runs] == [1, 1]
    assert runs[1].config["loss_options"] == {"warmup_epochs": 1, "negative_set_size": 4}
    refused = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--loss", "mh"])
    assert refused.exit_code == 1
    assert refused.output == f"error: {path}: loss is a grid axis of this sweep; an override would give " \
                             "every grid point the same value\n"
    bad = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--epochs", "0"])
    assert bad.exit_code == 1 and "epochs must be at least 1, got 0" in bad.output


def test_csv_options_of_train_rc_reach_the_reader_and_stay_out_of_cached_runs(tmp_path, tiny_cache):
    from test_csv_dataset import CAPTIONS, NAMES, link_images, write_csv

    folder = link_images(tmp_path / "data")
    tsv = write_csv(folder / "pairs.tsv", ["picture", "text"],
                    [[f"images/{n}", c] for n in NAMES for c in CAPTIONS[n][:2]], separator="\t")
    run = tmp_path / "run"
    result = CliRunner().invoke(cli, [
        "train", "--rc", "--dataset", "csv", "--root", str(tsv), "--csv-separator", "\\t",
        "--csv-img-key", "picture", "--csv-caption-key", "text", "--backbone", "tiny", "--run-dir", str(run),
        "--epochs", "1", "--batch-size", "4", "--embed-dim", "8", "--word-dim", "4", "--min-word-count", "1",
        "--val-every", "0", "--workers", "0", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    from pipeline.core.checkpoint import load_checkpoint

    saved = load_checkpoint(run / "last.pt")["train_config"]
    layout = (saved["csv_img_key"], saved["csv_caption_key"], saved["csv_separator"])
    assert layout == ("picture", "text", "\\t")
    # without the right column, the run stops in one line before anything is written
    wrong = CliRunner().invoke(cli, ["train", "--rc", "--dataset", "csv", "--root", str(tsv),
                                     "--csv-separator", "\\t", "--backbone", "tiny",
                                     "--run-dir", str(tmp_path / "no")])
    assert wrong.exit_code == 1 and "filepath" in wrong.output and not (tmp_path / "no").exists()
    cached = CliRunner().invoke(cli, ["train", "--features", str(tiny_cache), "--csv-img-key", "picture",
                                      "--run-dir", str(tmp_path / "cached")])
    assert cached.exit_code == 1 and "--csv-img-key describe a --dataset csv file for --rc" in cached.output


def test_the_modules_and_the_cli_take_their_name_lists_from_the_registry():
    """The registry's sentence holds: each list of names is the registry's own object."""
    from cli.main import cli
    from pipeline.core import similarity
    from pipeline.relevance import stage
    from pipeline.search import faiss_index

    assert similarity.SIMILARITIES is registry.SIMILARITIES
    assert stage.METHODS is registry.RELEVANCE_METHODS
    assert faiss_index.KINDS is registry.INDEX_KINDS
    choices = {p.name: tuple(p.type.choices) for p in cli.commands["extract"].params
               if isinstance(p.type, click.Choice)}
    assert choices["kind"] == registry.DATASET_KINDS
    relevance = {p.name: tuple(p.type.choices) for p in cli.commands["relevance"].params
                 if isinstance(p.type, click.Choice)}
    assert relevance["method"] == registry.RELEVANCE_METHODS
