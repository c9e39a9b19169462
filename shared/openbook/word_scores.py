"""Exact log P(w1..wL | prompt) of every label word of a causal LM, in one pass whatever the label count.

    log P(w1..wL | x) = log p(w1 | x) + sum_{t>=2} log p(w_t | x, w_<t)

The first factor is read at the slot with every label's. The others need the model run on the words'
tokens after the prompt. One call per label (teacher-forcing its tail on the prompt's KV cache) costs
one model call per multi-token label, 111 of them for the clinc150 intent names on Gemma 3.

Here the labels' words are laid out as a token tree (`WordTree`): each distinct proper prefix
w1..wd (d >= 1) of a word is one node, fed as its last token wd, so labels that share a prefix feed it
once ("book flight" and "book hotel" share " book"). All nodes go in one call over the prompt's cache,
with a 4D attention mask that lets node i see the prompt (its padding still masked) and the nodes on
its own path from the root, itself included, at position id `last prompt position + depth`: each node
then reads exactly what it would read at the end of prompt + w1..wd, so its output is
p(. | x, w1..wd) for every label below it. Chosen over expanding the cache once per label (labels x
rows copies of the prompt's keys, chunked to fit memory): the tree feeds each shared prefix once,
needs one call, and copies no cache.

Sliding-window layers (Gemma 3) get a mask of their own, as the model builds for itself: node i sits
at cache index K + depth - 1 (K: the prompt's length in the cache, padding included) and sees only
indices within the window; a sliding layer's cache that has already dropped the oldest prompt keys
gives its kept span (`Cache.get_mask_sizes`), and the mask covers that span only. Models whose
config lists `layer_types` take one mask per type as a dict (Gemma 3, as its own forward does);
others take the 4D tensor, which transformers uses as given.

A tree of N nodes costs an (N, N) path table and (rows, N, prompt + N) masks, so a label set whose
words have more than MAX_TREE_NODES distinct prefixes (a thousand labels of long words) is split into
several trees, words sharing a first token kept together where they fit; each tree's pass runs on its
own fork of the prompt's cache (`_fork`), so the passes never see each other's nodes. Memory stays
bounded whatever the labels, at one more call per tree.

The LM head runs only where a score is read: at each node, over the whole vocabulary in chunks of
rows (the normaliser needs every logit; a chunk bounds the (rows, V) logits held at once, and under
autograd each chunk is recomputed in the backward pass rather than kept).

The pass still runs the body on every node and the full-vocabulary normaliser at each, so on a CPU
150 multi-token labels cost several times two labels (docs: `openbook bench labels`). The cheap
alternative, the default above 16 labels (`resolve_label_scoring`, `Classifier.label_scoring`), is
DART's idea of label vectors in the slot's space (Zhang et al., ICLR 2022):

    P_LM(c | x) = softmax_c(h · v_c + b_c)

with h the LM head's input at the slot and v_c the mean of the head's rows of the word's tokens (b_c
the mean of their biases), as `soft_prompts.word_output_embedding` starts DART's trainable label
vectors. The mean, not the first token's row: words that share their first token ("book flight",
"book hotel") would otherwise score alike. For a one-token word h · v_c is its logit, so the
distribution over single-token labels is the exact one; for longer words it is an approximation
(the tokens' logits at the slot, averaged, instead of their conditional probabilities). It costs one
(B, H) x (H, C) product, and neither the head's vocabulary nor the tree pass runs.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

LabelScoring = Literal["exact", "vectors"]  # what `Backbone.forward` scores labels with (see above)
# What a task asks for: "auto" is exact scoring up to VECTORS_ABOVE labels and label vectors above that
# (docs/decisions.md, "Many labels": chosen on clinc150's dev sets by a rule written before its grids ran).
LabelScoringChoice = Literal["auto", "exact", "vectors"]
VECTORS_ABOVE = 16  # the most classes one row's demonstrations show (`DemoConfig.classes`)
LOGIT_BUDGET = 1 << 26  # logits (float32: 256 MiB) one chunk of the head's full-vocabulary pass may hold
MAX_TREE_NODES = 512  # nodes one pass feeds: bounds its (N, N) path table and (rows, N, K + N) masks


def resolve_label_scoring(choice: LabelScoringChoice, labels: int) -> LabelScoring:
    """The scoring `choice` gives a task of `labels` labels ("auto": label vectors above VECTORS_ABOVE)."""
    if choice == "auto":
        return "vectors" if labels > VECTORS_ABOVE else "exact"
    if choice not in get_args(LabelScoring):
        raise ValueError(
            f"label scoring must be one of {', '.join(get_args(LabelScoringChoice))}, got {choice!r}"
        )
    return choice


@dataclass(frozen=True)
class WordTree:
    """Proper prefixes of some label words as a token tree: the nodes one pass feeds, and where each word's
    factors are read. N nodes; E = sum over its words of (length - 1) factors after the first."""

    tokens: torch.Tensor  # (N,) each node's last token, the one fed
    depth: torch.Tensor  # (N,) its prefix length: 1 for a word's first token
    on_path: torch.Tensor  # (N, N) bool: [i, j] node j is node i or one of its ancestors
    children: torch.Tensor  # (N, M) tokens scored at each node's output, padded with 0
    edge_node: torch.Tensor  # (E,) the node whose output scores a factor
    edge_child: torch.Tensor  # (E,) which of that node's children it is
    edge_label: torch.Tensor  # (E,) the label (in the whole label set) whose word the factor belongs to

    def to(self, device: torch.device) -> WordTree:
        return WordTree(*(getattr(self, name).to(device) for name in self.__dataclass_fields__))


@dataclass(frozen=True)
class LabelWords:
    """Every label word's first token, read at the slot, and its tails' prefixes as trees of at most
    MAX_TREE_NODES nodes each (a word longer than that alone in its own); no tree when every word is
    one token."""

    first: torch.Tensor  # (C,)
    trees: tuple[WordTree, ...]

    @property
    def has_tails(self) -> bool:
        return bool(self.trees)

    def to(self, device: torch.device) -> LabelWords:
        return LabelWords(self.first.to(device), tuple(tree.to(device) for tree in self.trees))


def word_tree(label_token_ids: Sequence[Sequence[int]]) -> LabelWords:
    """The trees of `label_token_ids` (one token list per label), built once per label set."""
    # Kept across calls, so never built as inference tensors, which a later training step cannot read.
    with torch.inference_mode(False):
        return _label_words(tuple(tuple(ids) for ids in label_token_ids), MAX_TREE_NODES)


@functools.lru_cache(maxsize=64)
def _label_words(words: tuple[tuple[int, ...], ...], max_nodes: int) -> LabelWords:
    if any(len(ids) == 0 for ids in words):
        raise ValueError("a label word has no tokens")
    groups: list[list[int]] = []  # labels per tree, in token order so that shared prefixes sit together
    prefixes: set[tuple[int, ...]] = set()
    for label in sorted((i for i, ids in enumerate(words) if len(ids) > 1), key=words.__getitem__):
        ids = words[label]
        new = {ids[:depth] for depth in range(1, len(ids))} - prefixes
        if not groups or len(prefixes) + len(new) > max_nodes:
            groups.append([])
            prefixes = {ids[:depth] for depth in range(1, len(ids))}
        else:
            prefixes |= new
        groups[-1].append(label)
    return LabelWords(
        first=torch.tensor([ids[0] for ids in words], dtype=torch.long),
        trees=tuple(_word_tree(words, group) for group in groups),
    )


def _word_tree(words: tuple[tuple[int, ...], ...], labels: list[int]) -> WordTree:
    nodes: dict[tuple[int, ...], int] = {}
    parents: list[int] = []
    children: list[list[int]] = []
    edges: list[tuple[int, int, int]] = []  # (node, child slot, label)
    for label in labels:
        ids = words[label]
        for depth in range(1, len(ids)):
            prefix = ids[:depth]
            if prefix not in nodes:  # a prefix's parent was met before it: parents precede children
                nodes[prefix] = len(nodes)
                parents.append(nodes[prefix[:-1]] if depth > 1 else -1)
                children.append([])
            node, child = nodes[prefix], ids[depth]
            if child not in children[node]:
                children[node].append(child)
            edges.append((node, children[node].index(child), label))
    count = len(nodes)
    on_path = torch.eye(count, dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            on_path[node] |= on_path[parent]
    width = max((len(c) for c in children), default=0)
    padded = [c + [0] * (width - len(c)) for c in children]
    edge = torch.tensor(edges, dtype=torch.long).reshape(-1, 3)
    return WordTree(
        tokens=torch.tensor([prefix[-1] for prefix in nodes], dtype=torch.long),
        depth=torch.tensor([len(prefix) for prefix in nodes], dtype=torch.long),
        on_path=on_path,
        children=torch.tensor(padded, dtype=torch.long).reshape(count, width),
        edge_node=edge[:, 0],
        edge_child=edge[:, 1],
        edge_label=edge[:, 2],
    )


def word_log_probs(
    model: Any,
    words: LabelWords,
    slot_log_probs: torch.Tensor,
    cache: Any,
    context_mask: torch.Tensor,
    last_position: torch.Tensor,
) -> torch.Tensor:
    """(B, C) log P(word | prompt) per label, from the prompt's pass and one pass per tree of `words`.

    `model` is the causal LM (`base_model` runs the body, its output embeddings the head); the prompt's
    pass left `slot_log_probs` (B, V) at the slot and its KV `cache`; `context_mask` (B, K) is the
    attention mask the cache was built under (prefix tokens included) and `last_position` (B,) the
    position id of the slot.
    """
    words = words.to(slot_log_probs.device)
    scores = slot_log_probs[:, words.first]  # (B, C)
    for i, tree in enumerate(words.trees):
        last = i == len(words.trees) - 1  # the last pass may extend the prompt's own cache
        factors = _tree_factors(model, tree, cache if last else _fork(cache), context_mask, last_position)
        scores = scores.index_add(1, tree.edge_label, factors)
    return scores


def _tree_factors(
    model: Any, tree: WordTree, cache: Any, context_mask: torch.Tensor, last_position: torch.Tensor
) -> torch.Tensor:
    """(B, E) log p(w_d+1 | x, w1..wd) for every factor of `tree`, from one call over its nodes."""
    rows, count = len(context_mask), len(tree.tokens)
    dtype = model.get_input_embeddings().weight.dtype
    out = model.base_model(
        input_ids=tree.tokens.expand(rows, count),
        attention_mask=tail_attention_masks(model.config, cache, context_mask, tree, dtype),
        position_ids=last_position[:, None] + tree.depth,  # (B, N)
        past_key_values=cache,
        use_cache=True,
    )
    hidden = out.last_hidden_state.reshape(rows * count, -1)  # (B*N, H) the head's input at each node
    children = tree.children.repeat(rows, 1)  # (B*N, M)
    vocabulary = model.get_output_embeddings().weight.shape[0]
    child_log_probs = _children_log_probs(model, hidden, children, vocabulary).view(
        rows, count, -1
    )  # (B, N, M)
    return child_log_probs[:, tree.edge_node, tree.edge_child]  # (B, E)


def _fork(cache: Any) -> Any:
    """A cache to run a pass on that leaves `cache` as it was. A dynamic cache's layers rebind their
    key and value tensors on update (a concatenation, never a write into them), so copying the layer
    objects suffices; any other cache is copied whole."""
    from transformers.cache_utils import DynamicLayer

    if not all(isinstance(layer, DynamicLayer) for layer in getattr(cache, "layers", [None])):
        return copy.deepcopy(cache)
    fork = copy.copy(cache)
    fork.layers = [copy.copy(layer) for layer in cache.layers]
    return fork


def tail_attention_masks(
    config: Any, cache: Any, context_mask: torch.Tensor, tree: WordTree, dtype: torch.dtype
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The additive (B, 1, N, kv) masks of the nodes' pass: a tensor, or one per layer type."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return _tail_mask(cache, 0, None, context_mask, tree, dtype)
    masks = {}
    for kind in dict.fromkeys(layer_types):
        if kind == "full_attention":
            window = None
        elif kind == "sliding_attention":
            window = int(config.sliding_window)
        else:
            raise ValueError(f"multi-token label words: no tree mask for {kind!r} layers")
        masks[kind] = _tail_mask(cache, layer_types.index(kind), window, context_mask, tree, dtype)
    return masks


def _tail_mask(
    cache: Any,
    layer: int,
    window: int | None,
    context_mask: torch.Tensor,
    tree: WordTree,
    dtype: torch.dtype,
) -> torch.Tensor:
    count, (rows, context) = len(tree.tokens), context_mask.shape
    kv_length, kv_offset = cache.get_mask_sizes(count, layer)
    kept = torch.arange(kv_offset, kv_offset + kv_length - count, device=context_mask.device)  # (K',)
    allowed = context_mask[:, kept].bool()[:, None, :].expand(rows, count, -1)  # (B, N, K')
    on_path = tree.on_path
    if window is not None:  # as the model's own sliding mask: key index > query index - window
        query = context + tree.depth - 1  # (N,) the cache index a node has on its word's own path
        allowed = allowed & (kept[None, :] > query[:, None] - window)[None]
        on_path = on_path & (tree.depth[:, None] - tree.depth[None, :] < window)
    allowed = torch.cat([allowed, on_path.expand(rows, -1, -1)], dim=-1)  # (B, N, K' + N)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]  # (B, 1, N, K' + N)


def _children_log_probs(
    model: Any, hidden: torch.Tensor, children: torch.Tensor, vocabulary: int
) -> torch.Tensor:
    """(R, M) log p(child | node) from the nodes' head inputs (R, H): full-vocabulary log-softmax in
    chunks of rows, only the children's entries kept."""
    head: nn.Module = model.get_output_embeddings()
    step = max(1, LOGIT_BUDGET // vocabulary)
    softcap = getattr(model.config, "final_logit_softcapping", None)

    def chunk_log_probs(states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        logits = head(states).float()  # (r, V)
        if softcap is not None:  # Gemma 2's: what the CausalLM's forward applies after its head
            logits = torch.tanh(logits / softcap) * softcap
        return F.log_softmax(logits, dim=-1).gather(1, tokens)

    parts = []
    for start in range(0, len(hidden), step):
        states, tokens = hidden[start : start + step], children[start : start + step]
        if torch.is_grad_enabled() and states.requires_grad:
            parts.append(checkpoint(chunk_log_probs, states, tokens, use_reentrant=False))
        else:
            parts.append(chunk_log_probs(states, tokens))
    return torch.cat(parts)


def label_vector_log_probs(
    head: nn.Module, label_token_ids: Sequence[Sequence[int]], features: torch.Tensor
) -> torch.Tensor:
    """(B, C) log-softmax over the labels of h · v_c + b_c, from (B, H) head inputs at the slot."""
    weight = head.weight  # (V, H)
    assert isinstance(weight, torch.Tensor)
    device, count = weight.device, len(label_token_ids)
    lengths = torch.tensor([len(ids) for ids in label_token_ids], device=device)  # (C,)
    tokens = torch.tensor([t for ids in label_token_ids for t in ids], device=device)  # (sum L,)
    owner = torch.repeat_interleave(torch.arange(count, device=device), lengths)  # (sum L,) its label

    def mean_per_label(values: torch.Tensor) -> torch.Tensor:  # (sum L, ...) -> (C, ...)
        sums = values.new_zeros((count, *values.shape[1:])).index_add(0, owner, values)
        return sums / lengths.view(-1, *[1] * (values.dim() - 1))

    logits = features.float() @ mean_per_label(weight[tokens].float()).T  # (B, C)
    bias = getattr(head, "bias", None)
    if bias is not None:
        logits = logits + mean_per_label(bias[tokens].float())
    return F.log_softmax(logits.float(), dim=-1)  # float32 under autocast too, whose product is bfloat16
