"""The pages' addresses: Hub-style URLs (``/org/name/tree/main/docs``), parsed and built.

A page URL is a huggingface.co page URL with the host changed: ``/{repo}``,
``/{repo}/tree/{rev}[/{dir}]``, ``/{repo}/blob/{rev}/{file}``,
``/{repo}/commits/{rev}``, each also under ``/datasets/``, and ``/models``,
``/datasets`` for the list. The server asks :func:`hub_target` only for a
target the Hub API has no route for (``cmh.hub.mirror._routes``), so every API
path keeps its meaning. A revision with a slash is one segment with ``%2F``
(what the Hub writes, ``refs%2Fpr%2F1``), or ``refs/pr/N`` written out.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlencode

#: Page kinds after the repo id, as the Hub names them.
KEYWORDS = ("tree", "blob", "commits", "commit", "raw")


@dataclass(frozen=True)
class HubTarget:
    """What a Hub-style page URL asks for (repo id, revision and path not yet checked)."""

    kind: str  # list | repo | tree | blob | commits
    repo_type: str = "model"
    repo_id: str = ""
    revision: str | None = None
    path: str = ""


def hub_target(segs: list[str]) -> HubTarget | None:
    """The page that decoded path segments name, or ``None`` when they name none."""
    if segs and segs[-1] == "" and len(segs) > 1:
        segs = segs[:-1]  # one trailing slash
    if segs in (["models"], ["datasets"]):
        return HubTarget("list", segs[0][:-1])
    repo_type = "model"
    if segs[:1] == ["datasets"]:
        repo_type, segs = "dataset", segs[1:]
    if not segs or segs[0] in ("api", "-", "models", "datasets") or not all(segs[:1]):
        return None
    for n in (2, 1):
        if len(segs) > n + 1 and segs[n] in KEYWORDS and all(segs[:n]):
            rest = segs[n + 1 :]
            if rest[0] == "refs" and len(rest) >= 3 and rest[1] == "pr":
                revision, rest = "/".join(rest[:3]), rest[3:]
            else:
                revision, rest = rest[0], rest[1:]
            kind = {"commit": "tree"}.get(segs[n], segs[n])  # /commit/SHA: the tree at SHA
            if kind in ("commits", "tree") and segs[n] != "tree" and rest:
                return None
            if kind in ("blob", "raw") and not rest:
                return None
            return HubTarget(kind, repo_type, "/".join(segs[:n]), revision, "/".join(rest))
    if len(segs) in (1, 2) and all(segs):
        return HubTarget("repo", repo_type, "/".join(segs))
    return None


@dataclass(frozen=True)
class RepoUrls:
    """Links to one repo's pages and files (templates call these)."""

    repo_type: str
    repo_id: str

    @property
    def home(self) -> str:
        prefix = "" if self.repo_type == "model" else f"/{self.repo_type}s"
        return f"{prefix}/{quote(self.repo_id, safe='/')}"

    def tree(self, revision: str, path: str = "") -> str:
        tail = f"/{quote(path, safe='/')}" if path else ""
        return f"{self.home}/tree/{quote(revision, safe='')}{tail}"

    def blob(self, revision: str, path: str, **query: str) -> str:
        url = f"{self.home}/blob/{quote(revision, safe='')}/{quote(path, safe='/')}"
        return f"{url}?{urlencode(query)}" if query else url

    def commits(self, revision: str) -> str:
        return f"{self.home}/commits/{quote(revision, safe='')}"

    def resolve(self, revision: str, path: str) -> str:
        """The Hub API's file URL (what ``hf_hub_download`` fetches; a ``Bearer`` token opens
        a private repo)."""
        return f"{self.home}/resolve/{quote(revision, safe='')}/{quote(path, safe='/')}"

    def raw(self, revision: str, path: str, download: bool = False) -> str:
        """The pages' file URL (the page's viewer, by its login cookie, opens a private repo);
        ``download``: saved as an attachment."""
        url = f"{self.home}/raw/{quote(revision, safe='')}/{quote(path, safe='/')}"
        return url + "?download=true" if download else url


def list_url(**facets: str) -> str:
    """The repo list filtered by ``facets`` (empty values dropped)."""
    kept = {k: v for k, v in facets.items() if v}
    return "/?" + urlencode(kept) if kept else "/"
