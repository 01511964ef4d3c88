"""Decoding a source's text in its encoding (``source.encoding``) without making up a character.

Spark's readers decode with a replacement: bytes that are not valid in the encoding become U+FFFD,
so two keys that differ only in such bytes would become one. Instead, text is read as ISO-8859-1,
which maps every byte to one character (U+0000..U+00FF), so no byte is lost, and is then decoded
here, with SQL functions, value by value:

* UTF-8: a value with a non-ASCII character is turned back into its bytes (``encode`` as ISO-8859-1)
  and those are taken as UTF-8 when ``is_valid_utf8`` says they are; else the value is undecodable.
* A single-byte encoding (``config.encoding_bytes``): each byte 0x80..0xFF is ``translate``d to its
  character; a value holding a byte the encoding leaves undefined is undecodable.

An undecodable value makes its record a bad record (``invalid_encoding``); its raw record is kept as
read, as ISO-8859-1, so its exact bytes are the ISO-8859-1 encoding of that text. A U+FFFD that the
source did send (valid UTF-8 bytes EF BF BD) is an ordinary character.

This works for encodings that keep ASCII as is: the readers split records and fields on ASCII bytes
(separators, quotes, line ends), which are the same bytes in every such encoding.
"""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F

from cdc_assets.model.config import encoding_bytes

# The encoding text is read with: one character per byte, every byte valid.
LOSSLESS = "ISO-8859-1"
INVALID_ENCODING = "invalid_encoding"
_UTF8_BOM = "\u00ef\u00bb\u00bf"  # a UTF-8 byte order mark, read as ISO-8859-1


class SourceEncoding:
    """How values read as ISO-8859-1 are decoded from the source's encoding ``name``.

    Decoding takes two projections: :meth:`prepared` (from the text as read) and then :meth:`decoded`
    and :meth:`undecodable` (from the text and the prepared column), so that nothing is computed twice.
    """

    def __init__(self, name: str):
        self.name = name
        self._bytes = encoding_bytes(name)  # None for UTF-8

    @property
    def is_utf8(self) -> bool:
        return self._bytes is None

    @property
    def is_lossless(self) -> bool:
        """Whether text read as ISO-8859-1 already is the decoded text (nothing to do)."""
        return self._bytes is not None and all(character == chr(0x80 + index) for index, character in enumerate(self._bytes))

    def prepared(self, text: SparkColumn) -> SparkColumn | None:
        """UTF-8: the value's bytes, as a string that is not checked, when the value has a non-ASCII
        character (NULL otherwise: ASCII is ASCII in UTF-8); None for other encodings."""
        if not self.is_utf8:
            return None
        # As read, a non-ASCII character takes two bytes in Spark's strings: octet_length tells it cheaply.
        return F.when(F.octet_length(text) != F.length(text), F.encode(text, LOSSLESS).cast("string"))

    def undecodable(self, text: SparkColumn, prepared: SparkColumn | None) -> SparkColumn:
        """Whether the value has bytes that are not valid in the encoding (false for NULL)."""
        if self._bytes is None:  # UTF-8
            return F.coalesce(~F.is_valid_utf8(_utf8_prepared(prepared)), F.lit(False))
        undefined = [chr(0x80 + index) for index, character in enumerate(self._bytes) if character == ""]
        if not undefined:
            return F.lit(False)
        return F.coalesce(text.rlike("[" + "".join(undefined) + "]"), F.lit(False))

    def decoded(self, text: SparkColumn, prepared: SparkColumn | None) -> SparkColumn:
        """The value in the encoding; meaningless where :meth:`undecodable` holds."""
        if self._bytes is None:  # UTF-8
            return F.coalesce(_utf8_prepared(prepared), text)
        if self.is_lossless:
            return text
        pairs = [(chr(0x80 + index), character) for index, character in enumerate(self._bytes) if character != chr(0x80 + index)]
        defined = [(byte, character) for byte, character in pairs if character]
        return F.translate(text, "".join(byte for byte, _ in defined), "".join(character for _, character in defined))

    def without_byte_order_mark(self, text: SparkColumn) -> SparkColumn:
        """UTF-8: ``text`` without a leading byte order mark (Spark's own UTF-8 reading drops it)."""
        if not self.is_utf8:
            return text
        return F.when(text.startswith(_UTF8_BOM), F.substring(text, len(_UTF8_BOM) + 1, 1 << 30)).otherwise(text)

    def name_as_read(self, name: str) -> str:
        """A header name read as ISO-8859-1, decoded (as it is left when it does not decode)."""
        if self.is_utf8 and name.startswith(_UTF8_BOM):
            name = name[len(_UTF8_BOM):]
        try:
            return name.encode(LOSSLESS).decode("utf-8" if self.is_utf8 else self.name)
        except (UnicodeEncodeError, UnicodeDecodeError):
            return name

    def option_as_read(self, value: str) -> str:
        """A reader option's text (a separator, a null value...) as it reads in ISO-8859-1: its bytes
        in the encoding, one character each."""
        return value.encode("utf-8" if self.is_utf8 else self.name).decode(LOSSLESS)


def reason(what: str, encoding: SourceEncoding) -> str:
    return f"{INVALID_ENCODING}: {what} has bytes that are not valid {encoding.name} (raw_record: its bytes as {LOSSLESS})"


def _utf8_prepared(prepared: SparkColumn | None) -> SparkColumn:
    """UTF-8 text is checked and decoded from what :meth:`SourceEncoding.prepared` made of it."""
    if prepared is None:
        raise ValueError("a UTF-8 value is read through SourceEncoding.prepared")
    return prepared
