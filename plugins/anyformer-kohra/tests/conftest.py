"""Shared fixtures: the tiny repos (built once per machine, see kohra_fixtures.py) and their loaded codecs."""

from __future__ import annotations

from pathlib import Path

import pytest
from kohra_fixtures import fixture_repo


@pytest.fixture(scope="session")
def mdlm_repo() -> Path:
    """The tiny MDLM without time conditioning."""
    return fixture_repo("mdlm")


@pytest.fixture(scope="session")
def mdlm_tc_repo() -> Path:
    """The tiny MDLM with adaLN time conditioning on sigma."""
    return fixture_repo("mdlm-tc")


@pytest.fixture(scope="session")
def bd3lm_repo() -> Path:
    """The tiny block-diffusion model with a key/value cache."""
    return fixture_repo("bd3lm")


@pytest.fixture(scope="session")
def bd3lm_mask_repo() -> Path:
    """The same block-diffusion model without a cache: a 4-D attention mask instead."""
    return fixture_repo("bd3lm-mask")
