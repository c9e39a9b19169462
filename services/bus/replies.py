"""The shapes of Redis replies as this project's clients receive them.

redis-py types a reply as `bytes | str` (or wider), since one method serves clients that decode
replies and clients that do not. No client here sets `decode_responses`, so every reply is bytes:
code that reads one casts it to these shapes where it comes in, and decodes what it needs as text.
"""

from __future__ import annotations

Fields = dict[bytes, bytes]  # a hash, or a stream entry's fields
StreamEntry = tuple[bytes, Fields]  # (entry id, fields)
StreamBatches = list[tuple[bytes, list[StreamEntry]]]  # XREAD, XREADGROUP: (stream key, entries) per stream
