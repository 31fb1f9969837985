"""The page snippet quotes every value (issue 23: shell injection through a ref name).

Each hostile value goes through a real ``bash`` (``-n``, then run with ``cmh`` and
``python`` replaced by functions that record their arguments) and a real Python
parse of the ``-c`` program: the words and literals must come back unchanged.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from cmh.hub.mirror.web._snippet import SnippetRepo, use_snippets

HOSTILE = [
    "main",
    "x';touch /tmp/pwned;'",
    'x";touch /tmp/pwned;"',
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "a b\tc",
    "line\nbreak",
    "back\\slash",
    "!bang #hash *glob ?q [set] {brace} ~tilde &amp |pipe <lt >gt",
    "'''\"\"\"",
    "é ünïcødé 中文 \u202e",
    "-rf",
    "",
]

RECORD = r"""
cmh() { printf '%s\0' "$@" > "$OUT/cmh"; }
hf() { printf '%s\0' "$@" > "$OUT/hf"; }
"""


def _python_calls(code: str) -> dict[str, tuple[list[object], dict[str, object]]]:
    """Each call of the snippet's last statements: its literal arguments, as parsed."""
    tree = ast.parse(code)
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            calls[name] = (
                [ast.literal_eval(a) for a in node.args],
                {k.arg or "": ast.literal_eval(k.value) for k in node.keywords},
            )
    return calls


@pytest.mark.parametrize("repo_type", ["dataset", "model"])
@pytest.mark.parametrize("value", HOSTILE)
def test_every_value_survives_bash_and_python_unchanged(
    value: str, repo_type: str, tmp_path: Path
) -> None:
    endpoint = f"http://127.0.0.1:1/{value}"
    repo = SnippetRepo(endpoint, repo_type, "org/name", value, sentence_transformers=True)
    snippets = use_snippets(repo)
    kind = ["--repo-type", "dataset"] if repo_type == "dataset" else []
    for snippet in snippets:
        if snippet.language == "shell":
            assert subprocess.run(["bash", "-n", "-c", snippet.code]).returncode == 0
            env = {"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}
            ran = subprocess.run(
                ["bash", "-c", RECORD + snippet.code + '\nprintf %s "$HF_ENDPOINT" > "$OUT/e"'],
                env=env,
                capture_output=True,
                text=True,
            )
            assert ran.returncode == 0, ran.stderr
            assert not Path("/tmp/pwned").exists()
            assert (tmp_path / "e").read_text() == endpoint
            tool = "cmh" if "cmh pull" in snippet.code else "hf"
            argv = [a.decode() for a in (tmp_path / tool).read_bytes().split(b"\0")[:-1]]
            verb = "pull" if tool == "cmh" else "download"
            assert argv == [verb, "org/name", *kind, "--revision", value]
        else:
            assert snippet.language == "python"
            calls = _python_calls(snippet.code)
            env_set = [
                n for n in ast.walk(ast.parse(snippet.code))
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            ]  # fmt: skip
            assert next(ast.literal_eval(n.value) for n in env_set) == endpoint
            (args, keywords) = next(
                calls[name]
                for name in ("snapshot_download", "SentenceTransformer", "from_pretrained")
                if name in calls
            )
            assert args == ["org/name"] and keywords["revision"] == value
            if repo_type == "dataset":
                assert keywords["repo_type"] == "dataset"
    languages = {s.language for s in snippets}
    assert languages == {"shell", "python"}
