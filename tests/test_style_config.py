"""The style part's configs: its schema holes fail at composition naming the key, its choice values stay plain
strings, and its typed schemas match the classes they build (the general rules of tests/test_config.py, applied to
the style models and their content data; kept here so that deleting tests/test_style_*.py removes every style test)."""

from __future__ import annotations

import io

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tests.test_config import (
    assert_composition_names,
    assert_model_schema_matches_its_module,
    assert_typed_config_matches_its_class,
    assert_validation_says,
)

STYLE_HOLES = [
    # (overrides, the key the message must name, what else it must say: the allowed values or the schema)
    (["data=style_content", "data.extensions=[png]"], "data.extensions", "StyleContentDataConfig"),
    (["data=style_content", "data.on_corrupt=ignore"], "data.on_corrupt", "skip, error"),
    (["experiment=style_fast", "model.loss_net.arch=vgg11"], "model.loss_net.arch", "vgg16, vgg19"),
    (
        ["experiment=style_fast", "model.stylizer.output_activation=tanh"],
        "output_activation",
        "sigmoid, none",
    ),
    (["experiment=style_adain", "model.validation.lpips_net=resnet"], "lpips_net", "alex, vgg, squeeze"),
]


@pytest.mark.parametrize(("overrides", "key", "said"), STYLE_HOLES, ids=[" ".join(h[0]) for h in STYLE_HOLES])
def test_each_style_schema_hole_fails_at_composition_naming_the_key(tmp_path, overrides, key, said):
    assert_composition_names(tmp_path, overrides, key, said)


def test_a_key_added_with_plus_to_a_style_node_is_refused_before_the_run(tmp_path):
    assert_validation_says(
        tmp_path,
        ["experiment=style_fast", "+model.loss_net.weights=/x.pth"],
        "did you mean model.loss_net.weights_path?",
    )


def test_style_choice_values_compose_and_stay_plain_strings(tmp_path):
    from pixelsmith.data.config import OnCorrupt

    for member in OnCorrupt:
        cfg = compose_config(["data=style_content", f"data.on_corrupt={member.value}"], tmp_path)
        assert type(cfg.data.on_corrupt) is str
    cfg = compose_config(["experiment=style_fast", "model.stylizer.output_activation=none"], tmp_path)
    buffer = io.BytesIO()
    torch.save(OmegaConf.to_container(cfg, resolve=True), buffer)
    buffer.seek(0)
    stored = torch.load(buffer, weights_only=True)
    assert (
        stored["model"]["stylizer"]["output_activation"] == "none"
        and stored["model"]["loss_net"]["arch"] == "vgg16"
    )


def test_the_style_content_data_config_matches_its_datamodule():
    assert_typed_config_matches_its_class("StyleContentDataConfig")


@pytest.mark.parametrize("schema_name", ["FastStyleModelConfig", "AdaINModelConfig"])
def test_style_model_schemas_and_their_modules_take_the_same_keys(schema_name):
    assert_model_schema_matches_its_module(schema_name, {"core"})


def test_style_keys_are_range_checked_too(make_cfg):
    from pixelsmith.config.validate import ConfigValueError, validate_config

    style = make_cfg("experiment=style_fast", "model.optimizer.lr=0", fast=False)
    with pytest.raises(ConfigValueError, match="model.optimizer.lr=0"):
        validate_config(style)
