"""Shared test set-up: quiet TensorFlow, let Open MPI run as root, one output folder."""
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def test_output_dir() -> pathlib.Path:
    """Where tests leave artefacts worth looking at (screenshots, reports): <repo>/test-output."""
    out = REPO / "test-output"
    out.mkdir(exist_ok=True)
    return out


def shown_text(html_text: str) -> str:
    """What a reader sees of an HTML fragment: its text without the tags (a name broken into
    spans at its "/" reads whole)."""
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", html_text))
