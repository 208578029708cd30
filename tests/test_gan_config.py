"""The GAN models' config schemas: each hole fails at composition naming the key, the network schemas hold exactly
their classes' arguments, the model schemas match their modules, and a fork's own networks compose with the untyped
GAN schema. The general config tests and their helpers are in test_config.py."""

from __future__ import annotations

import pytest

from pixelsmith.config.paths import CONF_DIR
from tests.conftest import compose_config
from tests.test_config import (
    assert_composition_names,
    assert_model_schema_matches_its_module,
    assert_typed_config_matches_its_class,
)

HOLES = [
    (["model.generator.norm=layer"], "model.generator.norm", "batch, instance, none"),
    (["model.generator.w_dim=64"], "model.generator.w_dim", "DCGANGeneratorConfig"),
    (["model.discriminator.ngf=8"], "model.discriminator.ngf", "DCGANDiscriminatorConfig"),
    (["model.generator.z_dim=many"], "model.generator.z_dim", "many"),
    (
        ["model=stylegan2", "model.discriminator.ndf=8"],
        "model.discriminator.ndf",
        "StyleGAN2DiscriminatorConfig",
    ),
    (["model=stylegan2", "model.generator.norm=batch"], "model.generator.norm", "StyleGAN2GeneratorConfig"),
]


@pytest.mark.parametrize(("overrides", "key", "said"), HOLES, ids=[" ".join(h[0]) for h in HOLES])
def test_each_gan_schema_hole_fails_at_composition_naming_the_key(tmp_path, overrides, key, said):
    assert_composition_names(tmp_path, overrides, key, said)


@pytest.mark.parametrize(
    "schema_name",
    [
        "DCGANGeneratorConfig",
        "DCGANDiscriminatorConfig",
        "StyleGAN2GeneratorConfig",
        "StyleGAN2DiscriminatorConfig",
    ],
)
def test_gan_network_configs_match_their_classes_arguments(schema_name):
    """A network config holds exactly its constructor's arguments."""
    assert_typed_config_matches_its_class(schema_name)


@pytest.mark.parametrize(
    ("schema_name", "passed_by_train"),
    [
        ("GANModelConfig", {"core", "augment"}),
        ("GANObjectiveConfig", set()),
    ],
)
def test_model_schemas_and_their_modules_take_the_same_keys(schema_name, passed_by_train):
    """The model schemas and the modules' constructors are kept in step by this test, not by hand: a key added to
    one and not the other fails here instead of composing and then failing (or being ignored) at build time."""
    assert_model_schema_matches_its_module(schema_name, passed_by_train)


def test_a_forks_own_networks_compose_with_the_untyped_gan_schema(tmp_path):
    fork = tmp_path / "conf"
    (fork / "model").mkdir(parents=True)
    dcgan = (CONF_DIR / "model" / "dcgan.yaml").read_text()
    own = dcgan.replace("_dcgan_schema", "_gan_schema").replace(
        "  norm: batch\n", "  norm: batch\n  my_own_width: 3\n", 1
    )
    (fork / "model" / "mygan.yaml").write_text(own.replace("name: dcgan", "name: mygan"))
    cfg = compose_config([f"hydra.searchpath=[file://{fork}]", "model=mygan"], tmp_path)
    assert cfg.model.generator.my_own_width == 3 and cfg.model.name == "mygan"
