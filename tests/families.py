"""Tiny, randomly initialised models of the 2026 families, built in a test's temp folder (no
model hub here): saved as their libraries save them, so the server sees the same files a
downloaded checkpoint has. Seeded; a few hundred kilobytes each.

- `qwen3-embed`: a Qwen3Model (decoder, left padding) with last-token pooling, Normalize and
  an instruction prompt for queries (Qwen3-Embedding's shape);
- `qwen3-rerank`: a bare Qwen3ForCausalLM folder (no sentence-transformers files) whose
  tokenizer has "yes" and "no": CrossEncoder reads it as a causal-LM reranker (LogitScore);
- `colbert`: a MultiVectorEncoder (BERT, Dense to 16, punctuation skiplist, Normalize) with
  [Q]/[D] prompts, query expansion to 16 tokens and a document length;
- `modernbert`: a ModernBERT encoder with mean pooling and search_query/search_document
  prompts (gte-modernbert, nomic's shape);
- `gemma3`: a bidirectional Gemma 3 text model with mean pooling, two Dense layers and
  EmbeddingGemma's task prompts, "document" the default.
"""

from __future__ import annotations

import string
from pathlib import Path

WORDS = [
    "yes",
    "no",
    "a",
    "an",
    "the",
    "man",
    "is",
    "eating",
    "food",
    "piece",
    "of",
    "bread",
    "stock",
    "market",
    "crashed",
    "today",
    "what",
    "capital",
    "france",
    "paris",
    "berlin",
    "germany",
    "query",
    "document",
    "instruct",
    "find",
    "passage",
    "sentence",
    "word",
    "title",
    "none",
    "text",
    "task",
    "search",
    "result",
]

QWEN_QUERY_PROMPT = "instruct : find passage \n query : "
GEMMA_PROMPTS = {"query": "task : search result | query : ", "document": "title : none | text : "}
MODERNBERT_PROMPTS = {"query": "search_query: ", "document": "search_document: "}
COLBERT_PROMPTS = {"query": "[Q] ", "document": "[D] "}
QUERY_LENGTH = 16


def word_tokenizer(left: bool) -> object:
    """A word-level tokenizer over WORDS (and numbers, punctuation), ending each input with
    <eos> as decoder embedders' tokenizers do (last-token pooling reads that token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}
    for w in [*WORDS, *map(str, range(50)), *string.punctuation, "\n"]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="$A <eos>", pair="$A $B <eos>", special_tokens=[("<eos>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<eos>",
        padding_side="left" if left else "right",
        model_max_length=128,
    )


def _qwen3_config(vocab: int, architecture: str) -> object:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=2,
        architectures=[architecture],
    )


def build(root: Path, minilm: str) -> dict[str, Path]:
    """Every family's folder under `root`, by name."""
    import torch
    from sentence_transformers import MultiVectorEncoder, SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertModel,
        Gemma3TextConfig,
        Gemma3TextModel,
        ModernBertConfig,
        ModernBertModel,
        Qwen3ForCausalLM,
        Qwen3Model,
    )

    torch.manual_seed(40)
    out: dict[str, Path] = {}
    identity = torch.nn.Identity()

    tok = word_tokenizer(left=True)
    folder = root / "qwen3-embed"
    Qwen3Model(_qwen3_config(len(tok), "Qwen3Model")).save_pretrained(folder)
    tok.save_pretrained(folder)
    SentenceTransformer(
        modules=[Transformer(str(folder)), Pooling(32, "lasttoken"), Normalize()],
        prompts={"query": QWEN_QUERY_PROMPT, "document": ""},
    ).save(str(folder))
    out["qwen3-embed"] = folder

    right = word_tokenizer(left=False)  # CrossEncoder makes a causal LM's padding left itself
    folder = root / "qwen3-rerank"
    Qwen3ForCausalLM(_qwen3_config(len(right), "Qwen3ForCausalLM")).save_pretrained(folder)
    right.save_pretrained(folder)
    out["qwen3-rerank"] = folder

    bert_tok = AutoTokenizer.from_pretrained(minilm)
    small = dict(
        vocab_size=bert_tok.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
    )
    bert = root / "bert-small"
    BertModel(BertConfig(**small)).save_pretrained(bert)
    bert_tok.save_pretrained(bert)
    encoder = Transformer(
        str(bert),
        query_expansion={"strategy": "fixed", "length": QUERY_LENGTH},
        document_length=64,
    )
    MultiVectorEncoder(
        modules=[
            encoder,
            Dense(
                32,
                16,
                bias=False,
                activation_function=identity,
                module_input_name="token_embeddings",
                module_output_name="token_embeddings",
            ),
            MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ],
        prompts=COLBERT_PROMPTS,
    ).save(str(root / "colbert"))
    out["colbert"] = root / "colbert"

    folder = root / "modernbert"
    ModernBertModel(
        ModernBertConfig(
            **small,
            pad_token_id=bert_tok.pad_token_id,
            bos_token_id=bert_tok.cls_token_id,
            eos_token_id=bert_tok.sep_token_id,
            cls_token_id=bert_tok.cls_token_id,
            sep_token_id=bert_tok.sep_token_id,
            global_attn_every_n_layers=2,
            local_attention=16,
        )
    ).save_pretrained(folder)
    bert_tok.save_pretrained(folder)
    SentenceTransformer(
        modules=[Transformer(str(folder)), Pooling(32, "mean"), Normalize()],
        prompts=MODERNBERT_PROMPTS,
    ).save(str(folder))
    out["modernbert"] = folder

    folder = root / "gemma3"
    Gemma3TextModel(
        Gemma3TextConfig(
            **{k: v for k, v in small.items() if k != "max_position_embeddings"},
            max_position_embeddings=128,
            num_key_value_heads=1,
            head_dim=16,
            pad_token_id=bert_tok.pad_token_id,
            sliding_window=16,
            use_bidirectional_attention=True,
        )
    ).save_pretrained(folder)
    bert_tok.save_pretrained(folder)
    SentenceTransformer(
        modules=[
            Transformer(str(folder)),
            Pooling(32, "mean"),
            Dense(32, 64, bias=False, activation_function=identity),
            Dense(64, 32, bias=False, activation_function=identity),
            Normalize(),
        ],
        prompts=GEMMA_PROMPTS,
        default_prompt_name="document",
    ).save(str(folder))
    out["gemma3"] = folder
    return out
