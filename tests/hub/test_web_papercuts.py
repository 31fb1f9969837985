"""The mirror's pages count as the CLI and huggingface.co do: decimal sizes, counts in
English (issue 40). A real ``cmh serve`` over the pages' store (``web_server``)."""

from __future__ import annotations

import re

from mirror_support import MirrorServer
from test_web_pages import fetch
from web_support import ADMIN_TOKEN, MINILM, TINY, WebStore

BINARY = re.compile(r"\d (KiB|MiB|GiB|Bytes)\b")


def test_sizes_are_decimal_on_every_page(web_server: MirrorServer) -> None:
    admin = f"cmh_token={ADMIN_TOKEN}"
    pages = {
        "list": fetch(web_server, "/")[2],
        "repo": fetch(web_server, f"/{MINILM}")[2],
        "file": fetch(web_server, f"/{MINILM}/blob/main/model.safetensors")[2],
        "small file": fetch(web_server, f"/{MINILM}/blob/main/config.json")[2],
        "operator": fetch(web_server, "/-/operator", cookie=admin)[2],
    }
    for name, body in pages.items():
        assert not BINARY.search(body), (name, BINARY.findall(body))
    assert "91.6 MB" in pages["repo"] and "90.9 MB" in pages["file"], pages["file"][:3000]
    assert re.search(r"Download \(\d+ B\)", pages["small file"])
    assert " revision(s)" not in pages["operator"] and " item(s)" not in pages["operator"]


def test_raw_serves_the_file_and_download_saves_it(web_server: MirrorServer) -> None:
    status, headers, body = fetch(web_server, f"/{MINILM}/raw/main/config.json")
    assert status == 200 and '"architectures"' in body  # the bytes (test_web_raw.py)
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["content-disposition"].startswith("inline;")
    _, headers, _ = fetch(web_server, f"/{MINILM}/resolve/main/config.json?download=true")
    assert headers["content-disposition"] == "attachment; filename*=UTF-8''config.json"


def test_an_organisation_has_a_page_of_its_repos(web_server: MirrorServer) -> None:
    org = MINILM.split("/")[0]
    status, _, body = fetch(web_server, f"/{org}")
    assert status == 200
    assert MINILM in body and "cmh-test/tiny" not in body, body[:3000]
    assert fetch(web_server, "/no-such-org")[0] == 404


def test_snippets_read_as_code_per_library(web_server: MirrorServer) -> None:
    import html

    body = html.unescape(fetch(web_server, f"/{MINILM}")[2])
    assert "'\"'\"'" not in body and "python -c" not in body  # no shell-quoted Python
    url = web_server.url
    assert f"export HF_ENDPOINT={url}\nexport HF_HUB_DISABLE_XET=1\nhf download {MINILM} " in body
    assert f"model = SentenceTransformer('{MINILM}', revision='main')" in body
    assert f"model = AutoModel.from_pretrained('{MINILM}', revision='main')" in body
    assert f"os.environ[\"HF_ENDPOINT\"] = '{url}'" in body
    tiny = html.unescape(fetch(web_server, "/cmh-test/tiny")[2])
    assert "SentenceTransformer" not in tiny and "AutoModel.from_pretrained" in tiny


def test_an_expired_repo_says_when_and_what_clients_see(web_server: MirrorServer) -> None:
    import html

    for path in ("/cmh-test/tiny",):
        status, _, body = fetch(web_server, path)
        assert status == 200, path
        note = html.unescape(body.split('id="expired-note">', 1)[1].split("</p>", 1)[0])
        assert re.search(r"expired \d{4}-\d\d-\d\d \d\d:\d\d UTC \(.* ago\)", note), note
        assert "cmh verify" in note and "--strict" in note and "huggingface_hub" in note
    assert 'id="expired-note"' not in fetch(web_server, f"/{MINILM}")[2]


def test_tensors_are_grouped_by_layer_with_thousands_separators(web_server: MirrorServer) -> None:
    body = fetch(web_server, f"/{MINILM}/blob/main/model.safetensors")[2]
    table = body.split('id="tensors"', 1)[1].split("</table>", 1)[0]
    heads = re.findall(r'<tr class="layer-head"><th colspan="5">([^ <]+)', table)
    assert heads[:1] == ["embeddings"] and "encoder.layer.0" in heads and "encoder.layer.5" in heads
    assert len(heads) == len(set(heads))  # one group per layer
    assert re.search(r'<td class="num">\d{1,3}(,\d{3})+</td>', table)  # 1,536 not 1536
    assert not re.search(r'<td class="num">\d{4,}</td>', table)


def test_card_code_blocks_are_highlighted_and_stay_escaped(web_server: MirrorServer) -> None:
    from cmh.hub.mirror.web._cards import render_markdown

    out = render_markdown('```python\nimport os\nx = "<script>"\n```\n\n```zzz\n<b>\n```\n')
    assert '<pre class="highlight"><code class="language-python"><span class="kn">import' in out
    assert "&lt;script&gt;" in out and "<script>" not in out
    assert '<pre><code class="language-zzz">&lt;b&gt;' in out  # unknown: plain, escaped
    body = fetch(web_server, f"/{MINILM}")[2]
    card = body.split('<article class="card" id="card">', 1)[1].split("</article>", 1)[0]
    assert '<pre class="highlight"><code class="language-python">' in card


def test_operator_page_names_include_referenced_for_an_expired_revision_a_ref_names(
    web_server: MirrorServer, web_store: WebStore
) -> None:
    """Was: the page listed the expired ``main`` of cmh-test/tiny, then said ``--expired``
    would free 0 bytes, and never named ``--include-referenced``."""
    import html

    _, _, body = fetch(web_server, "/-/operator", cookie=f"cmh_token={ADMIN_TOKEN}")
    expired = body.split('id="expired"', 1)[1].split("</table>", 1)[0]
    assert web_store.commits[f"{TINY}@main"][:12] in expired
    prune = html.unescape(re.sub(r"<[^>]+>", "", body.split('id="prune"', 1)[1]))
    assert "cmh prune --store STORE --expired would free 0 B" in prune
    assert "1 expired revision is kept: a ref names it" in prune
    freed = re.search(
        r"cmh prune --store STORE --expired --include-referenced would free ([\d.]+ [kMG]?B)",
        prune,
    )
    assert freed is not None and freed.group(1) != "0 B", prune[:2000]
    assert "With --expired --include-referenced" in prune
    assert "1 revision" in prune.split("With --expired --include-referenced", 1)[1]
