"""The classifier users see: a prompted backbone plus an open-book store.

    prediction = argmax_y  lam * P_kNN(y | x) + (1 - lam) * P_LM(y | x)

`P_LM` is the softmax over the label words' scores at the slot, after
subtracting a per-label log-prior (`label_bias`, see `calibration.py`);
`P_kNN` comes from the store's neighbours of the slot vector (`knn.py`). Every
prediction carries both, and the neighbours it used, as its explanation. With
`knn.lam` None, lam is chosen on the stored examples, each left out in turn, and
kept level with the store as examples come and go (`lambda_on_store.py`).

With a sentence reader (`reader`, `sentence_reader.py`), P_kNN is read from the same examples keyed by
the reader's sentence embeddings instead (`knn_book`, `reader_book.py`): two readers of one book, the
cloze prompt's P_LM and the encoder's neighbours, mixed by lambda as above.

Store keys and kNN queries are otherwise the slot vectors of the plain prompt. With
demonstrations on (vectors or texts, `demonstrations.py`), a second pass
shows them and only P_LM is read from it, so the store never depends on what
was retrieved into it. What reads the vectors alone (store keys, the first pass
before demonstrations) asks `embed_vectors` / `Backbone.slot_vectors`, which
score no label: with many multi-token label words the scoring is most of a
forward's cost. A task with more labels than a row shows (`DemoConfig.classes`)
shows each row its nearest classes by P_kNN, under the classifier's kNN settings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import get_args

import numpy as np
import torch
from tqdm.auto import tqdm

from openbook.backbone import Backbone, SlotOutput
from openbook.calibration import CalibrationMode, calibrated_p_lm, label_bias, with_temperature
from openbook.demonstrations import (
    DemoConfig,
    retrieve_demonstrations,
    retrieve_texts,
    to_input_space,
    to_words,
)
from openbook.knn import KnnConfig, knn_distribution, knn_mixture, knn_search
from openbook.lambda_on_store import LambdaOnStore
from openbook.predictions import Embeddings, Neighbour, Prediction, Scores, SlotVectors
from openbook.prompting import EncodedBatch, PromptEncoder, PromptError, Template, TextInput, Verbalizer
from openbook.reader_book import ReaderBook, as_string
from openbook.sentence_reader import SentenceReader
from openbook.soft_prompts import SoftPrompt
from openbook.store import KnowledgeStore
from openbook.word_scores import LabelScoring


@dataclass
class Classifier:
    backbone: Backbone
    template: Template
    verbalizer: Verbalizer
    store: KnowledgeStore = field(default=None)  # type: ignore[assignment]  # built in __post_init__
    knn: KnnConfig = field(default_factory=KnnConfig)
    demos: DemoConfig | None = None  # None: no demonstrations
    label_bias: np.ndarray | None = None  # (C,) log-prior subtracted from the label scores
    prompt: SoftPrompt | None = None  # trainable prompt vectors of DART, IPT, L2P, PEFT (soft_prompts.py)
    # P = softmax(log P / T) after the interpolation: temperature scaling fitted on dev (quality.calibrate)
    confidence_temperature: float = 1.0
    batch_size: int = 32
    # How P_LM scores the label words (`word_scores.py`): exactly, or by label vectors in the slot's space
    label_scoring: LabelScoring = "exact"
    # With `knn.lam` None: the stored examples' label scores and the lambda chosen on them. Every classifier
    # starts its own (`dataclasses.replace` too): the scores are of its prompt, labels and store.
    lam_on_store: LambdaOnStore = field(init=False, repr=False, compare=False)
    # The book's second reader: with one, P_kNN reads the store's examples keyed by its sentence embeddings
    reader: SentenceReader | None = None
    # A query whose nearest stored example is less similar than this (as the kNN scores it) is out of
    # scope (`Prediction.out_of_scope`): chosen on dev where a reader keys the book (`out_of_scope.py`);
    # None: never.
    min_similarity: float | None = None

    def __post_init__(self) -> None:
        self.lam_on_store = LambdaOnStore()
        self._reader_book: ReaderBook | None = None  # the book as `reader` keys it, made when first read
        if self.label_scoring not in get_args(LabelScoring):
            choices = ", ".join(get_args(LabelScoring))
            raise ValueError(f"label_scoring must be one of {choices}, got {self.label_scoring!r}")
        self.encoder = self.backbone.encoder(self.template, self.verbalizer)
        self.demo_encoder: PromptEncoder | None = None
        if self.demos is not None:
            self.demo_encoder = self.backbone.encoder(
                self.template,
                self.verbalizer,
                demonstrations=self.demos.layout,
                demo_classes=self.demos.classes,
            )
        if self.store is None:
            self.store = self.empty_store()
        elif self.store.dim != self.backbone.hidden_size:
            raise ValueError(
                f"store dim {self.store.dim} != backbone hidden size {self.backbone.hidden_size}"
            )
        elif self.store.device != self.backbone.device:  # the keys go where the queries come from
            self.store = self.store.to(self.backbone.device)

    def empty_store(self) -> KnowledgeStore:
        """A new store that fits this classifier's backbone: what `store=None` builds."""
        return KnowledgeStore(self.backbone.hidden_size, device=self.backbone.device)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.verbalizer.labels

    def knn_book(self) -> KnowledgeStore:
        """The keys P_kNN reads: the store's examples under the reader's embeddings where the classifier
        has a sentence reader (brought level with the store here), else the store itself."""
        if self.reader is None:
            return self.store
        if self._reader_book is None or self._reader_book.reader is not self.reader:  # a new or tuned reader
            self._reader_book = ReaderBook(self.reader)
        return self._reader_book.of(self.store)

    def knn_queries(self, embeddings: Embeddings) -> np.ndarray:
        """The (N, H) unit queries of `embeddings` in `knn_book`'s space."""
        if self.reader is None:
            return embeddings.vectors
        if embeddings.reader_vectors is None:
            raise ValueError("these embeddings lack the sentence reader's: take them with embed(texts)")
        return embeddings.reader_vectors

    def calibration_bias(
        self, mode: CalibrationMode, domain_lm_log_probs: np.ndarray | None = None
    ) -> np.ndarray | None:
        """The label bias that `mode` gives for this prompt (see `calibration.py`); not set here."""
        return label_bias(
            mode, lambda texts: self.embed(texts).lm_log_probs, self.template.is_pair, domain_lm_log_probs
        )

    @property
    def scores_words_by_tree(self) -> bool:
        """Whether scoring the labels runs a pass over their words' token tree after the prompt's forward
        (a causal backbone's multi-token words, scored exactly: `word_scores.py`), the part of a forward
        whose cost grows with the labels."""
        if self.backbone.kind != "causal" or self.label_scoring != "exact":
            return False
        if self.prompt is not None and self.prompt.scores_labels:
            return False
        return any(len(ids) > 1 for ids in self.encoder.label_token_ids)

    def label_indices(self, labels: Sequence[str]) -> np.ndarray:
        return np.array([self.verbalizer.index(label) for label in labels], dtype=np.int64)

    def embed(
        self,
        texts: Sequence[TextInput],
        *,
        exclude_ids: np.ndarray | None = None,
        progress: bool | str = False,
        vectors_only: bool = False,
        queries: np.ndarray | None = None,
        with_reader: bool = True,
    ) -> Embeddings:
        """Slot vectors and label scores for `texts`, in batches, without gradients.

        Texts are batched in order of length, so a batch pads to similar lengths; results come back
        in the order given. `vectors_only` skips the demonstration pass: the label scores are then the
        plain prompt's, from the forward that gave the vectors. Only the vectors needed? `embed_vectors`.
        `queries`, the (N, H) unit slot vectors of `texts` when already known under the current weights
        (as `embed_vectors` gave them: training's store keys), stand in for the demonstration pass's first
        forward, which only finds them. A sentence reader embeds the texts too, unless `vectors_only` or
        not `with_reader` (training's dev checks, which read P_LM alone).
        """
        if queries is not None and len(queries) != len(texts):
            raise ValueError(f"{len(queries)} query vectors for {len(texts)} texts")
        vectors, scores, truncated = [], [], []
        with torch.inference_mode():
            for rows, chunk, batch in self._batches(texts, progress):
                cut = batch.truncated
                if self.demo_encoder is not None and len(self.store) > 0 and not vectors_only:
                    # The demonstration pass gives the label scores: the first pass only finds the query.
                    hidden = (
                        self._unit(self.backbone.slot_vectors(batch, prompt=self.prompt))
                        if queries is None
                        else queries[rows]
                    )
                    skip = None if exclude_ids is None else exclude_ids[rows]
                    log_probs, demo_cut = self.label_scores(chunk, hidden, skip)
                    cut = cut | demo_cut
                else:  # one forward for both the kNN query and P_LM
                    out = self._forward(batch, self.encoder.label_token_ids)
                    hidden, log_probs = self._unit(out.hidden), out.label_log_probs
                vectors.append(hidden)
                scores.append(log_probs.cpu().numpy())
                truncated.append(cut.numpy())
        slots, lm_log_probs, cut_rows = self._in_given_order(texts, vectors, scores, truncated)
        read = None
        if self.reader is not None and with_reader and not vectors_only:
            read = self.reader.embed([as_string(text) for text in texts])
        return Embeddings(slots, lm_log_probs, cut_rows, read)

    def embed_vectors(self, texts: Sequence[TextInput], *, progress: bool | str = False) -> SlotVectors:
        """The unit slot vectors of the plain prompt, as `embed` gives them, with no label scored:
        store keys (`add_examples`, re-embedding after training) and retrieval queries."""
        vectors, truncated = [], []
        with torch.inference_mode():
            for _, _, batch in self._batches(texts, progress):
                vectors.append(self._unit(self.backbone.slot_vectors(batch, prompt=self.prompt)))
                truncated.append(batch.truncated.numpy())
        return SlotVectors(*self._in_given_order(texts, vectors, truncated))

    def _batches(
        self, texts: Sequence[TextInput], progress: bool | str
    ) -> Iterator[tuple[np.ndarray, Sequence[TextInput], EncodedBatch]]:
        """(rows, texts, encoded batch) of `batch_size` texts at a time, in order of length; the texts
        tokenized once, up front, unless they come tokenized (`encoder.tokenize`)."""
        if not texts:
            raise PromptError("no texts given")
        tokenized = self.encoder.tokenize(texts)
        order = np.argsort([_length(text) for text in texts], kind="stable")
        starts = range(0, len(texts), self.batch_size)
        bar = tqdm(starts, desc=progress if isinstance(progress, str) else "embed", disable=not progress)
        for start in bar:
            rows = order[start : start + self.batch_size]
            chunk = tokenized.select(rows)
            yield rows, chunk, self.encoder.encode(chunk)

    @staticmethod
    def _in_given_order(texts: Sequence[TextInput], *parts: list[np.ndarray]) -> list[np.ndarray]:
        """Each part's batches joined and put back in the order `texts` were given (`_batches` sorts)."""
        inverse = np.argsort(np.argsort([_length(text) for text in texts], kind="stable"))
        return [np.concatenate(part)[inverse] for part in parts]

    @staticmethod
    def _unit(hidden: torch.Tensor) -> np.ndarray:
        return torch.nn.functional.normalize(hidden, dim=-1).cpu().numpy()

    def label_scores(
        self,
        texts: Sequence[TextInput],
        queries: np.ndarray | None = None,
        exclude_ids: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C) label-word log-probs, differentiable, and (B,) truncation flags.

        With demonstrations on and a non-empty store, they are retrieved for `queries` (unit slot
        vectors; `exclude_ids[b]` is never retrieved for row b) and injected; otherwise the plain
        prompt is scored. Training calls this under autograd, `embed` without.
        """
        if self.demo_encoder is None or self.demos is None or len(self.store) == 0:
            batch = self.encoder.encode(texts)
            out = self._forward(batch, self.encoder.label_token_ids)
            return out.label_log_probs, batch.truncated
        if queries is None:
            raise ValueError("demonstrations need query vectors to retrieve them")
        label_ids = self.demo_encoder.label_token_ids
        # the classes a row shows: as many as asked for the written-out demonstrations (the encoder drops
        # what does not fit), as many as the encoder fits for the vector pairs
        shown = self.demos.classes if self.demos.mode == "text" else self.demo_encoder.demo_classes
        p_knn = self._p_knn(queries, exclude_ids) if shown < len(self.labels) else None
        retrieval = (self.store, queries, len(self.labels), self.demos)
        if self.demos.mode == "text":
            written = retrieve_texts(*retrieval, exclude_ids=exclude_ids, shown=shown, p_knn=p_knn)
            batch = self.demo_encoder.encode(texts, demos=written)
            out = self._forward(batch, label_ids)
            return out.label_log_probs, batch.truncated
        demos = retrieve_demonstrations(*retrieval, exclude_ids=exclude_ids, shown=shown, p_knn=p_knn)
        batch = self.demo_encoder.encode(texts, classes=demos.classes)
        table, scale = self.backbone.input_embedding_table(), self.backbone.input_embedding_scale
        injected = (  # (B, K, E), as the model reads its input embeddings
            to_words(demos.vectors, self.backbone.output_head, table) * scale
            if self.demos.mode == "words"
            else to_input_space(demos.vectors, table, scale)
        )
        out = self._forward(batch, label_ids, injected)
        return out.label_log_probs, batch.truncated

    def plain_forward(self, texts: Sequence[TextInput]) -> SlotOutput:
        """The plain prompt's forward over `texts` (no demonstrations), differentiable where the caller
        has gradients on: the slot vectors, and the label scores as this classifier scores them."""
        return self._forward(self.encoder.encode(texts), self.encoder.label_token_ids)

    def _forward(
        self, batch: EncodedBatch, label_ids: list[list[int]], demo_vectors: torch.Tensor | None = None
    ) -> SlotOutput:
        return self.backbone.forward(
            batch, label_ids, demo_vectors, prompt=self.prompt, scoring=self.label_scoring
        )

    def _p_knn(self, queries: np.ndarray, exclude_ids: np.ndarray | None) -> np.ndarray:
        """(B, C) each query's P_kNN under the classifier's kNN settings, as `score` interpolates it."""
        hits = knn_search(self.store, queries, self.knn.k, self.knn.similarity, exclude_ids=exclude_ids)
        return knn_distribution(
            torch.from_numpy(hits.similarities),
            torch.from_numpy(hits.labels),
            len(self.labels),
            self.knn.temperature,
            self.knn.standardise,
        ).numpy()

    def score(
        self, embeddings: Embeddings, *, knn: KnnConfig | None = None, exclude_ids: np.ndarray | None = None
    ) -> Scores:
        """P_LM, P_kNN and their interpolation (at the confidence temperature); `exclude_ids` gives
        leave-one-out retrieval."""
        p_lm = calibrated_p_lm(embeddings.lm_log_probs, self.label_bias)  # (N, C)
        if len(self.store) == 0:
            return Scores(
                p_lm, np.zeros_like(p_lm), with_temperature(p_lm, self.confidence_temperature), None
            )
        knn = knn or self.served_knn()
        queries = self.knn_queries(embeddings)
        hits = knn_search(self.knn_book(), queries, knn.k, knn.similarity, exclude_ids=exclude_ids)
        p_knn, p = knn_mixture(p_lm, hits.similarities, hits.labels, knn)
        return Scores(p_lm, p_knn, with_temperature(p, self.confidence_temperature), hits)

    def served_knn(self) -> KnnConfig:
        """The kNN settings predictions use: `knn`, its lambda chosen on the stored examples where it is
        None (chosen again here if the store changed since; `lambda_on_store.py`)."""
        if self.knn.lam is not None:
            return self.knn
        return replace(self.knn, lam=self.lam_on_store.chosen(self))

    def predict(self, texts: Sequence[TextInput], *, progress: bool = False) -> list[Prediction]:
        """The predictions for `texts`. Texts the encoder tokenized already (`encoder.tokenize`: a server
        sizes its batches by them) are not tokenized again."""
        return self.explain(self.embed(texts, progress=progress))

    def explain(self, embeddings: Embeddings) -> list[Prediction]:
        """The predictions, with their neighbours, that these embeddings score to.

        The arrays become Python lists once for the whole batch: indexing a NumPy array element by
        element, for 16 neighbours and every label of every text, was the largest Python cost of a
        served batch after the forward itself (docs/benchmarks.md)."""
        scores = self.score(embeddings)
        names = self.labels
        best = np.argmax(scores.probabilities, axis=1).tolist()
        probabilities, p_lm, p_knn = (
            rows.tolist() for rows in (scores.probabilities, scores.p_lm, scores.p_knn)
        )
        found: list[list[tuple[int, int, float]]] = [[] for _ in best]
        if scores.hits is not None:
            hits = scores.hits
            for row, ids, labels, similarities in zip(
                found, hits.ids.tolist(), hits.labels.tolist(), hits.similarities.tolist(), strict=True
            ):
                row.extend(
                    (n, lab, sim) for n, lab, sim in zip(ids, labels, similarities, strict=True) if n >= 0
                )
        truncated = np.asarray(embeddings.truncated, dtype=bool).tolist()
        floor = self.min_similarity
        return [
            Prediction(
                label=names[best[i]],
                probabilities=dict(zip(names, probabilities[i], strict=True)),
                p_lm=dict(zip(names, p_lm[i], strict=True)),
                p_knn=dict(zip(names, p_knn[i], strict=True)) if found[i] else None,
                neighbours=tuple(Neighbour(n, names[lab], sim) for n, lab, sim in found[i]),
                truncated=truncated[i],
                out_of_scope=floor is not None and bool(found[i]) and found[i][0][2] < floor,
            )
            for i in range(len(best))
        ]

    def add_examples(
        self, texts: Sequence[TextInput], labels: Sequence[str], ids: Sequence[int] | np.ndarray | None = None
    ) -> np.ndarray:
        """Embed labelled examples into the store (an existing id is replaced). Returns their ids.

        Where lambda is chosen on the stored examples (`knn.lam` None), the forward that gives their keys
        scores their labels too, kept for choosing it: the store and lambda are level once this returns
        (a pass over the label words' tree where `scores_words_by_tree`, which a caller that cannot wait
        spares itself with `add_embeddings` of `embed_vectors` and `LambdaOnStore.missing`)."""
        if len(texts) != len(labels):
            raise PromptError("texts and labels must have the same length")
        self.label_indices(labels)  # unknown labels fail before the forward passes
        if self.knn.lam is None:
            embedded = self.embed(texts, vectors_only=True)
            return self.add_embeddings(embedded, labels, ids, texts=texts, lm_log_probs=embedded.lm_log_probs)
        return self.add_embeddings(self.embed_vectors(texts), labels, ids, texts=texts)

    def add_embeddings(
        self,
        embeddings: Embeddings | SlotVectors,
        labels: Sequence[str],
        ids: Sequence[int] | np.ndarray | None = None,
        *,
        texts: Sequence[TextInput] | None = None,  # kept with the entries, for textual demonstrations
        lm_log_probs: np.ndarray | None = None,  # (N, C) the plain prompt's label scores, for lambda
    ) -> np.ndarray:
        """Put already-embedded examples into the store. Returns their ids (new ones follow the largest).

        Where lambda is chosen on the stored examples, `lm_log_probs` are their label scores as the plain
        prompt gives them (`embed(vectors_only=True)`; not the demonstration pass's); without them, they are
        `lam_on_store.missing` until scored, and need `texts`."""
        lengths = {len(embeddings.vectors), *(len(x) for x in (ids, texts) if x is not None)}
        if lengths != {len(labels)}:
            raise PromptError("embeddings, labels, ids and texts must have the same length")
        label_ids = self.label_indices(labels)
        if ids is None:
            first = int(self.store.ids().max()) + 1 if len(self.store) else 0
            ids = np.arange(first, first + len(labels), dtype=np.int64)
        ids = np.asarray(ids, dtype=np.int64)
        self.store.add(ids, embeddings.vectors, label_ids, texts)
        if self.knn.lam is None:
            self.lam_on_store.stored(self.store, ids, lm_log_probs)
        return ids

    def score_unscored(self) -> None:
        """Score, here, the stored examples whose label scores lambda lacks (`lam_on_store.missing`): the
        store and lambda are level once it returns."""
        ids, texts = self.lam_on_store.missing(self.store)
        if len(ids):
            self.lam_on_store.keep(self.store, ids, texts, self.embed(texts, vectors_only=True).lm_log_probs)

    def remove_examples(self, ids: Sequence[int] | np.ndarray) -> int:
        """Take examples out of the store (unknown ids are ignored); returns how many were stored."""
        removed = self.store.remove(ids)
        self.lam_on_store.removed(np.asarray(ids, dtype=np.int64))
        return removed


def _length(text: TextInput) -> int:
    return len(text) if isinstance(text, str) else sum(len(part) for part in text)
