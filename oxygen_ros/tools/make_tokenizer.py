"""Build a small SentencePiece tokenizer (PaliGemma's special ids) for tests and offline demos.

    oxygen-make-tokenizer --out DIR [--vocab-size 512] [--extra-text FILE ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oxygen_ros.engine.small_tokenizer import make_test_tokenizer


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m oxygen_ros.tools.make_tokenizer --out DIR [--vocab-size N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--vocab-size", type=int, default=512, help="total number of pieces (default 512)")
    parser.add_argument("--extra-text", type=Path, nargs="*", default=[], help="text files with extra training lines")
    args = parser.parse_args(argv)
    lines = [line for p in args.extra_text for line in Path(p).read_text(encoding="utf-8").splitlines()]
    print(make_test_tokenizer(args.out, vocab_size=args.vocab_size, extra_text=lines))


if __name__ == "__main__":
    main()
