"""Names that say what they do: the options whose old meaning was hidden now say it or refuse
the combinations they ignored; old spellings work for one version, with a note."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import train

from cli.main import cli
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError


def option_help(name: str) -> str:
    command = cli.commands["train"]
    return next(p.help for p in command.params if p.name == name)


def test_rc_help_says_pixels_each_step_and_a_frozen_cnn_unless_finetune():
    text = option_help("rc")
    assert "Read pixels and run the CNN each step" in text and "frozen unless --finetune" in text


def test_the_grid_of_rc_is_explicit():
    with pytest.raises(VseError, match="--grid is for --rc"):
        TrainConfig(features="x.h5", grid=True, image_pool="gpo").check()
    with pytest.raises(VseError, match="pool them with --image-pool"):
        TrainConfig(rc=True, root="data", grid=True).check()
    TrainConfig(rc=True, root="data", grid=True, image_pool="gpo").check()


def test_rc_with_an_image_pool_and_no_grid_is_the_old_spelling_taken_with_a_note():
    config = TrainConfig(rc=True, root="data", image_pool="gpo")
    assert config.old_spellings() == ["--rc with --image-pool now needs --grid (the CNN's map as a set); "
                                      "taken as --grid for this version"]
    assert config.grid is True
    assert TrainConfig(rc=True, root="data", grid=True, image_pool="gpo").old_spellings() == []


def test_projection_refuses_a_combination_where_it_applies_to_neither_side():
    with pytest.raises(VseError, match="--projection mlp applies to a one-vector image and to the GRU"):
        TrainConfig(features="x.h5", image_pool="gpo", text_features="t.h5", projection="mlp").check()
    with pytest.raises(VseError, match="--projection mlp"):
        TrainConfig(features="x.h5", image_pool="gpo", text_pool="gpo", projection="mlp").check()
    TrainConfig(features="x.h5", image_pool="gpo", projection="mlp").check()  # the GRU's head takes it
    TrainConfig(features="x.h5", text_features="t.h5", projection="mlp").check()  # the image head takes it
    assert "Sets use --set-projection" in option_help("projection")


def test_no_img_norm_with_an_order_loss_is_refused_in_one_line(tiny_cache, tmp_path):
    result = train(tiny_cache, tmp_path / "run", "--loss", "order", "--no-img-norm")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == ("error: --no-img-norm: loss 'order' scores by order, which needs normalised "
                         "images; drop --no-img-norm"), result.stderr
    assert not (tmp_path / "run" / "config.json").exists()  # refused before anything was written


def test_the_old_command_name_is_not_listed_but_runs():
    listed = CliRunner().invoke(cli, ["--help"]).output
    assert "check-pool" in listed and "check-head" not in listed


def test_a_plugin_importing_an_old_module_path_still_works_with_a_note():
    """Modules moved into packages by concern; a user's FILE.py that imports the old path gets the
    module it moved to, with a FutureWarning naming the new path."""
    import importlib
    import sys

    import pipeline
    from pipeline.losses.plugins import make_loss

    sys.modules.pop("pipeline.loss_plugins", None)
    with pytest.warns(FutureWarning, match="pipeline.loss_plugins is now pipeline.losses.plugins"):
        old = importlib.import_module("pipeline.loss_plugins")
    assert old.make_loss is make_loss
    assert all(importlib.util.find_spec(f"pipeline.{new}") for new in pipeline.MOVED.values())
    with pytest.raises(ImportError):
        importlib.import_module("pipeline.no_such_module")
