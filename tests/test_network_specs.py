"""Each network's declaration (registry.NetworkSpec) beside its code: TrainConfig reads kind, defaults
and rules from it without torch, and the lists it replaced are derived from it unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.core.registry import NETWORKS

ROOT = Path(__file__).resolve().parents[1]


def test_configs_of_every_built_in_network_are_made_and_checked_without_torch():
    code = ("import sys\nfrom pipeline.core.config import TrainConfig\n"
            "from pipeline.core.registry import NETWORKS\n"
            "for name in NETWORKS.names:\n"
            "    config = TrainConfig(features='f.h5', network=name)\n"
            "    config.check()\n    config.pairwise\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["False"], result.stderr


def test_the_lists_are_derived_from_the_declarations():
    from pipeline.core.registry import NETWORKS

    assert NETWORKS.dual_names == ("vse++", "vse-infty", "vsrn")
    defaults = {network: found for network in NETWORKS.names if (found := NETWORKS.defaults(network))}
    assert defaults == {"vse-infty": {"image_pool": "gpo", "text_pool": "gpo"},
                        "vsrn": {"image_pool": "vsrn", "size_augment": "none",
                                 "caption_loss_weight": 1.0, "embed_dim": 2048}}


@pytest.mark.parametrize(("network", "options", "message"), [
    ("vsrn", {"image_pool": "gpo"}, "--network vsrn reasons over the members with its own pool"),
    ("vse-infty", {"network_options": {"x": 1}}, "--network vse-infty has no network options"),
    ("sgr", {"text_pool": "gpo", "rc": True, "root": "r"},
     "--text-pool, --rc: not for --network sgr, which scores"),
    ("vse++", {"caption_loss_weight": 1.0}, "VSRN's caption branch"),
])
def test_each_rule_comes_from_the_declaration(network, options, message):
    with pytest.raises(VseError, match=message.replace("+", r"\+")):
        TrainConfig(features="" if options.get("rc") else "f.h5", network=network, **options).check()


def test_a_user_network_declares_its_kind_defaults_and_rules(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from pipeline.core.errors import VseError\n"
                    "from pipeline.networks.network import DualNetwork\n\n"
                    "class Mine(DualNetwork):\n"
                    "    defaults = {'embed_dim': 64}\n\n"
                    "    @staticmethod\n"
                    "    def check(config):\n"
                    "        if config.batch_size < 4:\n"
                    "            raise VseError('mine needs batches of 4')\n")
    config = TrainConfig(features="f.h5", network=f"{path}:Mine")
    assert not config.pairwise and config.embed_dim == 64
    assert TrainConfig(features="f.h5", network=f"{path}:Mine", embed_dim=32).embed_dim == 32
    with pytest.raises(VseError, match="mine needs batches of 4"):
        TrainConfig(features="f.h5", network=f"{path}:Mine", batch_size=2).check()
    assert NETWORKS.spec("examples/scan_network.py:SCANt2i").kind == "pairwise"
