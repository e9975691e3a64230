"""One way to declare a part's options (issue 41): losses, pools, networks and readers declare them as
a frozen dataclass of ``values.declare`` fields next to their code, and ``values.declared_options``
is the one check of what a user gives them: an unknown name (the message lists the known ones), a
wrong type, a value out of range or choices, each refused in one line naming the part and the
option. Losses compared in float64, 1e-12 relative."""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass

import pytest
import torch

from pipeline.core import registry
from pipeline.core.config import LOSS_FLAGS
from pipeline.core.errors import VseError
from pipeline.core.registry import READERS
from pipeline.core.values import allowed_types, declare, declared_options, option_types, options_of
from pipeline.losses.base import LOSS_NAMES, VseLoss, build_loss
from pipeline.losses.plugins import make_loss, options_class
from pipeline.networks.heads import build_pool
from pipeline.networks.network import network_options
from pipeline.networks.sgraf import SGR

LOSSES = registry.LOSSES.resolved()  # name → class, the built-in losses


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------------- the one check
@dataclass(frozen=True)
class Example:
    tau: float = declare(0.1, "A temperature.", above=0)
    q: float = declare(0.2, "An exponent.", above=0, high=1)
    share: float = declare(0.5, "A share.", low=0, high=1)
    size: int | None = declare(None, "A count.", low=1)
    epochs: int = declare(0, "Epochs.", low=0)
    variant: str = declare("log", "A variant.", choices=("log", "abs"))
    flag: bool = False


@pytest.mark.parametrize("given, message", [
    ({"taus": 1.0}, "part x has no option taus (its options: tau, q, share, size, epochs, variant, flag)"),
    ({"tau": 0}, "part x: tau must be > 0, got 0.0"),
    ({"tau": "0.1"}, "part x: tau must be a number, got '0.1'"),
    ({"tau": float("inf")}, "part x: tau must be a finite number, got inf"),
    ({"q": 0.0}, "part x: q must be > 0, got 0.0"),
    ({"q": 1.5}, "part x: q must be <= 1, got 1.5"),
    ({"share": -0.1}, "part x: share must be in [0, 1], got -0.1"),
    ({"size": 0}, "part x: size must be an integer >= 1 or null, got 0"),
    ({"size": 2.0}, "part x: size must be an integer >= 1 or null, got 2.0"),
    ({"epochs": True}, "part x: epochs must be an integer >= 0, got True"),
    ({"variant": "exp"}, "part x: variant must be one of log, abs, got 'exp'"),
    ({"flag": "false"}, "part x: flag must be true or false, got 'false'"),
])
def test_declared_options_refuse_in_one_line_naming_the_part_and_the_option(given, message):
    with pytest.raises(ValueError) as info:
        declared_options(Example, given, "part x")
    assert one_line(info) == message


def test_declared_options_build_the_dataclass_with_the_values_converted():
    options = declared_options(Example, {"tau": 1, "size": None, "epochs": 3, "share": 1}, "part x")
    assert options == Example(tau=1.0, size=None, epochs=3, share=1.0)
    assert isinstance(options.tau, float) and isinstance(options.share, float)
    assert declared_options(None, {}, "part y") is not None  # a part without options: nothing given, fine
    with pytest.raises(VseError, match="^part y has no options; got a, b$"):
        declared_options(None, {"b": 1, "a": 2}, "part y", error=VseError)


# ---------------------------------------------------------------------------- each kind of part
LOSS_CASES = [({"marg": 0.1}, "loss mh has no option marg (its options: mask_same_image, warmup_epochs, "
                              "margin, negative_set_size)"),
              ({"margin": "0.2"}, "loss mh: margin must be a number, got '0.2'"),
              ({"margin": -0.1}, "loss mh: margin must be >= 0, got -0.1"),
              ({"mask_same_image": "false"}, "loss mh: mask_same_image must be true or false, got 'false'")]
POOL_CASES = [({"dpe": 4}, "pool gpo has no option dpe (its options: d_pe, d_hidden, temperature)"),
              ({"d_hidden": 1.5}, "pool gpo: d_hidden must be an integer >= 1, got 1.5"),
              ({"temperature": 0}, "pool gpo: temperature must be > 0, got 0.0"),
              ({"d_pe": 3}, "pool gpo: d_pe must be even (sin and cos of each frequency), got 3")]
NETWORK_CASES = [({"sim_dims": 8}, "network sgr has no option sim_dims (its options: sim_dim, "),
                 ({"sim_dim": "8"}, "network sgr: sim_dim must be an integer >= 1, got '8'"),
                 ({"sim_dim": 0}, "network sgr: sim_dim must be an integer >= 1, got 0"),
                 ({"dropout": 1.0}, "network sgr: dropout must be < 1, got 1.0"),
                 ({"smooth": float("inf")}, "network sgr: smooth must be a finite number, got inf")]
READER_CASES = [({"csv_img_column": "x"}, "--dataset csv has no option --csv-img-column (its options: "
                                          "--csv-img-key, --csv-caption-key, "),
                ({"split_seed": "1"}, "--dataset csv: --split-seed must be an integer >= 0 or null, got '1'"),
                ({"split_seed": -1}, "--dataset csv: --split-seed must be an integer >= 0 or null, got -1")]


@pytest.mark.parametrize("options, message", LOSS_CASES)
def test_a_loss_refuses_a_bad_option_through_the_shared_check(options, message):
    with pytest.raises(VseError) as info:
        make_loss("mh", options)
    assert one_line(info).startswith(message)


@pytest.mark.parametrize("options, message", POOL_CASES)
def test_a_pool_refuses_a_bad_option_through_the_shared_check(options, message):
    with pytest.raises(VseError) as info:
        build_pool("gpo", 8, options)
    assert one_line(info) == message


@pytest.mark.parametrize("options, message", NETWORK_CASES)
def test_a_network_refuses_a_bad_option_through_the_shared_check(options, message):
    with pytest.raises(VseError) as info:
        network_options(SGR, options, "sgr")
    assert one_line(info).startswith(message)


@pytest.mark.parametrize("options, message", READER_CASES)
def test_a_reader_refuses_a_bad_option_through_the_shared_check(options, message):
    with pytest.raises(VseError) as info:
        READERS.reader_options("csv", **options)
    assert one_line(info).startswith(message)


def test_a_reader_without_options_and_another_layouts_flag_are_refused_in_one_line():
    with pytest.raises(VseError, match="^--dataset flickr8k has no options; got --colour$"):
        READERS.reader_options("flickr8k", colour="red")
    with pytest.raises(VseError, match=r"^--split-seed: only for --dataset csv \(the coco layout"):
        READERS.reader_options("coco", split_seed=1)
    assert READERS.reader_options("csv", split_seed=3, csv_id_key=None)["layout"].split_seed == 3


def test_a_user_network_declares_ranges_the_same_way():
    class Net:
        @dataclass(frozen=True)
        class Options:
            depth: int = declare(2, "Layers.", low=1, high=8)

    assert network_options(Net, {"depth": 8}, "net.py:Net").depth == 8
    with pytest.raises(VseError, match=r"^network net.py:Net: depth must be an integer in \[1, 8\], got 9$"):
        network_options(Net, {"depth": 9}, "net.py:Net")


# ---------------------------------------------------------------------------- losses declare them
def test_every_built_in_network_declares_each_option_with_its_help():
    """The networks' options page (docs/parts-networks.md) is generated from these declarations:
    each option of sgr, saf and vsrn says what it does, and vse++ / vse-infty have none."""
    import dataclasses

    from pipeline.core.values import option_facts

    declared = {}
    for name in registry.NETWORKS.names:
        options = registry.NETWORKS.spec(name).Options
        for field in dataclasses.fields(options) if options is not None else ():
            declared[f"{name}.{field.name}"] = option_facts(field).help
    assert {key.split(".")[0] for key in declared} == {"sgr", "saf", "vsrn"}
    assert [key for key, help_text in declared.items() if len(help_text.split()) < 3] == []


def test_every_built_in_loss_declares_its_options_and_shows_them_as_its_signature():
    """``VseLoss`` builds each loss from its ``Options`` (the defaults live there only), and a loss's
    signature is its options (loss_check reads mask_same_image's default from it)."""
    for name, cls in LOSSES.items():
        assert options_class(name) is cls.Options
        loss = build_loss(name)
        assert loss.options == cls.Options()
        parameters = inspect.signature(cls.__init__).parameters
        for field_name, value in vars(loss.options).items():
            assert getattr(loss, field_name) is value or getattr(loss, field_name) == value
            assert parameters[field_name].default == getattr(cls.Options(), field_name) or field_name in (
                "thetas", "margins", "betas")  # ladder's: None, resolved from levels
    assert {n for n in LOSS_NAMES if not build_loss(n).mask_same_image} == {"rcl", "decl", "ncr", "crcl",
                                                                            "bicro", "poly", "selhn", "pcme",
                                                                            "pcmepp"}
    assert build_loss("ladder", levels=3).thetas == [0.63, 0.56]
    assert build_loss("order", squared=False).similarity == "order-norm"


def test_a_subclass_with_keywords_of_its_own_still_builds():
    """A user's VseLoss subclass written before the declarations (its own keywords, the base given
    mask_same_image by position) is built and checked by its own __init__, as before."""

    class OldStyle(VseLoss):
        def __init__(self, tau: float = 0.1, mask_same_image: bool = True):
            super().__init__(mask_same_image)
            self.tau = tau

        def value(self, batch):
            return batch.scores.sum() * self.tau

    loss = OldStyle(tau=0.5, mask_same_image=False)
    assert (loss.tau, loss.mask_same_image) == (0.5, False)
    assert list(inspect.signature(OldStyle.__init__).parameters) == ["self", "tau", "mask_same_image"]
    assert options_of(OldStyle) is None  # its own keywords: not checked against VseLoss.Options


def test_each_loss_flag_is_an_option_the_losses_declare_with_its_type():
    """LOSS_FLAGS are the older command-line spellings (torch-free, for --help): each names an option
    some built-in loss declares, of the flag's type."""
    for flag, spec in LOSS_FLAGS.items():
        declared = [option_types(cls.Options)[spec.key] for cls in LOSSES.values()
                    if spec.key in option_types(cls.Options)]
        assert declared, flag
        for hint in declared:
            assert set(allowed_types(hint)) - {type(None)} == {spec.type}, flag


USER_LOSS = '''
from dataclasses import dataclass

from torch import nn

from pipeline.core.values import declare
from pipeline.losses.base import VseLoss, build_loss


class ScaledHinge(VseLoss):
    """VSE0's sum of hinges, times ``scale``."""

    @dataclass(frozen=True)
    class Options(VseLoss.Options):
        margin: float = declare(0.2, "The hinge margin.", low=0)
        scale: float = declare(1.0, "Multiplies the loss.", above=0)
        reduction: str = declare("sum", "sum or max.", choices=("sum", "max"))

    def value(self, batch):
        positive = batch.scores.diagonal()
        to_captions = (self.margin + batch.scores - positive[:, None]).clamp(min=0)
        to_images = (self.margin + batch.scores - positive[None, :]).clamp(min=0)
        return self.scale * (to_captions.masked_fill(~batch.negatives, 0).sum()
                             + to_images.masked_fill(~batch.negatives, 0).sum())


class Plain(nn.Module):
    """Not a VseLoss: its options declared the same way, taken as keywords."""

    @dataclass(frozen=True)
    class Options:
        levels: int = declare(2, "Levels.", low=1)

    def __init__(self, **options):
        super().__init__()
        self.options = self.Options(**options)

    def forward(self, img, cap, image_ids=None, relevance=None):
        return (img * cap).sum() * self.options.levels
'''


def test_a_user_loss_declares_its_options_in_its_own_file_and_they_are_checked(tmp_path):
    path = tmp_path / "scaled_hinge.py"
    path.write_text(textwrap.dedent(USER_LOSS))
    spec = f"{path}:ScaledHinge"
    loss = make_loss(spec, {"scale": 2, "margin": 0.3})
    assert (loss.scale, loss.margin, loss.reduction) == (2.0, 0.3, "sum")
    gen = torch.Generator().manual_seed(0)
    img, cap = (torch.nn.functional.normalize(torch.randn(6, 5, generator=gen, dtype=torch.float64), dim=1)
                for _ in range(2))
    ids = torch.tensor([0, 0, 1, 2, 3, 4])
    reference = build_loss("sh", margin=0.3)(img, cap, image_ids=ids)
    assert loss(img, cap, image_ids=ids).item() == pytest.approx(2 * reference.item(), rel=1e-12)
    for options, words in (
            ({"scal": 2}, f"loss {spec} has no option scal (its options: mask_same_image, margin, scale, "
                          "reduction)"),
            ({"scale": 0}, f"loss {spec}: scale must be > 0, got 0.0"),
            ({"scale": "2"}, f"loss {spec}: scale must be a number, got '2'"),
            ({"reduction": "mean"}, f"loss {spec}: reduction must be one of sum, max, got 'mean'")):
        with pytest.raises(VseError) as info:
            make_loss(spec, options)
        assert one_line(info) == f"{path}: {words}"  # names the user's file, then the loss and the option
    plain = f"{path}:Plain"
    assert make_loss(plain, {"levels": 3}).options.levels == 3
    with pytest.raises(VseError) as info:
        make_loss(plain, {"levels": 0})
    assert one_line(info) == f"{path}: loss {plain}: levels must be an integer >= 1, got 0"


def test_a_tune_refuses_a_continuous_range_for_an_integer_option_a_user_loss_declares(tmp_path):
    from pipeline.training.tune import load_tune

    (tmp_path / "plain.py").write_text(textwrap.dedent(USER_LOSS))
    tune = tmp_path / "tune.yaml"
    tune.write_text(f"base: {{features: x.h5, loss: {tmp_path / 'plain.py'}:Plain}}\n"
                    "search: {loss_options.levels: {uniform: [1, 3]}}\n")
    with pytest.raises(VseError, match="search: loss_options.levels: an integer option"):
        load_tune(tune)
