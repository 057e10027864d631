"""The language models' data section: its flags and smoke settings (the LM smoke run loads it)."""

from deqjax import harness
from experiments.parts.corpus_config import CorpusConfig


def test_flags_and_smoke():
    c = harness.parse_config(CorpusConfig(), ["--vocab_size", "300", "--corpus", "kjv"])
    assert (c.vocab_size, c.corpus, c.max_eval_lines) == (300, "kjv", 2000)
    assert CorpusConfig.SMOKE["vocab_size"] == 300
