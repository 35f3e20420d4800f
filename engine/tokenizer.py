"""Byte-level tokenizer: ids 0..255 are the UTF-8 bytes, then BOS and EOS; round-trips any text."""

from __future__ import annotations

import codecs
from collections.abc import Iterable

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


class ByteTokenizer:
    """encode(text) = [BOS] + UTF-8 bytes; decode drops special ids (invalid UTF-8 -> U+FFFD)."""

    bos_id = BOS_ID
    eos_id = EOS_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder()


class StreamDecoder:
    """Incremental decode: holds back an incomplete UTF-8 sequence until its last byte arrives."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Iterable[int]) -> str:
        return self._dec.decode(bytes(i for i in ids if 0 <= i < 256))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
