"""The ``task`` of a model, inferred from its class name (``architectures[0]``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z][a-z0-9]*|[a-z0-9]+")
_HEAD = re.compile(r"For(?=[A-Z])")

#: PEFT ``task_type`` values and the task names used for full models.
PEFT_TASKS: dict[str, str] = {
    "CAUSAL_LM": "causal-lm",
    "SEQ_CLS": "sequence-classification",
    "SEQ_2_SEQ_LM": "conditional-generation",
    "TOKEN_CLS": "token-classification",
    "QUESTION_ANS": "question-answering",
    "FEATURE_EXTRACTION": "feature-extraction",
}


def kebab(name: str) -> str:
    """``"CausalLM"`` -> ``"causal-lm"``: CamelCase words (acronyms kept whole), lowercased."""
    return "-".join(word.lower() for word in _WORD.findall(name))


#: Class-name endings whose task the ``For<Head>`` rule cannot read, first match wins.
#: Checked against transformers' auto-model tables by the tests.
SUFFIX_TASKS: tuple[tuple[str, str], ...] = (
    ("EncoderDecoderModel", "conditional-generation"),  # (Vision|Speech)EncoderDecoderModel
    ("MTModel", "conditional-generation"),  # MarianMTModel: translation
    ("DoubleHeadsModel", "causal-lm"),  # GPT2DoubleHeadsModel: LM head + choice head
    ("LMHeadModel", "causal-lm"),  # GPT2LMHeadModel
    ("ModelWithLMHead", "causal-lm"),  # ReformerModelWithLMHead
    ("WithProjection", "feature-extraction"),  # CLIPTextModelWithProjection
    ("Reader", "question-answering"),  # DPRReader
    ("Encoder", "feature-extraction"),  # DPRQuestionEncoder, T5EncoderModel's kin
    ("Model", "feature-extraction"),  # BertModel
)


def task_from_class(family: str | None) -> str | None:
    """Infer a task from an architecture class name.

    ``...For<Head>`` gives the head in kebab case (``BertForMaskedLM`` ->
    ``masked-lm``); otherwise the first ending of :data:`SUFFIX_TASKS` that
    the name has (``MarianMTModel`` -> ``conditional-generation``,
    ``GPT2LMHeadModel`` -> ``causal-lm``, ``BertModel`` ->
    ``feature-extraction``); anything else ``None``.
    """
    if not family:
        return None
    heads = list(_HEAD.finditer(family))
    if heads:
        return kebab(family[heads[-1].end() :])
    for suffix, task in SUFFIX_TASKS:
        if family.endswith(suffix):
            return task
    return None


def model_task(config: Mapping[str, Any], family: str | None) -> str | None:
    """The task of a model: :func:`task_from_class` of its family.

    ``problem_type`` is not a task: it names the training loss of a
    classification head (``single_label_classification``).
    """
    del config  # the task is read from the class name only
    return task_from_class(family)


def adapter_task(adapter_config: Mapping[str, Any]) -> str | None:
    """The task of a PEFT adapter from its ``task_type``."""
    task_type = adapter_config.get("task_type")
    if not isinstance(task_type, str) or not task_type:
        return None
    return PEFT_TASKS.get(task_type, task_type.lower().replace("_", "-"))
