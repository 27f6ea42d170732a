"""The build hook that bakes the source revision into the package (pyproject.toml holds the
rest of the build).

The wheel's `pg_advisory_exporter/_build.py` names the revision it was built from: `VCS_REF`
where the builder gives it (the image's build argument: the Dockerfile's build context has
no .git), else the checkout's (exporter/revision.py, loaded by its path: the package is not
installed yet). The sdist carries the file too, since a wheel built from an sdist (as
`python -m build` does) has no checkout to read. Neither file is in the source tree: the
revision is a fact of a build, and git would see a committed one go stale at once. An
editable install gets none: it reads its checkout as the code runs.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
# Where the file goes in the source layout (the sdist) and in the package (the wheel).
SOURCE_FILE = Path("exporter", "_build.py")
PACKAGE_FILE = Path("pg_advisory_exporter", "_build.py")


def _revision() -> str | None:
    if os.environ.get("VCS_REF"):
        return os.environ["VCS_REF"]
    spec = importlib.util.spec_from_file_location("revision", ROOT / "exporter" / "revision.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: str | None = module.from_checkout(ROOT)
    return found


def _write(path: Path, revision: str) -> None:
    path.write_text(
        f'"""Written by setup.py\'s build hook: the revision this build is of."""\n\n'
        f"REVISION = {revision!r}\n"
    )


class BuildPy(build_py):
    def run(self) -> None:
        super().run()  # copies exporter/_build.py where an sdist has it
        if self.editable_mode:
            return
        target = Path(self.build_lib) / PACKAGE_FILE
        revision = _revision()
        if revision:
            _write(target, revision)
        elif not (ROOT / SOURCE_FILE).exists():
            target.unlink(missing_ok=True)  # an earlier build's, left in build/lib


class Sdist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        revision = _revision()
        if revision:
            _write(Path(base_dir) / SOURCE_FILE, revision)


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
