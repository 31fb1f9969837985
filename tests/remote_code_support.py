"""A toy remote-code model (``trust_remote_code``) for the semantic-key tests.

:func:`write_remote_code_model` writes ``configuration_{name}.py``,
``modeling_{name}.py`` (its activation given: ``relu``, ``tanh``...), seeded weights
and a ``config.json`` whose ``auto_map`` names them, so two models that differ only in
their code compute different outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

_CONFIGURATION = """
from transformers import PretrainedConfig


class NameConfig(PretrainedConfig):
    model_type = "name-remote"

    def __init__(self, vocab_size=32, hidden_size=8, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)
"""

_MODELING = """
import torch
from transformers import PreTrainedModel

from .configuration_name import NameConfig


class NameModel(PreTrainedModel):
    config_class = NameConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids):
        return self.proj(torch.ACT(self.embed(input_ids)))
"""


def _named(text: str, name: str) -> str:
    return text.replace("Name", name.capitalize()).replace("name", name)


def write_remote_code_model(
    directory: Path, activation: str, name: str = "toy", code: str = "", auto_model: str = ""
) -> Path:
    """The model in ``directory``; its modeling file in the subfolder ``code`` when given
    (the configuration then in both), and ``auto_map``'s ``AutoModel`` = ``auto_model``
    when given (else ``modeling_{name}.{Name}Model``)."""
    import torch
    from safetensors.torch import save_file

    where = directory / code if code else directory
    where.mkdir(parents=True)
    configuration = _named(_CONFIGURATION, name)
    (directory / f"configuration_{name}.py").write_text(configuration)
    if code:
        (where / f"configuration_{name}.py").write_text(configuration)
    (where / f"modeling_{name}.py").write_text(_named(_MODELING, name).replace("ACT", activation))
    generator = torch.Generator().manual_seed(0)
    state = {
        "embed.weight": torch.randn(32, 8, generator=generator),
        "proj.weight": torch.randn(8, 8, generator=generator),
        "proj.bias": torch.randn(8, generator=generator),
    }
    save_file(state, str(directory / "model.safetensors"), {"format": "pt"})
    title = name.capitalize()
    config = {
        "model_type": f"{name}-remote",
        "architectures": [f"{title}Model"],
        "vocab_size": 32,
        "hidden_size": 8,
        "auto_map": {
            "AutoConfig": f"configuration_{name}.{title}Config",
            "AutoModel": auto_model or f"modeling_{name}.{title}Model",
        },
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory
