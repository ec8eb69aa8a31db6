"""Where a corpus's stream of documents splits into training and the held-out validation tail
(`cut`), found in one pass over the documents (`survey`), and the pieces on either side (`split`)."""

from array import array

import numpy as np

from jaxtrain.data import chat_format, documents


def survey(docs: documents.Documents, want_chars: bool) -> tuple[np.ndarray, str]:
  """(UTF-8 bytes of each document, the characters of the text if `want_chars`): one pass, again
  if it found a text file binary only past its start (the later passes skip that file whole)."""
  while True:
    sizes, size, seen = array("q"), 0, set()
    for text, end, _ in docs("reading"):
      if not isinstance(text, chat_format.Special):  # a token, not text: no bytes, no characters
        size += len(text.encode("utf-8"))
        if want_chars:
          seen.update(text)
      if end:
        sizes.append(size)
        size = 0
    if not docs.misread:
      break
  return np.frombuffer(sizes, np.int64), "".join(seen)


def cut(sizes: np.ndarray, val_fraction: float) -> tuple[int, int]:
  """Where training ends: (document d, byte offset o in it). The validation split is the
  smallest tail of whole documents holding `val_fraction` of the bytes (o = 0), unless that tail
  would be over twice as large: then the stream is cut inside the document at that byte."""
  total = int(sizes.sum())
  want = val_fraction * total
  tail_bytes = np.cumsum(sizes[::-1])
  k = int(np.searchsorted(tail_bytes, want)) + 1  # the fewest last documents that hold it
  if k < len(sizes) and tail_bytes[k - 1] <= 2 * want:
    return len(sizes) - k, 0
  pos = min(total - 1, max(1, int(total - want)))
  ends = np.cumsum(sizes)
  d = int(np.searchsorted(ends, pos, side="right"))
  return d, pos - (int(ends[d - 1]) if d else 0)


def split(pieces, cut: tuple[int, int]):
  """(text, ends_document, in_training, in_loss) for each piece; the piece at the cut splits in
  two."""
  doc, offset = 0, 0
  for text, end, loss in pieces:
    if doc != cut[0] or cut[1] == 0:
      yield text, end, doc < cut[0], loss
    elif isinstance(text, chat_format.Special):  # no bytes: in training while the cut is ahead
      yield text, end, offset < cut[1], loss
    else:
      raw = text.encode("utf-8")
      if offset + len(raw) <= cut[1]:
        yield text, end, True, loss
      elif offset >= cut[1]:
        yield text, end, False, loss
      else:
        head = raw[:cut[1] - offset].decode("utf-8", errors="ignore")
        yield head, False, True, loss
        yield text[len(head):], end, False, loss
      offset += len(raw)
    if end:
      doc, offset = doc + 1, 0
