"""[hf]: how the Hugging Face Hub is reached for ``hf://`` sources (read by
cartonstore.config). HF_ENDPOINT and HF_TOKEN, huggingface_hub's own
variables, set ``endpoint`` and ``token``.

    [hf]
    endpoint = "https://huggingface.co"        # or a mirror that speaks the Hub's API
    token_file = "/etc/cartonstore/hf-token"   # for private and gated repositories
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cartonstore.fetch.http.config import HubConfig

from . import values as v

_DEFAULTS = HubConfig()


def _endpoint(value: object) -> str:
    if not isinstance(value, str):
        raise v.BadValue(f"expected the Hub's URL as a string, got {value!r}")
    return v.url_prefix(value, what="the Hub's endpoint is a URL prefix (its API is <endpoint>/api/...)")


@dataclass(frozen=True)
class HubSettings:
    """[hf]"""

    endpoint: str = v.setting(_DEFAULTS.endpoint, _endpoint)
    # A token set here or by HF_TOKEN wins over token_file, as HF_TOKEN wins over huggingface_hub's stored one.
    token: str = v.token_setting()
    token_file: Path | None = v.setting(None, v.path(empty=None), v.show_path)  # noqa: RUF009 - a field()

    def hub_config(self) -> HubConfig:
        token = self.token or (v.read_token(self.token_file, "hf.token_file") if self.token_file is not None else "")
        return HubConfig(self.endpoint, token)
