"""Progress bars that degrade to a silent counter where tqdm is not installed (a bare GPU machine)."""

from __future__ import annotations

from collections.abc import Iterator


class NullBar:
    """Stand-in for tqdm: counts, prints nothing."""

    def __init__(self, *args, total: int | None = None, **kwargs) -> None:
        self.total, self.n = total, 0
        self._iterable = args[0] if args else None

    def __iter__(self) -> Iterator:
        return iter(self._iterable or ())

    def __enter__(self) -> NullBar:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, *args, **kwargs) -> None:
        return None

    def close(self) -> None:
        return None

    @staticmethod
    def write(msg: str, *args, **kwargs) -> None:
        print(msg)


def progress_bar(*args, **kwargs):
    """``tqdm(*args, **kwargs)`` when tqdm is installed, else a ``NullBar``."""
    try:
        from tqdm import tqdm
    except ImportError:
        return NullBar(*args, **kwargs)
    return tqdm(*args, **kwargs)
