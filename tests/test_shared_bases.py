"""Bases of one sentence encoder cut at other layers (`sentence_reader.shared_encoder`,
`SharedEncoder.at_cut`): one copy of its weights, each cut reading as a base loaded alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from openbook.sentence_reader import SentenceReader
from openbook.split_encoder import SharedEncoder

from tests.test_sentence_reader import TOY_LABELS, TOY_TEXTS, TUNING, _config


def test_bases_cut_at_other_layers_share_the_models_weights_and_read_as_a_base_of_their_own(
    sentence_mpnet_dir: Path,
):
    from openbook.sentence_reader import shared_encoder

    top_two = shared_encoder(_config(sentence_mpnet_dir, max_length=48), "cpu")
    whole = shared_encoder(_config(sentence_mpnet_dir, max_length=48, top_layers=3), "cpu")
    assert whole is not top_two and whole.top_layers == 3 and whole.cut == top_two.cut - 1
    assert whole.model is top_two.model  # one copy of the encoder's weights in memory
    assert shared_encoder(_config(sentence_mpnet_dir, max_length=48, top_layers=3), "cpu") is whole
    alone = SharedEncoder.load(_config(sentence_mpnet_dir, max_length=48, top_layers=3), "cpu")
    config = _config(sentence_mpnet_dir, **(TUNING | {"max_length": 48, "top_layers": 3}))
    tuned, tuned_alone = SentenceReader(whole), SentenceReader(alone)
    for reader in (tuned, tuned_alone):
        reader.tune(TOY_TEXTS, TOY_LABELS, config)
    np.testing.assert_allclose(tuned.embed(TOY_TEXTS), tuned_alone.embed(TOY_TEXTS), atol=1e-5)
    np.testing.assert_allclose(
        SentenceReader(top_two).embed(TOY_TEXTS), SentenceReader(alone).embed(TOY_TEXTS), atol=1e-5
    )  # untuned, either cut reads the encoder's own embeddings
