"""llama.cpp's tokenizers ported, over a GGUF file's own vocabulary.

``tokenizer.py`` holds ``Vocab`` and ``Tokenizer`` (special tokens first, then the
vocabulary's model, and the detokenizer); ``spm.py`` is SentencePiece's merge by score,
``bpe.py`` byte-level BPE, ``pretokenizers.py`` the regexes that split text before BPE,
``special_split.py`` the split at special tokens and ``token_texts.py`` the token strings.
"""

from .tokenizer import Tokenizer, Vocab

__all__ = ["Tokenizer", "Vocab"]
