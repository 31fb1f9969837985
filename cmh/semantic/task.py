"""The ``task`` of a model: ``problem_type``, else inferred from its class name."""

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


def task_from_class(family: str | None) -> str | None:
    """Infer a task from an architecture class name.

    ``...For<Head>`` gives the head in kebab case (``BertForMaskedLM`` ->
    ``masked-lm``); ``...LMHeadModel`` gives ``causal-lm``; a bare ``...Model``
    gives ``feature-extraction``; anything else ``None``.
    """
    if not family:
        return None
    heads = list(_HEAD.finditer(family))
    if heads:
        return kebab(family[heads[-1].end() :])
    if family.endswith("LMHeadModel"):
        return "causal-lm"
    if family.endswith("Model"):
        return "feature-extraction"
    return None


def model_task(config: Mapping[str, Any], family: str | None) -> str | None:
    """``problem_type`` when the config sets one, else :func:`task_from_class`."""
    problem = config.get("problem_type")
    if isinstance(problem, str) and problem:
        return problem
    return task_from_class(family)


def adapter_task(adapter_config: Mapping[str, Any]) -> str | None:
    """The task of a PEFT adapter from its ``task_type``."""
    task_type = adapter_config.get("task_type")
    if not isinstance(task_type, str) or not task_type:
        return None
    return PEFT_TASKS.get(task_type, task_type.lower().replace("_", "-"))
