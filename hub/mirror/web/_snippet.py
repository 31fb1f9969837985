"""The repo page's copy-paste snippet: every value quoted for the shell and for Python.

Ref names, repo ids and the endpoint reach the page from requests (a pull-through
mirror creates a ref with one request), so each is quoted where it lands:
:func:`shlex.quote` for a shell word, :func:`repr` for a Python literal, and
the whole ``python -c`` program quoted once more as one shell word. The
snippet is then HTML-escaped by the template like any text.
"""

from __future__ import annotations

import shlex


def use_snippet(
    endpoint: str, repo_type: str, repo_id: str, revision: str, private_key: str | None
) -> str:
    """The shell lines that fetch ``repo_id`` at ``revision`` from this mirror.

    ``private_key``: the repo's key when it is private (a line asks for a token; the key
    itself is shown by the page, not in the snippet).
    """
    q = shlex.quote
    lines = [f"export HF_ENDPOINT={q(endpoint)}", "export HF_HUB_DISABLE_XET=1"]
    if private_key is not None:
        # No value in a comment: a quoted newline would end it.
        lines.append("export HF_TOKEN=  # paste a token that opens this private repo")
    pull = f"cmh pull {q(repo_id)}"
    if repo_type != "model":
        pull += f" --repo-type {q(repo_type)}"
    lines += [f"{pull} --revision {q(revision)}", ""]
    program = (
        "from huggingface_hub import snapshot_download\n"
        f"print(snapshot_download({repo_id!r}, repo_type={repo_type!r}, revision={revision!r}))"
    )
    lines.append(f"python -c {q(program)}")
    return "\n".join(lines)
