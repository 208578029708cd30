"""What the style-transfer part contributes to general code, read by `pixelsmith.parts` (nothing general imports this
package by name, so a GAN-only fork deletes it with no other edit: README "Removing a part")."""

from pixelsmith.config.rules import optimizer_rules
from pixelsmith.style.config import AdaINModelConfig, FastStyleModelConfig, StyleContentDataConfig

SCHEMAS = [
    ("data", "_style_content_schema", StyleContentDataConfig),
    ("model", "_style_fast_schema", FastStyleModelConfig),
    ("model", "_style_adain_schema", AdaINModelConfig),
]
SHAPING_CONFIG_PREFIXES = ("model.stylizer.", "model.decoder.", "model.loss_net.arch")
# Range rules of the part's own keys, checked at start-up with the general ones.
CONFIG_RULES = optimizer_rules("model.optimizer")
