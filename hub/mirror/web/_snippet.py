"""The repo page's copy-paste snippets, one per way in: cmh, the ``hf`` CLI,
transformers, sentence-transformers (as the Hub's "Use this model" offers them).

Ref names, repo ids and the endpoint reach the page from requests (a pull-through
mirror creates a ref with one request), so each is quoted where it lands:
:func:`shlex.quote` for a shell word (plain names stay plain), :func:`repr` for a
Python literal. Python is shown as Python, never as a shell-quoted ``python -c``.
The snippets are then HTML-escaped by the template like any text.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Snippet:
    """One snippet: its element id, its label, its language and its code."""

    id: str
    label: str
    language: str  # "shell" or "python"
    code: str


@dataclass(frozen=True)
class SnippetRepo:
    """What the snippets name: the mirror, the repo, its revision, and what it is."""

    endpoint: str
    repo_type: str
    repo_id: str
    revision: str
    private: bool = False
    sentence_transformers: bool = False  # the repo holds a sentence-transformers model


def use_snippets(repo: SnippetRepo) -> list[Snippet]:
    """The snippets that fetch ``repo`` at its revision from this mirror."""
    q = shlex.quote
    env = [f"export HF_ENDPOINT={q(repo.endpoint)}", "export HF_HUB_DISABLE_XET=1"]
    if repo.private:
        env.append("export HF_TOKEN=  # paste a token that opens this private repo")
    kind = f" --repo-type {q(repo.repo_type)}" if repo.repo_type != "model" else ""
    cmh = [*env, f"cmh pull {q(repo.repo_id)}{kind} --revision {q(repo.revision)}"]
    hf = [*env, f"hf download {q(repo.repo_id)}{kind} --revision {q(repo.revision)}"]
    snippets = [
        Snippet("snippet", "cmh", "shell", "\n".join(cmh)),
        Snippet("snippet-hf", "hf CLI", "shell", "\n".join(hf)),
    ]
    head = ["import os", "", f'os.environ["HF_ENDPOINT"] = {repo.endpoint!r}']
    if repo.private:
        head.append('os.environ["HF_TOKEN"] = ""  # a token that opens this private repo')
    args = f"{repo.repo_id!r}, revision={repo.revision!r}"
    if repo.repo_type != "model":
        code = [*head, "from huggingface_hub import snapshot_download", "",
                f"path = snapshot_download({repo.repo_id!r}, repo_type={repo.repo_type!r}, "
                f"revision={repo.revision!r})"]  # fmt: skip
        snippets.append(Snippet("snippet-python", "huggingface_hub", "python", "\n".join(code)))
        return snippets
    if repo.sentence_transformers:
        code = [*head, "from sentence_transformers import SentenceTransformer", "",
                f"model = SentenceTransformer({args})"]  # fmt: skip
        snippets.append(Snippet("snippet-st", "sentence-transformers", "python", "\n".join(code)))
    code = [*head, "from transformers import AutoModel", "",
            f"model = AutoModel.from_pretrained({args})"]  # fmt: skip
    snippets.append(Snippet("snippet-transformers", "transformers", "python", "\n".join(code)))
    return snippets
