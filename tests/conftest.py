"""Shared fixtures: the real SmolLM2 tokenizer and model, loaded once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from uniagent.models.loading import load_tokenizer, smollm2_source

SHARED_TEMPLATES = Path(__file__).resolve().parents[2] / "shared" / "chat_templates"


@pytest.fixture(scope="session")
def smol_source():
    return smollm2_source()


@pytest.fixture(scope="session")
def smol_tokenizer(smol_source):
    return load_tokenizer(smol_source)


@pytest.fixture(scope="session")
def smol_engine(smol_source):
    """One LocalEngine (real SmolLM2 weights) shared by the whole session."""
    from uniagent.models.local import LocalEngine

    engine = LocalEngine(smol_source)
    yield engine
    engine.close()
