"""Helpers the benchmark scripts share (they run as `python bench/<script>.py`, so this directory is on sys.path)."""


def parse_context(s):
    """A context length as given on the command line: "32k" -> 32768, "1000" -> 1000."""
    s = s.strip().lower()
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)


def context_label(L):
    """The inverse for tables: 32768 -> "32k", 1000 -> "1000"."""
    return f"{L // 1024}k" if L % 1024 == 0 else str(L)


def visible_pairs(L, window):
    """Causal pairs (i >= j) of one sequence of L tokens, within window (i - j <= window) when window >= 0."""
    if window < 0 or window >= L - 1:
        return L * (L + 1) // 2
    w = window + 1
    return w * (w + 1) // 2 + (L - w) * w
