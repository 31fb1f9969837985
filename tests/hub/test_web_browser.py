"""The web pages in a real browser: headless Chromium (Debian packages) driven by Selenium.

One browser per module (about 2 s to start); each test starts from a clean
cookie jar. Skipped, with the reason, only where Chromium or its driver is not
installed (``make test`` installs them with apt).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mirror_support import MirrorServer
from web_support import (
    ADMIN_TOKEN,
    DATA,
    EVIL,
    MINILM,
    PRIVATE,
    PRIVATE_TOKEN,
    TINY,
    WebStore,
    chromium,
    chromium_missing,
)

_MISSING = chromium_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"no headless Chromium: {_MISSING}")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chromium(tmp_path_factory.mktemp("chromium-profile"))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture
def page(browser: Any, web_server: MirrorServer) -> Any:
    """The browser on the web server's origin with no cookie left from another test."""
    browser.get(web_server.url + "/-/static/style.css")
    browser.delete_all_cookies()
    return browser


def by_css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def follow(driver: Any, element: Any) -> None:
    """Click ``element``; wait until the browser has left the page and loaded the next one.

    Selenium's ``staleness_of`` only counts ``StaleElementReferenceException``;
    mid-navigation Chromium may instead answer "Node with given id does not
    belong to the document" (a plain ``WebDriverException``), which also means
    the old page is gone.
    """
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    old = by_css(driver, "html")
    element.click()

    def left(_: Any) -> bool:
        try:
            old.is_enabled()
        except WebDriverException:
            return True
        return False

    WebDriverWait(driver, 30).until(left)
    WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def repo_names(driver: Any) -> set[str]:
    return {a.text for a in all_css(driver, "#repos tbody td.name > a:first-child")}


def login(driver: Any, url: str, token: str) -> None:
    driver.get(url + "/-/login")
    by_css(driver, "#token").send_keys(token)
    follow(driver, by_css(driver, "#login"))


def test_browse_repo_then_file_then_stamp_details(
    page: Any, web_server: MirrorServer, web_store: WebStore
) -> None:
    page.get(web_server.url + "/")
    assert repo_names(page) == {MINILM, TINY, EVIL, DATA}
    row = by_css(page, f'tr[data-name="{MINILM.lower()}"]')
    assert "stamped · signed" in row.text
    follow(page, by_css(page, f'#repos a[href="/{MINILM}"]'))
    assert by_css(page, "h1.repo-title").text.startswith(f"model {MINILM}")
    assert "license: apache-2.0" in by_css(page, "#tags").text
    assert by_css(page, "#card h1, #card h2").is_displayed()
    assert f"HF_ENDPOINT={web_server.url}" in by_css(page, "#snippet").text
    assert "bert" in by_css(page, "#fingerprint").text
    follow(page, by_css(page, "a.file[href$='/blob/main/model.safetensors']"))
    assert by_css(page, "#file-name").text == "model.safetensors"
    assert by_css(page, "#signer").text == web_store.key_id
    assert "valid (trusted key)" in by_css(page, "#signature").text
    assert "2 days" not in by_css(page, "#expires").text and "in " in by_css(page, "#expires").text
    assert len(all_css(page, "#tensors tbody tr:not(.layer-head)")) == 104  # one per tensor
    follow(page, by_css(page, "#verify"))
    assert "every tensor matches the manifest" in by_css(page, "#verified").text


def test_login_with_a_token_shows_the_private_repo(page: Any, web_server: MirrorServer) -> None:
    page.get(web_server.url + "/")
    assert PRIVATE not in repo_names(page)
    login(page, web_server.url, PRIVATE_TOKEN)
    assert page.current_url == web_server.url + "/"
    assert PRIVATE in repo_names(page)
    token_cookie = page.get_cookie("cmh_token")
    assert token_cookie["httpOnly"] is True and token_cookie["sameSite"] == "Strict"
    assert page.execute_script("return document.cookie").find("cmh_token") == -1
    follow(page, by_css(page, f'#repos a[href="/{PRIVATE}"]'))
    assert "Only for acme." in by_css(page, "#card").text
    page.get(web_server.url + "/-/operator")
    assert "needs an admin token" in page.page_source  # a repo token is not an admin token
    page.get(web_server.url + "/-/login")
    follow(page, by_css(page, "#logout"))
    assert PRIVATE not in repo_names(page)


def test_wrong_token_is_refused(page: Any, web_server: MirrorServer) -> None:
    login(page, web_server.url, "hf_not_a_token_of_this_mirror")
    assert by_css(page, "#login-error").text == "unknown token"
    assert page.get_cookie("cmh_token") is None


def test_hostile_model_card_runs_nothing(page: Any, web_server: MirrorServer) -> None:
    page.get(web_server.url + f"/{EVIL}")
    card = by_css(page, "#card")
    assert "<script>window.__pwned = 'script'</script>" in card.text  # shown as text
    assert page.execute_script("return typeof window.__pwned") == "undefined"
    assert all_css(page, "#card script, #card img, #card iframe") == []
    hrefs = [a.get_attribute("href") for a in all_css(page, "#card a")]
    assert hrefs == ["https://example.org/docs"]
    links = [a.get_attribute("href") for a in all_css(page, "#tags li a")]
    assert links and all(h.startswith(web_server.url + "/?") for h in links)  # list filters only
    assert "<script>window.__pwned = 'tag'</script>" in by_css(page, "#tags").text
    for link in links:  # each chip's filtered list, its filter echoed on the page
        page.get(link)
        assert page.execute_script("return typeof window.__pwned") == "undefined"
    page.get(web_server.url + f"/{EVIL}")
    scripts = [s.get_attribute("src") for s in all_css(page, "script")]
    assert scripts == [web_server.url + "/-/static/pages.js"]


def test_operator_page_for_an_admin(page: Any, web_server: MirrorServer) -> None:
    login(page, web_server.url, ADMIN_TOKEN)
    follow(page, by_css(page, 'a[href="/-/operator"]'))
    assert by_css(page, "h1").text == "Operator"
    bars = all_css(page, "#size-chart rect")
    assert len(bars) == 5
    assert TINY in by_css(page, "#expired").text
    assert "would free" in by_css(page, "#prune").text


def test_search_works_with_and_without_javascript(
    page: Any, web_server: MirrorServer, tmp_path: Path
) -> None:
    page.get(web_server.url + "/")
    by_css(page, "#q").send_keys("tiny")
    visible = [r for r in all_css(page, "#repos tbody tr") if r.is_displayed()]
    assert [r.get_attribute("data-name") for r in visible] == [TINY]  # filtered as typed
    driver = chromium(tmp_path / "nojs", javascript=False)
    try:
        driver.get(web_server.url + "/")
        assert repo_names(driver) == {MINILM, TINY, EVIL, DATA}
        by_css(driver, "#q").send_keys("tiny")
        follow(driver, by_css(driver, "form.search button"))
        assert repo_names(driver) == {TINY}
        follow(driver, by_css(driver, f'#repos a[href="/{TINY}"]'))
        assert "version 2" in by_css(driver, "#card").text
    finally:
        driver.quit()


# -- layout: 390 px and 1280 px, light and dark ------------------------------------------

#: Pages checked at every width and colour scheme (every kind of page a repo has).
LAYOUT_PAGES = [
    "/",
    f"/{MINILM}",
    f"/{MINILM}/blob/main/config.json",
    f"/{MINILM}/blob/main/README.md",
    f"/{MINILM}/blob/main/model.safetensors",
    f"/{TINY}",
    f"/{TINY}/tree/main/docs",
    f"/{TINY}/commits/main",
    f"/datasets/{DATA}",
]

#: Every cell of the file list and the repo list (and what is in them) that lies, even
#: partly, outside the viewport's width or is not shown at all.
_OUTSIDE = """
const width = document.documentElement.clientWidth;
const out = [];
for (const cell of document.querySelectorAll(
    "#files th, #files td, #files td *, #repos td, #repos td *")) {
  const r = cell.getBoundingClientRect();
  const hidden = r.width === 0 && r.height === 0 && cell.textContent.trim() !== "";
  if (hidden || r.left < -0.5 || r.right > width + 0.5) {
    const text = cell.textContent.trim().slice(0, 40);
    out.push(cell.tagName + " " + text + " " + r.left + ".." + r.right);
  }
}
return out;
"""


def scheme(driver: Any, dark: bool) -> None:
    """What the browser tells pages about the system's colour preference."""
    value = "dark" if dark else "light"
    driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": value}]},
    )


def luminance(css_color: str) -> float:
    """0 (black) to 1 (white) for an ``rgb(...)``/``rgba(...)`` colour."""
    parts = [float(p) for p in css_color[css_color.index("(") + 1 : -1].split(",")[:3]]
    return (0.2126 * parts[0] + 0.7152 * parts[1] + 0.0722 * parts[2]) / 255


@pytest.fixture
def sized(browser: Any, page: Any) -> Iterator[Any]:
    """The browser, put back to 1280 px and light after the test."""
    yield page
    scheme(browser, dark=False)
    browser.set_window_size(1280, 900)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
@pytest.mark.parametrize("width", [360, 390, 1280])
def test_layout_fits_every_width_in_light_and_dark(
    sized: Any, web_server: MirrorServer, width: int, dark: bool
) -> None:
    sized.set_window_size(width, 900)
    scheme(sized, dark)
    for path in LAYOUT_PAGES:
        sized.get(web_server.url + path)
        viewport = sized.execute_script("return document.documentElement.clientWidth")
        assert viewport <= width
        scroll = sized.execute_script("return document.documentElement.scrollWidth")
        assert scroll <= viewport, f"{path} at {width} px: {scroll} px wide"
        assert sized.execute_script(_OUTSIDE) == [], path
        if all_css(sized, "#files"):
            headers = [th.text for th in all_css(sized, "#files th")]
            assert headers[:3] == ["Name", "Size", "State"], path
            assert all(th.is_displayed() for th in all_css(sized, "#files th")), path
        background = sized.execute_script("return getComputedStyle(document.body).backgroundColor")
        text = sized.execute_script("return getComputedStyle(document.body).color")
        if dark:
            assert luminance(background) < 0.15 and luminance(text) > 0.7, path
        else:
            assert luminance(background) > 0.9 and luminance(text) < 0.3, path
        if all_css(sized, "#preview .highlight"):
            code = sized.execute_script(
                "return getComputedStyle(document.querySelector('#preview .highlight'))"
                ".backgroundColor"
            )
            assert (luminance(code) < 0.2) == dark, path


def test_header_chips_do_not_crowd_the_page(page: Any, web_server: MirrorServer) -> None:
    page.get(web_server.url + f"/{MINILM}")
    datasets = by_css(page, "#datasets")
    assert datasets.tag_name == "details" and datasets.get_attribute("open") is None
    assert "and 19 more" in datasets.text
    top = by_css(page, "h1.repo-title").rect["y"]
    tabs = by_css(page, "nav.tabs").rect["y"]
    assert tabs - top < 220  # title, facts, chips and the folded datasets: a few lines
    follow(page, by_css(page, "#tags a[href='/?task=sentence-similarity']"))
    assert repo_names(page) == {MINILM}
    assert "task: sentence-similarity" in by_css(page, "#chosen").text


def test_copy_button_copies_the_snippet(page: Any, web_server: MirrorServer) -> None:
    page.execute_cdp_cmd(
        "Browser.grantPermissions",
        {
            "origin": web_server.url,
            "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"],
        },
    )
    page.get(web_server.url + f"/{TINY}")
    button = by_css(page, "#copy-snippet")
    assert button.is_displayed()
    button.click()
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(page, 10).until(lambda d: button.get_attribute("data-copied") is not None)
    assert button.get_attribute("data-copied") == "yes"
    copied = page.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], e => arguments[0]('error: ' + e))"
    )
    assert copied == by_css(page, "#snippet").get_attribute("textContent")
    assert copied.startswith(f"export HF_ENDPOINT={web_server.url}\n")


def test_foreign_card_image_is_blocked_and_explained(page: Any, web_server: MirrorServer) -> None:
    from web_support import FOREIGN_IMAGE

    page.get(web_server.url + f"/{TINY}")
    image = by_css(page, "#card img")
    assert image.get_attribute("src") == FOREIGN_IMAGE
    assert page.execute_script("return arguments[0].naturalWidth", image) == 0  # not loaded
    note = by_css(page, "#foreign-images")
    assert note.is_displayed() and "Content-Security-Policy" in note.text


def test_download_button_and_preview_in_the_browser(page: Any, web_server: MirrorServer) -> None:
    page.get(web_server.url + f"/{MINILM}")
    follow(page, by_css(page, "a.file[href$='/blob/main/config.json']"))
    assert page.current_url == web_server.url + f"/{MINILM}/blob/main/config.json"
    tokens = all_css(page, "#preview .highlight .nt")
    assert '"model_type"' in [t.text for t in tokens]
    href = by_css(page, "#download").get_attribute("href")
    assert href.endswith("/config.json?download=true")
    follow(page, by_css(page, "#commits-tab"))
    assert "cmh mirror add" in by_css(page, "#history").text


#: Words (runs between spaces, ``/`` and ``-``: the points where a name may wrap) of
#: up to this many characters that the page shows on more than one line; a longer one
#: (a blob's hash) may wrap anywhere.
BROKEN_WORDS = """
const broken = [];
for (const box of document.querySelectorAll(arguments[0])) {
  const walk = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    for (const m of node.data.matchAll(/[^\\s\\/-]+/g)) {
      if (m[0].length < 2 || m[0].length > 24) continue;
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const lines = new Set([...range.getClientRects()].map(r => Math.round(r.bottom)));
      if (lines.size > 1) broken.push(m[0]);
    }
  }
}
return broken;
"""


def test_operator_page_at_390_px_keeps_words_whole_and_its_chart_readable(
    sized: Any, web_server: MirrorServer
) -> None:
    """Was: on a phone the tables broke words anywhere ("Ref|s", "mai|n", "expi|red", a
    commit's hex) and the size chart was an SVG scaled down to 5 px text. Now a table too
    wide for the screen scrolls in its box, names wrap after a ``-`` or ``/``, a command or
    a date at its spaces, and the chart's names and sizes are text at the page's size."""
    sized.set_window_size(390, 900)
    login(sized, web_server.url, ADMIN_TOKEN)
    sized.get(web_server.url + "/-/operator")
    assert sized.execute_script("return document.documentElement.clientWidth") <= 390
    assert sized.execute_script(BROKEN_WORDS, "main table, main p, #size-chart") == []
    labels = all_css(sized, "#size-chart .chart-label")
    assert [label.text for label in labels][:1] == [MINILM]  # the largest, named whole
    for text in labels + all_css(sized, "#size-chart .chart-value"):
        assert text.size["height"] >= 12, (text.text, text.size)
    for table in all_css(sized, "main table"):
        box = sized.execute_script(
            "return arguments[0].parentElement.getBoundingClientRect()", table
        )
        assert box["right"] <= 390, table.get_attribute("id")  # a wide one scrolls inside


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_operator_login_and_error_pages_fit_a_phone(
    sized: Any, web_server: MirrorServer, dark: bool
) -> None:
    sized.set_window_size(390, 900)
    scheme(sized, dark)
    sized.get(web_server.url + "/acme/no-such-model")
    assert "Repository not found" in by_css(sized, ".error").text
    pages = ["/acme/no-such-model", "/-/login"]
    login(sized, web_server.url, ADMIN_TOKEN)
    pages += ["/-/operator", f"/{PRIVATE}"]  # an admin token is not a repo token
    for path in pages:
        sized.get(web_server.url + path)
        viewport = sized.execute_script("return document.documentElement.clientWidth")
        scroll = sized.execute_script("return document.documentElement.scrollWidth")
        assert scroll <= viewport, f"{path}: {scroll} px wide"
