"""What a client presents to its controller: its client token, and the program it runs for."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathways.credentials import client_credentials
from pathways_wire.driver_protocol import CLIENT_TOKEN_METADATA, PROGRAM_METADATA
from pathways_wire.errors import RuntimeUnavailableError


def test_a_driver_pod_presents_its_mounted_token_and_names_its_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    monkeypatch.setenv("PATHWAYS_PROGRAM_TOKEN_FILE", str(token))
    monkeypatch.setenv("PATHWAYS_PROGRAM", "train")
    monkeypatch.setenv("PATHWAYS_NAMESPACE", "ml")
    assert client_credentials(None) == ((CLIENT_TOKEN_METADATA, "s3cret"), (PROGRAM_METADATA, "ml/train"))


def test_a_client_with_no_token_presents_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PATHWAYS_PROGRAM_TOKEN_FILE", "PATHWAYS_PROGRAM"):
        monkeypatch.delenv(name, raising=False)
    assert client_credentials(None) == ()


def test_an_unreadable_token_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHWAYS_PROGRAM_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(RuntimeUnavailableError, match="cannot read the client token .*missing"):
        client_credentials(None)
