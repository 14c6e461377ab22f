"""A tiny BGE-M3 folder with random weights, built offline in a second: what BAAI/bge-m3 ships,
in miniature. An XLM-RoBERTa encoder (2 layers, 32 wide) saved as transformers saves it, a
tokenizer whose ids 0-3 are `<s> <pad> </s> <unk>` (as XLM-RoBERTa's), sentence-transformers'
modules (CLS pooling, then normalisation: BGE-M3's dense path) and the two heads BGE-M3 keeps
beside the weights, `sparse_linear.pt` (hidden -> 1) and `colbert_linear.pt` (hidden ->
hidden), saved in float16 as the real folder's are. Its vectors mean nothing: it exists so
tests and demos can run every BGE-M3 output without the hub (tests/test_bge_m3.py compares
them with FlagEmbedding's own on it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
# A vocabulary big enough for sentences with repeated words (the sparse output keeps each
# token id's largest weight) and an unknown one (its id is dropped there)
_WORDS = (
    "the a an of to in on and is was are for with by at from as it this that what which who "
    "how why where when man woman child dog cat bird fish food bread pasta rice apple water "
    "eating eats ate drinks drinking sleeps sleeping runs running plays playing reads reading "
    "market stock stocks crashed rose fell price prices bank money city paris france berlin "
    "germany capital river mountain sea sky sun moon star rain snow wind tree flower garden "
    "house car train plane road street book page paper pen music song film game ball team "
    "red blue green yellow black white big small old new good bad fast slow hot cold happy sad"
)
WORDS = _WORDS.split()
DIGITS = [str(d) for d in range(10)]  # numbers are split into digits, after the words' ids


@dataclass(frozen=True)
class Shape:
    """The encoder's size: the tiny default, or BAAI/bge-m3's own (REAL: the benchmark's)."""

    hidden: int = 32
    layers: int = 2
    heads: int = 2
    intermediate: int = 64
    max_length: int = 64
    vocab_size: int | None = None  # None: the words' vocabulary; more: filler tokens


REAL = Shape(
    hidden=1024, layers=24, heads=16, intermediate=4096, max_length=8192, vocab_size=250002
)


def build_bge_m3(
    folder: Path, seed: int = 0, shape: Shape = Shape(), words: list[str] = WORDS
) -> Path:
    """Write a BGE-M3 of `shape` with random weights into `folder` (created) and return it:
    the tiny one by default."""
    import torch
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig, XLMRobertaModel

    folder.mkdir(parents=True, exist_ok=True)
    tokens = SPECIALS + [w for w in dict.fromkeys(words) if w not in DIGITS] + DIGITS
    tokens += [f"<extra_{i}>" for i in range((shape.vocab_size or 0) - len(tokens))]
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        cls_token="<s>",
        sep_token="</s>",
        mask_token="<mask>",
        model_max_length=shape.max_length,
    )
    fast.save_pretrained(folder)
    torch.manual_seed(seed)
    config = XLMRobertaConfig(
        vocab_size=len(vocab),
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.max_length + 2,  # positions start after the pad id
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    XLMRobertaModel(config).eval().save_pretrained(folder)
    sparse = torch.nn.Linear(shape.hidden, 1)
    colbert = torch.nn.Linear(shape.hidden, shape.hidden)
    torch.save({k: v.half() for k, v in sparse.state_dict().items()}, folder / "sparse_linear.pt")
    torch.save({k: v.half() for k, v in colbert.state_dict().items()}, folder / "colbert_linear.pt")
    _sentence_transformers_modules(folder, shape)
    return folder


def _sentence_transformers_modules(folder: Path, shape: Shape) -> None:
    """BGE-M3's dense path as its folder declares it: the <s> position, normalised."""
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": min(shape.max_length, 8192), "do_lower_case": False})
    )
    pooling = {"word_embedding_dimension": shape.hidden, "pooling_mode_cls_token": True}
    for mode in ("mean_tokens", "max_tokens", "mean_sqrt_len_tokens"):
        pooling[f"pooling_mode_{mode}"] = False
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (folder / "2_Normalize").mkdir(exist_ok=True)
