"""A store for the web-page tests and screenshots, and a headless Chromium to look at it.

``build_web_store(base, minilm_dir)`` imports, with ``cmh.hub.mirror.add_folder``:

- the real MiniLM model, stamped (30 days) and signed, with its model card (whose
  front matter names 21 datasets);
- ``cmh-test/tiny``: a small stamped model whose stamp expired (``main``, its card
  shows an image from another site) and an older revision (``first``) that the
  next import left without a ref;
- ``acme/private-model``: private (opened by :data:`PRIVATE_TOKEN`), its card with
  a license and task no other repo has;
- ``evil/card``: a model card carrying ``<script>``, ``javascript:`` links and
  event-handler attributes, every one of which would set ``window.__pwned``;
- the dataset ``cmh-test/data``.

``chromium(tmp)`` starts Selenium's Chrome driver on the Debian ``chromium`` and
``chromium-driver`` packages (never a downloaded browser) or skips the test
with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cmh.hub.mirror.stores.local._folder import add_folder
from cmh.hub.mirror.web._cards import Rendered, render_card_body
from safetensors.numpy import save_file

import cmh
from cmh import generate_keypair, load_private_key

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TINY = "cmh-test/tiny"
PRIVATE = "acme/private-model"
EVIL = "evil/card"
DATA = "cmh-test/data"
PRIVATE_TOKEN = "hf_web_private_token_0001"
ADMIN_TOKEN = "hf_web_admin_token_00001"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

EVIL_CARD = """---
license: mit
tags:
- "<script>window.__pwned = 'tag'</script>"
- safe-tag
---
# A card that tries everything

<script>window.__pwned = 'script'</script>

<img src="x" onerror="window.__pwned = 'onerror'">

[click me](javascript:window.__pwned='link') and [also](JAVASCRIPT:window.__pwned='upper')
and <javascript:window.__pwned='autolink'>
and [data](data:text/html,<script>parent.__pwned=1</script>)

<a href="javascript:window.__pwned='raw'">raw anchor</a>

[a fine link](https://example.org/docs)
"""

#: An image of a card served by another site (the pages' CSP keeps it from loading).
FOREIGN_IMAGE = "https://images.example.org/logo.png"
#: The private repo's card: its facet values must never show to a viewer it is closed to.
PRIVATE_CARD = """---
license: acme-secret-license
pipeline_tag: acme-secret-task
---
# private model

Only for acme.
"""

MINILM_CARD_FRONT = """---
license: apache-2.0
library_name: sentence-transformers
pipeline_tag: sentence-similarity
tags:
- feature-extraction
- cmh-stamped
---
"""


def held_render(body: str) -> Rendered:
    """A card renderer's target (run in its child process) whose renders a test holds: a
    body whose first line is ``HOLD FOLDER`` touches ``FOLDER/started``, then renders
    once ``FOLDER/release`` exists; any other body renders at once."""
    first = body.split("\n", 1)[0]
    if first.startswith("HOLD "):
        folder = Path(first[5:])
        (folder / "started").touch()
        while not (folder / "release").exists():
            time.sleep(0.01)
    return render_card_body(body)


@dataclass(frozen=True)
class WebStore:
    path: Path
    tokens: Path
    admin_tokens: Path
    public_key: Path
    key_id: str
    commits: dict[str, str]  # "repo@revision" -> commit


def _tiny_weights(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    path = folder / "model.safetensors"
    save_file(
        {"embed.weight": rng.standard_normal((16, 8)).astype(np.float32),
         "head.bias": rng.standard_normal((8,)).astype(np.float32)},
        str(path),
    )  # fmt: skip
    (folder / "config.json").write_text(json.dumps({"model_type": "tiny", "seed": seed}))
    return path


def build_web_store(base: Path, minilm_dir: Path) -> WebStore:
    """The store described in the module docstring."""
    store = base / "store"
    commits: dict[str, str] = {}
    private_pem, public_pem, key_id = generate_keypair()
    (base / "signer.pub").write_bytes(public_pem)
    (base / "signer.pem").write_bytes(private_pem)
    key = load_private_key(base / "signer.pem")

    def add(src: Path, repo: str, revision: str = "main", repo_type: str = "model") -> None:
        result = add_folder(store, src, repo, revision=revision, repo_type=repo_type)
        commits[f"{repo}@{revision}"] = result.commit

    minilm = base / "minilm"
    shutil.copytree(minilm_dir, minilm)
    readme = minilm / "README.md"
    text = readme.read_text() if readme.exists() else "# all-MiniLM-L6-v2\n"
    if text.startswith("---") and "\ntags:\n" in text:  # the real card: 21 datasets and all
        readme.write_text(text.replace("\ntags:\n", "\ntags:\n- cmh-stamped\n", 1))
    else:
        readme.write_text(MINILM_CARD_FRONT + text.split("---", 2)[-1])
    cmh.stamp(minilm / "model.safetensors", ttl="30d", sign_key=key)
    add(minilm, MINILM)

    tiny1 = base / "tiny1"
    cmh.stamp(_tiny_weights(tiny1, 1), ttl="30d")
    (tiny1 / "README.md").write_text("# tiny\n\nversion 1\n")
    add(tiny1, TINY)
    first = commits[f"{TINY}@main"]
    tiny2 = base / "tiny2"
    cmh.stamp(_tiny_weights(tiny2, 2), ttl="1d", now=time.time() - 3 * 86400)
    (tiny2 / "README.md").write_text(
        "# tiny\n\nversion 2 (its stamp has expired)\n\n"
        f"![a logo from elsewhere]({FOREIGN_IMAGE})\n"
    )
    (tiny2 / "docs").mkdir()
    (tiny2 / "docs" / "notes.md").write_text("notes\n")
    add(tiny2, TINY)  # main moves on: the first commit keeps no ref
    commits[f"{TINY}@first"] = first

    private = base / "private"
    _tiny_weights(private, 3)
    (private / "README.md").write_text(PRIVATE_CARD)
    add(private, PRIVATE)

    evil = base / "evil"
    _tiny_weights(evil, 4)
    (evil / "README.md").write_text(EVIL_CARD)
    add(evil, EVIL)

    data = base / "data"
    data.mkdir()
    (data / "train.csv").write_text("text,label\nhello,1\n")
    (data / "README.md").write_text("# a dataset\n")
    add(data, DATA, repo_type="dataset")

    tokens = base / "tokens.txt"
    tokens.write_text(f"{PRIVATE_TOKEN} {PRIVATE}\n")
    admin = base / "admin-tokens.txt"
    admin.write_text(f"# operators\n{ADMIN_TOKEN}\n")
    return WebStore(store, tokens, admin, base / "signer.pub", key_id, commits)


def chromium_missing() -> str | None:
    """Why Chromium cannot run here, or ``None``."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not installed (make test installs the Debian packages chromium and chromium-driver)"  # noqa: E501
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


def chromium(
    profile: Path, width: int = 1280, height: int = 900, *, javascript: bool = True
) -> Any:
    """A headless Chromium driven by Selenium, on the Debian binaries, with an empty profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--window-size={width},{height}",
    ):  # fmt: skip
        options.add_argument(flag)
    if not javascript:
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2}
        )
    profile.mkdir(parents=True, exist_ok=True)
    # An explicit driver path: Selenium Manager (which would download a browser) never runs.
    service = Service(executable_path=str(CHROMEDRIVER))
    return webdriver.Chrome(service=service, options=options)
