"""README.md's ten-minute tour, command for command, on the bundled data: the commands between
``<!-- tour -->`` and ``<!-- /tour -->`` run in a fresh folder whose ``data`` is the repository's
data/ (each as `vse ARGS` in this process; the real EfficientNet-Lite0, GloVe and data/)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]


def tour_commands(readme: Path = ROOT / "README.md") -> list[list[str]]:
    """The tour's commands, each as the arguments after `vse`."""
    text = readme.read_text(encoding="utf-8")
    match = re.search(r"<!-- tour -->\n```bash\n(.*?)```\n<!-- /tour -->", text, re.S)
    assert match, "README.md has no tour (<!-- tour --> ```bash ... ``` <!-- /tour -->)"
    commands = []
    for line in match.group(1).replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "vse" and not set("|&;>") & set(line.split("#")[0]), (
                f"a tour command is one plain `vse` command (the test runs it as such): {line}")
            commands.append(words[1:])
    return commands


def test_the_tour_is_short():
    commands = tour_commands()
    assert 5 <= len(commands) <= 12 and {"extract", "train", "evaluate"} <= {c[0] for c in commands}


@pytest.mark.slow
def test_the_readme_tour_runs_on_the_bundled_data(tmp_path, monkeypatch):
    from cli.main import cli

    (tmp_path / "data").symlink_to(ROOT / "data", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    outputs = {}
    for args in tour_commands():
        result = CliRunner().invoke(cli, args, prog_name="vse")
        assert result.exit_code == 0, f"vse {shlex.join(args)}\n{result.output}\n{result.exception!r}"
        outputs[args[0]] = result.output
    assert "1000 images" in outputs["extract"]
    assert re.search(r"^\| sh \| [0-9.]+ \|", outputs["report"], re.M), outputs["report"]
    assert "rsum" in outputs["compare"] and "p" in outputs["compare"]
    gallery = tmp_path / "runs" / "tour" / "gallery.html"
    assert gallery.is_file() and gallery.stat().st_size > 10_000
