"""The Hub endpoint and the token, found as the stock client finds them."""

from __future__ import annotations

import os

DEFAULT_ENDPOINT = "https://huggingface.co"


def default_endpoint() -> str:
    """``HF_ENDPOINT`` read now (not at import), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token_to_send(token: str | bool | None) -> str | None:
    """The token the stock client sends for its ``token`` argument, chosen by
    huggingface_hub's own ``get_token_to_send`` (every supported release has it): a string
    is sent; ``False`` sends none; ``True`` sends ``HF_TOKEN`` or the token file, and
    raises the stock ``LocalTokenNotFoundError`` when there is neither; ``None`` sends
    them too unless ``HF_HUB_DISABLE_IMPLICIT_TOKEN`` is set."""
    if token is False:
        return None
    if isinstance(token, str):
        return token or None
    from huggingface_hub.utils._headers import get_token_to_send

    if token is True:
        return get_token_to_send(True) or None  # LocalTokenNotFoundError when none is found
    try:
        found = get_token_to_send(None)
    except Exception:  # an unreadable token file, OIDC not configured, ...: none sent
        return None
    return found or None
