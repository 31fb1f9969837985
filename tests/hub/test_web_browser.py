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
    return {a.text for a in all_css(driver, "#repos tbody td:first-child a")}


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
    follow(page, by_css(page, f'a[href="/-/models/{MINILM}"]'))
    assert by_css(page, "h1.repo-title").text.startswith(f"model {MINILM}")
    assert "license: apache-2.0" in by_css(page, "#tags").text
    assert by_css(page, "#card h1, #card h2").is_displayed()
    assert f"HF_ENDPOINT={web_server.url}" in by_css(page, "#snippet").text
    assert "bert" in by_css(page, "#fingerprint").text
    follow(page, by_css(page, "a.file[href*='path=model.safetensors']"))
    assert by_css(page, "#file-name").text == "model.safetensors"
    assert by_css(page, "#signer").text == web_store.key_id
    assert "valid (trusted key)" in by_css(page, "#signature").text
    assert "2 days" not in by_css(page, "#expires").text and "in " in by_css(page, "#expires").text
    assert len(all_css(page, "#tensors tbody tr")) == 104
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
    follow(page, by_css(page, f'a[href="/-/models/{PRIVATE}"]'))
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
    page.get(web_server.url + f"/-/models/{EVIL}")
    card = by_css(page, "#card")
    assert "<script>window.__pwned = 'script'</script>" in card.text  # shown as text
    assert page.execute_script("return typeof window.__pwned") == "undefined"
    assert all_css(page, "#card script, #card img, #card iframe") == []
    hrefs = [a.get_attribute("href") for a in all_css(page, "#card a")]
    assert hrefs == ["https://example.org/docs"]
    for tag in all_css(page, "#tags li"):
        tag.click()
    page.get(web_server.url + f"/-/models/{EVIL}")
    assert page.execute_script("return typeof window.__pwned") == "undefined"
    scripts = [s.get_attribute("src") for s in all_css(page, "script")]
    assert scripts == [web_server.url + "/-/static/search.js"]


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
        follow(driver, by_css(driver, f'a[href="/-/models/{TINY}"]'))
        assert "version 2" in by_css(driver, "#card").text
    finally:
        driver.quit()
