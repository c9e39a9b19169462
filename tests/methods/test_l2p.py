"""L2P on tiny random backbones: frozen backbone, keys pulled to queries, frequency-penalised selection."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from openbook.backbone import Backbone
from openbook.classifier import Classifier
from openbook.methods import MethodError, TrainBatch, build_method, weights_sha256
from openbook.methods.l2p import L2PConfig, PromptPool, frozen_query
from openbook.train_config import TrainConfig
from openbook.training import train

CONFIG = TrainConfig(steps=40, batch_size=4, lr=1e-3, eval_every=8, patience=10, warmup_ratio=0.0)


def selected_key_cosine(classifier: Classifier, toy) -> float:
    """Mean cosine between each text's query and the keys inference selects for it."""
    pool = classifier.prompt
    assert isinstance(pool, PromptPool)
    pool.eval()
    classifier.embed(toy.texts)
    selection = pool.last_selection  # the last batch: all 8 texts fit in one
    assert selection is not None and len(selection.query) == len(toy.texts)
    keys = F.normalize(pool.keys.detach()[selection.indices], dim=-1)  # (B, N, H)
    return float((keys * selection.query[:, None]).sum(-1).mean())


def test_loss_falls_backbone_stays_frozen_and_checkpoint_round_trips(
    model_dir: Path, tmp_path: Path, toy, fresh_classifier, save_and_reload
) -> None:
    classifier, method = fresh_classifier(model_dir, "l2p/prompt-lr=0.1")
    base_sha = weights_sha256(classifier.backbone.model)
    before_weights = {k: v.clone() for k, v in classifier.backbone.model.state_dict().items()}
    pool = classifier.prompt
    assert isinstance(pool, PromptPool)
    initial_prompts = pool.prompts.detach().clone()
    cosine_before = selected_key_cosine(classifier, toy)
    last: dict[str, torch.Tensor] = {}

    def keep_last_step(step: int, steps: int, loss: float) -> None:
        if step == steps:  # the loop ends on the best dev step, which may be step 0: keep the last one too
            last.update({k: v.detach().clone() for k, v in method.trained_tensors(classifier).items()})

    texts, labels = toy.texts, toy.labels
    result = train(
        classifier, method, texts, labels, texts, labels, CONFIG, progress=False, on_step=keep_last_step
    )
    # A frozen random backbone barely separates the classes whatever it is prompted with, so the
    # cross-entropy moves little here; most of the fall is the surrogate term (keys meeting queries).
    assert np.mean(result.losses[-4:]) < 0.8 * np.mean(result.losses[:4])
    for name, tensor in classifier.backbone.model.state_dict().items():
        assert torch.equal(tensor, before_weights[name]), name
    assert last["counts"].sum() == CONFIG.steps * CONFIG.batch_size * method.config.top_n
    assert not torch.allclose(last["prompts"], initial_prompts)  # the chosen prompts got gradient
    best = {k: v.detach().clone() for k, v in method.trained_tensors(classifier).items()}
    method.load_trained(classifier, last)
    # The surrogate loss pulled the selected keys toward the queries that chose them.
    assert selected_key_cosine(classifier, toy) > cosine_before + 0.1
    method.load_trained(classifier, best)
    assert set(method.trained_tensors(classifier)) == {"keys", "prompts", "counts"}

    before = classifier.predict(toy.texts[:4])
    loaded, loaded_method = save_and_reload(classifier, method, model_dir, tmp_path, CONFIG, result, base_sha)
    assert loaded_method.spec == method.spec
    assert isinstance(loaded.prompt, PromptPool)
    assert torch.equal(loaded.prompt.counts, pool.counts)
    after = loaded.predict(toy.texts[:4])
    for a, b in zip(after, before, strict=True):
        assert a.label == b.label and a.probabilities == b.probabilities


def test_query_is_the_plain_prompts_slot_vector(backbone: Backbone, toy) -> None:
    encoder = backbone.encoder(toy.template, toy.verbalizer)
    batch = encoder.encode(toy.texts[:3]).to(backbone.device)
    with torch.inference_mode():
        plain = backbone.forward(batch, encoder.label_token_ids).hidden
        query = frozen_query(backbone.input_embeddings(batch.input_ids), batch, backbone)
    torch.testing.assert_close(query, F.normalize(plain, dim=-1), atol=1e-5, rtol=1e-4)


def test_the_chosen_prompts_are_prepended(backbone: Backbone, toy) -> None:
    config = L2PConfig(pool_size=4, top_n=2, prompt_length=3)
    pool = PromptPool(config, backbone.hidden_size, backbone.input_embeddings.weight, 1.0).eval()
    batch = backbone.encoder(toy.template, toy.verbalizer).encode(toy.texts[:3]).to(backbone.device)
    embeds = backbone.input_embeddings(batch.input_ids)
    with torch.no_grad():
        out = pool(embeds, batch, backbone)
    selection = pool.last_selection
    assert selection is not None and selection.indices.shape == (3, 2)
    assert out.embeds.shape[1] == embeds.shape[1] + 2 * 3
    # Row 0 reads its best key's prompt first, then its second's, then its own tokens.
    first, second = selection.indices[0].tolist()
    torch.testing.assert_close(out.embeds[0, :3], pool.prompts[first])
    torch.testing.assert_close(out.embeds[0, 3:6], pool.prompts[second])
    assert torch.equal(out.batch.slot_index, batch.slot_index + 6)
    assert pool.counts.sum() == 0  # inference does not count


def test_prompts_start_as_token_embeddings_as_the_model_reads_them(any_backbone: Backbone, toy) -> None:
    """Each prompt vector starts as some token's embedding as the embedding module returns it (Gemma 3
    scales the table by sqrt(hidden size))."""
    backbone = any_backbone
    classifier = build_method("l2p/pool-size=4/top-n=2/prompt-length=3").prepare(
        Classifier(backbone, toy.template, toy.verbalizer)
    )
    pool = classifier.prompt
    assert isinstance(pool, PromptPool)
    with torch.no_grad():
        vocabulary = torch.arange(len(backbone.tokenizer), device=backbone.device)
        tokens = backbone.input_embeddings(vocabulary).float()  # (V, E)
        prompts = pool.prompts.flatten(0, 1)  # (M*L, E)
        nearest = torch.cdist(prompts, tokens, compute_mode="donot_use_mm_for_euclid_dist").min(-1).values
    assert float(nearest.max()) < 1e-4 * float(tokens.norm(dim=-1).mean())


def test_frequency_penalty_prefers_a_fresh_key_only_in_training() -> None:
    pool = PromptPool(L2PConfig(pool_size=3, top_n=1, frequency_penalty=1.0), 2, torch.randn(5, 2), 1.0)
    angle = torch.tensor([0.45, 0.55, 2.5])  # key 0 is closest to the query, key 1 slightly further
    with torch.no_grad():
        pool.keys.copy_(torch.stack([angle.cos(), angle.sin()], dim=-1))
    query = torch.tensor([[1.0, 0.0]])
    assert pool.train().select(query).item() == 0  # no counts yet: plain nearest key
    pool.counts[0] = 50.0  # key 0 served a lot in this run: the penalty reads earlier tasks only
    assert pool.train().select(query).item() == 0
    pool.close_task()  # ... and now that run is an earlier task
    assert pool.train().select(query).item() == 1  # a fresh key of nearly the same cosine wins
    assert pool.eval().select(query).item() == 0  # inference ranks by cosine alone
    pool.counts[1] = 50.0
    pool.close_task()  # equally used: the penalty cancels out
    assert pool.train().select(query).item() == 0
    pool.counts[1] = 0.0
    pool.close_task()
    unpenalised = PromptPool(
        L2PConfig(pool_size=3, top_n=1, frequency_penalty=0.0), 2, torch.randn(5, 2), 1.0
    )
    unpenalised.load_state_dict(pool.state_dict())
    unpenalised.close_task()
    assert pool.train().select(query).item() == 1 and unpenalised.train().select(query).item() == 0


def test_loading_trained_tensors_closes_a_task(causal_dir: Path, fresh_classifier) -> None:
    classifier, method = fresh_classifier(causal_dir, "l2p")
    tensors = method.trained_tensors(classifier)
    tensors["counts"] = torch.arange(10.0)
    method.load_trained(classifier, tensors)  # e.g. the next stage of a continual sequence starts here
    pool = classifier.prompt
    assert isinstance(pool, PromptPool)
    assert torch.equal(pool.previous_counts.cpu(), torch.arange(10.0))
    assert "previous_counts" not in method.trained_tensors(classifier)


def test_training_counts_the_selections(causal_dir: Path, toy, fresh_classifier) -> None:
    classifier, method = fresh_classifier(causal_dir, "l2p/pool-size=4/top-n=2")
    pool = classifier.prompt
    assert isinstance(pool, PromptPool)
    assert not pool.training  # the loop's calibration and step-0 passes run before any training step
    classifier.embed(toy.texts)
    assert pool.counts.sum() == 0
    pool.train()
    loss = method.loss(classifier, TrainBatch(toy.texts[:4], torch.tensor(toy.labels[:4]), np.arange(4)))
    assert loss.requires_grad
    assert pool.counts.sum() == 4 * 2 and pool.counts.max() <= 4


def test_bad_options_and_mismatched_checkpoints_are_clear_errors(causal_dir: Path, fresh_classifier) -> None:
    with pytest.raises(MethodError, match="pool-size must be at least top-n"):
        build_method("l2p/pool-size=2/top-n=5")
    with pytest.raises(MethodError, match="must be at least 1"):
        build_method("l2p/prompt-length=0")
    with pytest.raises(MethodError, match="non-negative"):
        build_method("l2p/pull-weight=-1")
    small, small_method = fresh_classifier(causal_dir, "l2p/pool-size=6")
    big, big_method = fresh_classifier(causal_dir, "l2p")
    with pytest.raises(MethodError, match="do not fit"):
        small_method.load_trained(small, big_method.trained_tensors(big))
