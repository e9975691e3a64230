"""The set-pool contract (`vse check-pool`): built-in pools and the example plug-in keep it;
hand-made broken pools fail the check that names their fault."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from pipeline.core.errors import VseError
from pipeline.core.registry import IMAGE_POOLS
from pipeline.networks.pool_check import run_pool_contract

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/attention_pool.py:AttentionPool"
CHECKS = ["output (B, E), finite, K × E = 1×3, 5×8, 36×16", "padding ignored", "a set alone = in the batch",
          "invariant to permuting the members", "gradient reaches every member, no padding",
          "lengths 1 and K", "finite for large inputs (~10000)"]
HEADER = ("import math\nimport torch\nfrom torch import nn\n\n"
          "class Pool(nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n")
MASK = "        pad = torch.arange(x.shape[1]) >= lengths[:, None]\n"
BROKEN = {
    # the mean of all K rows, padding included
    "reads padding": HEADER + "    def forward(self, x, lengths):\n        return x.mean(1)\n",
    # fixed weights by position: a sequence pool, not a set pool
    "order matters": HEADER + "    def forward(self, x, lengths):\n" + MASK +
                              "        w = (-torch.arange(x.shape[1], dtype=x.dtype)).expand(len(x), -1)\n"
                              "        w = w.masked_fill(pad, -math.inf).softmax(1)\n"
                              "        return (w[..., None] * x.masked_fill(pad[..., None], 0)).sum(1)\n",
    # the masked mean of detached members: nothing reaches the features
    "no gradient": HEADER + "        self.bias = nn.Parameter(torch.zeros(dim))\n"
                            "    def forward(self, x, lengths):\n" + MASK +
                            "        x = x.detach().masked_fill(pad[..., None], 0)\n"
                            "        return x.sum(1) / lengths[:, None] + self.bias\n",
}


@pytest.fixture(autouse=True)
def _at_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's import path is relative to the repository


@pytest.mark.parametrize("name", IMAGE_POOLS)
def test_every_built_in_pool_keeps_the_contract(name):
    """VSRN's GRU reads the members in order (a sequence), and its normalisation over the members
    axis gives a set of one member no gradient (x / |x| per dimension): checked without it here,
    and that property of the authors' form below."""
    vsrn = name == "vsrn"
    results = run_pool_contract(name, {"region_norm": False} if vsrn else None, sequence=vsrn, timing=False)
    assert [r.check.split(" (a sequence")[0] for r in results] == CHECKS
    assert all(r.ok is not False for r in results) and sum(r.ok is None for r in results) == vsrn, results


def test_vsrns_member_axis_norm_gives_a_lone_member_no_gradient():
    results = {r.check: r for r in run_pool_contract("vsrn", sequence=True, timing=False)}
    gradient = results["gradient reaches every member, no padding"]
    assert gradient.ok is False and "(length 1) gets no gradient" in gradient.detail


def test_the_example_plug_in_keeps_the_contract_and_is_timed():
    results = run_pool_contract(EXAMPLE, {"hidden": 16})
    assert all(r.ok for r in results[:-1]), results
    assert results[-1].ok is None and results[-1].detail.endswith("ms (median of 10)")


@pytest.mark.parametrize("fault, failing", [
    ("reads padding", {"padding ignored", "a set alone = in the batch",
                       "gradient reaches every member, no padding"}),
    ("order matters", {"invariant to permuting the members"}),
    ("no gradient", {"gradient reaches every member, no padding"}),
])
def test_broken_pools_fail_the_check_of_their_fault(tmp_path, fault, failing):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN[fault])
    results = {r.check: r for r in run_pool_contract(f"{path}:Pool", timing=False)}
    assert {name for name, r in results.items() if not r.ok} == failing, results


def test_a_sequence_pool_reports_its_order_without_failing(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN["order matters"])
    results = run_pool_contract(f"{path}:Pool", sequence=True, timing=False)
    assert results[3].check == "invariant to permuting the members (a sequence: reported)"
    assert results[3].ok is None and float(results[3].detail.split()[-1]) > 1e-3
    assert all(r.ok for i, r in enumerate(results) if i != 3)


def test_check_pool_command(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["check-pool", EXAMPLE, "--pool-option", "hidden=16"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"check-pool {EXAMPLE}\n")
    assert re.search(r"padding ignored +ok", result.output)
    path = tmp_path / "broken.py"
    path.write_text(BROKEN["no gradient"])
    result = runner.invoke(cli, ["check-pool", f"{path}:Pool"])
    assert result.exit_code == 1
    assert re.search(r"gradient reaches every member, no padding +FAIL +no gradient reaches the members",
                     result.output)
    result = runner.invoke(cli, ["check-pool", "last"])
    assert result.exit_code == 1 and result.output.startswith("error: unknown pool 'last'")
    result = runner.invoke(cli, ["check-pool", str(tmp_path / "nope.py") + ":Pool"])
    assert result.output.strip().splitlines() == [f"error: {tmp_path / 'nope.py'}: no such pool file"]


def test_the_old_name_check_head_still_runs_with_a_note():
    result = CliRunner().invoke(cli, ["check-head", EXAMPLE, "--pool-option", "hidden=16"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("note: `vse check-head` is now `vse check-pool`")
    assert result.stdout.startswith(f"check-pool {EXAMPLE}\n")


def test_a_pool_that_cannot_be_built_is_one_line(tmp_path):
    path = tmp_path / "needs_more.py"
    path.write_text(HEADER.replace("(self, dim)", "(self, dim, heads)"))
    with pytest.raises(VseError, match=r"cannot build the pool .*needs_more.py:Pool with options {}") as info:
        run_pool_contract(f"{path}:Pool")
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)
