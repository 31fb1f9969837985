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
from cmh.hub.mirror.web._snippet import use_snippet

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
python() { printf '%s\0' "$@" > "$OUT/python"; }
"""


@pytest.mark.parametrize("value", HOSTILE)
def test_every_value_survives_bash_and_python_unchanged(value: str, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:1/{value}"
    text = use_snippet(endpoint, "dataset", "org/name", value, f"datasets/org/{value}")
    assert subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0
    env = {"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"}
    ran = subprocess.run(
        ["bash", "-c", RECORD + text + '\nprintf %s "$HF_ENDPOINT" > "$OUT/endpoint"'],
        env=env,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    assert not Path("/tmp/pwned").exists()
    assert (tmp_path / "endpoint").read_text() == endpoint
    cmh = (tmp_path / "cmh").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in cmh] == [
        "pull", "org/name", "--repo-type", "dataset", "--revision", value,
    ]  # fmt: skip
    flag, program = (a.decode() for a in (tmp_path / "python").read_bytes().split(b"\0")[:-1])
    assert flag == "-c"
    check = subprocess.run(["python3", "-c", f"import ast; ast.parse({program!r})"])
    assert check.returncode == 0
    call = ast.parse(program).body[-1].value.args[0]  # print(snapshot_download(...))
    assert isinstance(call, ast.Call)
    assert [ast.literal_eval(a) for a in call.args] == ["org/name"]
    assert {k.arg: ast.literal_eval(k.value) for k in call.keywords} == {
        "repo_type": "dataset",
        "revision": value,
    }
