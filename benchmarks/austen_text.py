"""A second English text for benchmarks/auto_size.py, public domain and available offline: one of
Jane Austen's novels from Debian's r-cran-janeaustenr package (Project Gutenberg's texts as R
character vectors, one line each), written as plain UTF-8 text.

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_*.deb austen
    python benchmarks/austen_text.py austen/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb \
        --book=4 --out=pride_and_prejudice.txt

The package keeps its data in R's lazy-load database: each object a 4-byte length and a zlib
stream of R's XDR serialization; the books are character vectors (STRSXP of CHARSXP), in the
order emma, mansfieldpark, northangerabbey, persuasion, prideprejudice, sensesensibility.
"""

import argparse
import struct
import zlib


def objects(rdb: bytes) -> list[bytes]:
  out, pos = [], 0
  while pos < len(rdb):
    d = zlib.decompressobj()
    out.append(d.decompress(rdb[pos + 4:]))
    pos = len(rdb) - len(d.unused_data)  # the next object starts where this stream ended
  return out


def lines(raw: bytes) -> list[str]:
  """The strings of a serialized character vector (XDR format, version 3)."""
  assert raw[:2] == b"X\n", "not R's XDR serialization"
  pos = 14
  native = struct.unpack(">i", raw[pos:pos + 4])[0]  # the native encoding's name, version 3
  pos += 4 + native
  flags, n = struct.unpack(">ii", raw[pos:pos + 8])
  assert flags & 0xFF == 16, "not a character vector"
  pos += 8
  out = []
  for _ in range(n):
    _, size = struct.unpack(">ii", raw[pos:pos + 8])
    pos += 8
    out.append("" if size < 0 else raw[pos:pos + size].decode("utf-8"))
    pos += max(size, 0)
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("rdb", help="janeaustenr/data/Rdata.rdb")
  p.add_argument("--book", type=int, default=4, help="4: Pride and Prejudice")
  p.add_argument("--out", default="pride_and_prejudice.txt")
  args = p.parse_args()
  with open(args.rdb, "rb") as f:
    text = "\n".join(lines(objects(f.read())[args.book])) + "\n"
  with open(args.out, "w", encoding="utf-8") as f:
    f.write(text)
  print(f"wrote {args.out}: {len(text):,} characters")


if __name__ == "__main__":
  main()
