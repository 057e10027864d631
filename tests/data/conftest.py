"""Shared fixtures of the data tests: the King James Bible text, generated once per session."""

import shutil

import pytest

from deqjax._src.data import kjv as kjv_lib

HAVE_BIBLE = shutil.which("bible") is not None
needs_bible = pytest.mark.skipif(
    not HAVE_BIBLE, reason="`bible` not installed (Debian: apt-get install bible-kjv)"
)


@pytest.fixture(scope="session")
def kjv_cache(tmp_path_factory):
    """``(cache folder, corpus)`` of the King James Bible stand-in (skips without `bible`)."""
    if not HAVE_BIBLE:
        pytest.skip("`bible` not installed (Debian: apt-get install bible-kjv)")
    cache = tmp_path_factory.mktemp("kjv_cache")
    return cache, kjv_lib.load_kjv(cache_dir=cache)
