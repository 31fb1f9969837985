"""Drop-in exactness with several credentials: what install()'s hook remembered or stored
for one token is never given to a request made with another token, or with none.

A private repo (the Hub's answers: 401 without ``Authorization``, 404 ``RepoNotFound`` with
a token that may not read it) loaded with a reader's token; within the install window the
same process asks with another user's token, with none and with ``token=False``, through
the stock API, ``HfFileSystem`` and the raw shared client. Each outcome is compared with
the stock client's, run the same way in a fresh cache without ``install()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_dropin_hook import (  # noqa: F401 (fixtures)
    REPO,
    aim_stock_client,
    hooked_server,
    toy,
)

READER = "hf_reader_token_0001"
OTHER = "hf_other_user_0002"


def _outcome(call: Callable[[], Any]) -> str:
    try:
        return f"= {call()!r}"
    except Exception as exc:
        return type(exc).__name__


def _steps(front: Any) -> tuple[dict[str, str], dict[str, int]]:
    """The load with the reader's token, then the other credentials' calls: what each
    returned or raised, and how many requests each sent to the Hub."""
    from huggingface_hub import HfApi, HfFileSystem, get_session, hf_hub_download, hf_hub_url

    def raw(authorization: str | None) -> Callable[[], Any]:
        def get() -> Any:
            headers = {"Authorization": authorization} if authorization else {}
            answer = get_session().get(hf_hub_url(REPO, "config.json"), headers=headers)
            return answer.status_code

        return get

    def file(token: Any) -> Callable[[], Any]:
        return lambda: Path(hf_hub_download(REPO, "config.json", token=token)).name

    out = {"load": _outcome(file(READER))}
    calls: dict[str, Callable[[], Any]] = {
        "repo_exists other": lambda: HfApi(token=OTHER).repo_exists(REPO),
        "repo_exists False": lambda: HfApi(token=False).repo_exists(REPO),
        "file_exists False": lambda: HfApi(token=False).file_exists(REPO, "config.json"),
        "file_exists other": lambda: HfApi(token=OTHER).file_exists(REPO, "config.json"),
        "model_info other": lambda: HfApi(token=OTHER).model_info(REPO).sha is not None,
        "model_info none": lambda: HfApi().model_info(REPO).sha is not None,
        "revision info other": lambda: (
            HfApi(token=OTHER).model_info(REPO, revision=Path(out["commit"]).name).sha is not None
        ),
        "list_repo_files other": lambda: len(HfApi(token=OTHER).list_repo_files(REPO)),
        "raw get other": raw(f"Bearer {OTHER}"),
        "raw get none": raw(None),
        "hffs other": lambda: len(
            HfFileSystem(token=OTHER, skip_instance_cache=True).read_bytes(f"{REPO}/config.json")
        ),
        "model_info reader": lambda: HfApi(token=READER).model_info(REPO).sha is not None,
        "raw get reader": raw(f"Bearer {READER}"),
    }
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{REPO.replace('/', '--')}" / "snapshots"
    out["commit"] = str(next(snapshots.iterdir()))
    sent = {}
    for name, call in calls.items():
        mark = len(front.records())
        out[name] = _outcome(call)
        sent[name] = len(front.records()) - mark
    del out["commit"]
    return out, sent


@pytest.mark.parametrize(
    ("stamped", "api_cache"),
    [(False, False), (True, False), (True, True)],
    ids=["hub-named", "fresh-snapshot", "api-from-cache"],
)
def test_answers_of_one_token_are_never_given_to_another(
    toy: Any,  # noqa: F811 (a fixture)
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    stamped: bool,
    api_cache: bool,
) -> None:
    """Within the window of a load made with a reader's token, every call with another
    token, with none or with ``token=False`` raises or answers what the stock client's
    does (it asks the Hub); the reader's own calls are still answered from the cache.
    ``stamped``: the load is answered from a fresh snapshot (``cmh pull`` before), so the
    bare calls belong to a load the cache answered; else the Hub named the commit.
    ``api_cache``: ``install(api_from_cache=True)``, where the cache's own word names the
    commit for any bare call: the answers ``resolve()`` stored for the reader's token, and
    the blobs, are still given to that token only."""
    import cmh.hub as hub
    from cmh.hub.resolver import _window
    from hublike import running

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    with running(toy.server.url) as front:
        front.hide(REPO, frozenset({f"Bearer {READER}"}))
        aim_stock_client(monkeypatch, front.url, tmp_path / "stock")
        stock, _ = _steps(front)
        aim_stock_client(monkeypatch, front.url, tmp_path / "installed")
        assert hub.install(api_from_cache=api_cache)
        try:
            _window.forget()  # as a new process
            if stamped:
                hub.resolve(REPO, cache_dir=tmp_path / "installed", token=READER)
                assert len(_window.recent) == 0, "resolve() opens no window"
            got, sent = _steps(front)
        finally:
            hub.uninstall()
    assert stock["repo_exists other"] == "= False", stock  # the Hub's answers, as set up
    assert stock["raw get other"] == "= 404" and stock["raw get none"] == "= 401", stock
    assert got == stock
    # Every other credential asked the Hub; the reader's own calls were answered from the
    # cache, within the window of the load made with the reader's token.
    assert sent.pop("model_info reader") == sent.pop("raw get reader") == 0, sent
    assert all(sent.values()), sent
