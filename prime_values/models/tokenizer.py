"""Character-level tokenizer for the embedded tiny models.

One id per character of printable ASCII plus ``"\\n"``, and four special tokens. It is a standard
``tokenizers`` model wrapped in :class:`transformers.PreTrainedTokenizerFast`, so ``save_pretrained``
writes a ``tokenizer.json`` that ``AutoTokenizer.from_pretrained(dir)`` (and vLLM) reload offline.

Conventions:
- ``encode(text)`` never adds special tokens (there is no post-processor): callers append
  ``eos_token_id`` / prepend ``bos_token_id`` explicitly where they want them.
- ``decode(ids, skip_special_tokens=True)`` returns the exact characters (a ``Fuse`` decoder joins
  tokens without spaces; no normaliser, no clean-up of spaces).
- Characters outside the alphabet map to ``<unk>``.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK)  # ids 0, 1, 2, 3
# printable ASCII (space .. ~) plus newline: 96 characters
ALPHABET = tuple(chr(c) for c in range(32, 127)) + ("\n",)


def char_vocab() -> dict[str, int]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in ALPHABET:
        vocab[ch] = len(vocab)
    return vocab


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A 100-token character tokenizer: ``<pad>=0, <eos>=1, <bos>=2, <unk>=3``, then the characters."""
    assert set(string.printable) - set("\t\r\x0b\x0c") <= set(ALPHABET)
    tok = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK))
    # every character (newline included) is its own pre-token; nothing is dropped
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        padding_side="right",
        model_max_length=1 << 20,
    )


def ensure_pad_token(tokenizer):
    """Give a tokenizer without a pad token one (in place; returned): its unk token where that is not the EOS, else
    the EOS itself. Either is safe here: every mask in the project goes by length (`policy_mask`, the SFT labels),
    never by ``ids != pad``, so an EOS the policy must learn to emit is trained even when pad = eos
    (tests/models/test_real_model.py); a distinct pad only keeps the two apart for readers of raw ids."""
    if tokenizer.pad_token_id is None:
        unk = tokenizer.unk_token
        tokenizer.pad_token = unk if unk is not None and tokenizer.unk_token_id != tokenizer.eos_token_id \
            else tokenizer.eos_token
    return tokenizer
