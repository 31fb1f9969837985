"""Private repos and the bearer tokens that open them (the mirror's ``--tokens`` file).

Format: UTF-8 text, one token per line, then the repos it opens, separated by
spaces; ``#`` starts a comment. Models are named ``org/name``, datasets
``datasets/org/name``. Every repo named anywhere in the file is private::

    # token                     repos it opens
    s3cr3t-alice-2f8a           acme/private-model datasets/acme/private-data
    s3cr3t-bob-91c0             acme/private-model

A private repo answers only to ``Authorization: Bearer <token>`` with a token
that opens it; to anyone else it looks exactly like a missing repo. Names are
case-sensitive, except in front of an upstream (``AccessPolicy.fold``), which
answers every case of a repo id as the one repo. A repo named in the file that
the store does not hold (a typo, another case without an upstream) protects
nothing: :func:`unserved_grants` finds them, and ``cmh serve`` and
``cmh mirror ls --tokens`` warn about each.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cmh.hub.cache import SYSTEM_CLOCK, Clock, LayoutError, validate_repo_id

from cmh import read_small_file

from ._memo import Memo

_TOKEN_RE = re.compile(r"^[\x21-\x7e]{8,512}\Z")


class TokensFileError(ValueError):
    """The tokens file cannot be read or has a malformed line."""


def repo_key(repo_type: str, repo_id: str) -> str:
    """``org/name`` for a model, ``datasets/org/name`` for a dataset."""
    return repo_id if repo_type == "model" else f"{repo_type}s/{repo_id}"


@dataclass(frozen=True)
class AccessPolicy:
    """Which repos are private and which tokens open them."""

    grants: dict[str, frozenset[str]] = field(default_factory=dict)  # token -> repo keys
    #: ``(repo_type, repo_id) -> bool``: also private (pull-through: the upstream marks
    #: the repo private or gated), opened only by a token the file grants it.
    restricted: Callable[[str, str], bool] | None = field(default=None, compare=False)
    #: Names compared without case (``cmh serve --upstream``): the upstream, as huggingface.co
    #: does, answers every case of a repo id with that one repo, so a name the tokens file
    #: writes in one case keeps every case of it private (deny by default: a false split
    #: would serve the repo's bytes to anyone under another case).
    fold: bool = False

    def _key(self, repo_type: str, repo_id: str) -> str:
        key = repo_key(repo_type, repo_id)
        return key.lower() if self.fold else key

    def _opens(self, repos: frozenset[str], key: str) -> bool:
        return key in ({r.lower() for r in repos} if self.fold else repos)

    @property
    def private(self) -> frozenset[str]:
        """The repos the tokens file names, as it writes them (see :meth:`is_private` for
        every private repo)."""
        return frozenset().union(*self.grants.values()) if self.grants else frozenset()

    def names(self, repo_type: str, repo_id: str) -> bool:
        """True for a repo the tokens file names (private at the mirror by the operator)."""
        return self._opens(self.private, self._key(repo_type, repo_id))

    def is_private(self, repo_type: str, repo_id: str) -> bool:
        """True for a repo the tokens file names or :attr:`restricted` says is private
        (both looked at for every name: a private repo takes the steps of a public one)."""
        named = self.names(repo_type, repo_id)
        restricted = self.restricted is not None and self.restricted(repo_type, repo_id)
        return named or restricted

    def can_read(self, repo_type: str, repo_id: str, token: str | None) -> bool:
        """True for a public repo, or a private one opened by ``token``.

        The same steps for every name and token (every token of the file compared, also
        for a public repo or no token), so the time of an answer does not tell a private
        repo from a public or missing one, nor which token nearly matched.
        """
        key = self._key(repo_type, repo_id)
        private = self.is_private(repo_type, repo_id)
        offered = (token or "").encode()
        allowed = False
        for known, repos in self.grants.items():
            if hmac.compare_digest(known.encode(), offered) and token and self._opens(repos, key):
                allowed = True
        return allowed or not private


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _TOKEN_RE.match(token):
        return None
    return token


def load_tokens(path: Path) -> AccessPolicy:
    """Parse a tokens file (format in the module docstring)."""
    try:
        text = read_small_file(path).decode("utf-8")
    except OSError as exc:
        raise TokensFileError(f"{path}: cannot read the tokens file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TokensFileError(f"{path}: cannot read the tokens file: {exc}") from None
    grants: dict[str, set[str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        token, *repos = line.split()
        if not _TOKEN_RE.match(token):
            raise TokensFileError(f"{path}:{number}: a token is 8-512 printable characters")
        if not repos:
            raise TokensFileError(f"{path}:{number}: token opens no repo")
        for repo in repos:
            repo_id = repo[len("datasets/") :] if repo.startswith("datasets/") else repo
            try:
                validate_repo_id(repo_id)
            except LayoutError:
                raise TokensFileError(f"{path}:{number}: invalid repo {repo!r}") from None
            grants.setdefault(token, set()).add(repo)
    return AccessPolicy({t: frozenset(r) for t, r in grants.items()})


@dataclass(frozen=True)
class UnservedGrant:
    """A repo the tokens file names but the store does not hold."""

    repo: str  # as the tokens file writes it
    similar: str | None  # a public repo of the store with that name in another case

    @property
    def message(self) -> str:
        """A one-line warning for the operator."""
        text = f"the tokens file names {self.repo}, which the store does not hold"
        if self.similar is not None:
            return f"{text}; {self.similar} (another case) is served publicly"
        return f"{text} (a typo?)"

    def to_dict(self) -> dict[str, object]:
        return {"repo": self.repo, "similar": self.similar, "message": self.message}


def unserved_grants(policy: AccessPolicy, repos: Iterable[tuple[str, str]]) -> list[UnservedGrant]:
    """Repos named in the tokens file that the store does not hold, sorted by name.

    ``repos``: the ``(repo_type, repo_id)`` the store holds (``MirrorStore.repos()``).
    """
    held = {repo_key(repo_type, repo_id) for repo_type, repo_id in repos}
    by_folded = {key.casefold(): key for key in sorted(held)}
    out = []
    for key in sorted(policy.private - held):
        near = by_folded.get(key.casefold())
        if near is not None and policy.fold:
            continue  # names compared without case: the grant keeps the held repo private
        out.append(UnservedGrant(key, near if near not in policy.private else None))
    return out


#: Failed logins a client address may make before it must wait.
LOGIN_FREE_FAILURES = 5
#: Seconds of the first wait; each further failure doubles it, up to :data:`LOGIN_MAX_WAIT`.
LOGIN_FIRST_WAIT = 1.0
LOGIN_MAX_WAIT = 60.0
#: Client addresses whose failures a worker keeps (least recently failed first out), and
#: for how long after an address's last failure.
LOGIN_CLIENTS = 4096
LOGIN_FORGET_AFTER = 900.0


class LoginThrottle:
    """Failed token logins by client address (the login page, ``/-/login``): after
    :data:`LOGIN_FREE_FAILURES`, each failure makes the address wait before its next try,
    1 s doubling up to 60 s; a try while it waits is refused unchecked (``429`` with
    ``Retry-After``). Bounded: :data:`LOGIN_CLIENTS` addresses, each forgotten
    :data:`LOGIN_FORGET_AFTER` seconds after its last failure; on the worker's clock."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        # address -> (failures, monotonic time before which it may not try again)
        self._failed: Memo[str, tuple[int, float]] = Memo(
            LOGIN_CLIENTS, ttl=LOGIN_FORGET_AFTER, timer=clock.monotonic
        )

    def wait(self, client: str) -> float:
        """Seconds ``client`` must still wait before its next try (0: it may try now)."""
        kept = self._failed.get(client)
        return max(0.0, kept[1] - self.clock.monotonic()) if kept is not None else 0.0

    def failed(self, client: str) -> None:
        kept = self._failed.get(client)
        failures = (kept[0] if kept is not None else 0) + 1
        over = failures - LOGIN_FREE_FAILURES
        pause = min(LOGIN_MAX_WAIT, LOGIN_FIRST_WAIT * 2 ** min(over - 1, 16)) if over > 0 else 0.0
        self._failed.put(client, (failures, self.clock.monotonic() + pause))

    def passed(self, client: str) -> None:
        self._failed.drop(client)

    def clients(self) -> int:
        """Addresses kept (for tests)."""
        return len(self._failed)
