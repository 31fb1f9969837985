"""The Hub endpoint and the token, found as the stock client finds them."""

from __future__ import annotations

import os

DEFAULT_ENDPOINT = "https://huggingface.co"


def default_endpoint() -> str:
    """``HF_ENDPOINT`` read now (not at import), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def default_token() -> str | None:
    """``HF_TOKEN`` (or the stock client's token file), as the stock client finds it."""
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token and token.strip():
        return token.strip()
    try:
        from huggingface_hub import get_token

        found = get_token()
    except Exception:  # no token file, OIDC not configured, ...
        return None
    return found or None
