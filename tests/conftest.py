"""Shared fixtures: where the golden data comes from.

Two tiers. With ``../shared`` beside the checkout (or ``BERTPIPE_SHARED`` naming it), tests read the full
reference data there. In a clone without it, ``shared_data`` / ``golden`` are rebuilt from tests/golden (the
real inputs plus the md5 of every reference output; see tests/golden/README.md): bertpipe's own stages remake
the TFRecords, HDF5 files and 4 bins, and each file is kept only if it is the reference's (md5, or HDF5
content where the HDF5 library differs), so the byte-exact tests run unchanged. What the clone tier lacks:
``mlperf_sample`` (its tests fall back on the golden text chain) and the whole shortened dump (``real_dump`` then
gives its first 127 pages). Tests that need what only ../shared holds (the vendors' own scripts and lists in
../shared/reference, which may not be copied into bertpipe) say so with ``@pytest.mark.needs_shared(path, ...)``;
where one of those paths is absent they are taken out of the run and one skip line says how many and why
(``fold_tests_that_need_shared``). ``BERTPIPE_REQUIRE_SHARED=1`` (set by .ci/run) makes a missing ../shared an
error instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERTPIPE_SHARED", ROOT.parent / "shared")).resolve()
SHARED_DATA = SHARED / "data"
GOLDEN = SHARED_DATA / "golden"
CLONE = ROOT / "tests" / "golden"
REQUIRE_SHARED = os.environ.get("BERTPIPE_REQUIRE_SHARED", "") not in ("", "0")
REAL_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("BERTPIPE_PROGRESS", "0")
# library loggers called in-process after another test loaded Prefect: not a flow, nothing to send
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")


def pytest_configure(config: pytest.Config) -> None:
    if REQUIRE_SHARED and not SHARED_DATA.is_dir():
        raise pytest.UsageError(f"BERTPIPE_REQUIRE_SHARED is set but {SHARED_DATA} is absent: put the shared "
                                "reference data beside the checkout (../shared) or point BERTPIPE_SHARED at it")
    config.addinivalue_line("markers", "needs_shared(*paths): the test needs these paths under ../shared (relative "
                            "to it, e.g. 'reference/habana'); where one is absent it is not run, and one skip line "
                            "for all such tests says how many and why (a failure under BERTPIPE_REQUIRE_SHARED)")
    absl_handler_on_the_real_stderr()


#: What ``bertpipe -v`` sets in os.environ for its child processes (bertpipe/cli.py setup_logging): a test that
#: runs the CLI in this process with -v would leave every later test verbose (the launcher then writes no
#: launcher.log), so each test gets them back as they were.
CLI_ENV = ("BERTPIPE_VERBOSE", "BERTPIPE_LOG_EXAMPLES")


@pytest.fixture(autouse=True)
def _cli_env_restored():
    before = {k: os.environ.get(k) for k in CLI_ENV}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.hookimpl(trylast=True)  # after -m / -k: the skip line counts only tests this run would have run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``needs_shared`` whose paths are absent leave the run behind one skip line
    (``fold_tests_that_need_shared``). ``BERTPIPE_TEST_ORDER=reverse`` runs the tests in the reverse order (every
    module's tests stay together): a test that passes only after another one ran (or fails only after it) shows up."""
    fold_tests_that_need_shared(session, config, items)
    if os.environ.get("BERTPIPE_TEST_ORDER", "") == "reverse":
        items.reverse()


def missing_shared(item: pytest.Item) -> list[str]:
    """The paths of ``item``'s ``needs_shared`` marks that are absent under ../shared."""
    want = {p for mark in item.iter_markers("needs_shared") for p in mark.args}
    return sorted(p for p in want if not (SHARED / p).exists())


class SharedAbsent(pytest.Item):
    """Stands for the tests that need what is absent from ../shared: one skip that names them by module."""

    def __init__(self, *, reason: str, **kw) -> None:
        super().__init__(**kw)
        self.reason = reason

    def runtest(self) -> None:
        pytest.skip(self.reason)

    def reportinfo(self):
        return self.path, None, self.name


def fold_tests_that_need_shared(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ../shared (or part of it), the tests marked ``needs_shared`` for an absent path cannot run: they are
    deselected, and one item in their place skips with a line saying how many tests of which modules need what.
    (Under BERTPIPE_REQUIRE_SHARED they stay, and fail in ``pytest_runtest_setup``.)"""
    if REQUIRE_SHARED:
        return
    gone = [item for item in items if missing_shared(item)]
    if not gone:
        return
    missing = sorted({p for item in gone for p in missing_shared(item)})
    modules: dict[str, int] = {}
    for item in gone:
        name = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
        modules[name] = modules.get(name, 0) + 1
    where = f"{SHARED} is absent" if not SHARED.is_dir() else f"{', '.join(missing)} absent from {SHARED}"
    reason = f"{where}: {len(gone)} tests that need it not run (" + ", ".join(f"{m} {n}" for m, n in modules.items()) + ")"
    drop = set(gone)
    items[:] = [item for item in items if item not in drop]
    config.hook.pytest_deselected(items=gone)
    here = Path(__file__)
    items.append(SharedAbsent.from_parent(session, name="needs_shared", path=here,
                                          nodeid=f"{here.relative_to(ROOT).as_posix()}::needs_shared", reason=reason))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if REQUIRE_SHARED and (missing := missing_shared(item)):
        pytest.fail(f"BERTPIPE_REQUIRE_SHARED is set but {', '.join(missing)} absent from {SHARED}", pytrace=False)


def absl_handler_on_the_real_stderr() -> None:
    """Import absl's logging (TensorFlow's) once, on the process's real stderr.

    absl makes its handler when first imported, on the sys.stderr of that moment, and its close() closes that
    stream unless it is the current sys.stderr/stdout. A later ``logging.config.dictConfig`` (Prefect's logging
    set-up in the next flow of the session) closes every handler ever made: imported inside a test (TensorFlow in
    tests/pretrain), absl's stream was pytest's capture file, which then got closed, and tests/flows/test_demo.py
    died after tests/pretrain ("lost sys.stderr", pytest's own "I/O operation on closed file").
    """
    import importlib.util
    import sys

    if "absl.logging" in sys.modules or importlib.util.find_spec("absl") is None:
        return
    captured = sys.stderr
    sys.stderr = sys.__stderr__  # (absl never closes sys.__stderr__)
    try:
        import absl.logging  # noqa: F401
    finally:
        sys.stderr = captured


def _shared_only(what: str) -> None:
    """Skip a test that needs ``what`` from ../shared (fail instead under BERTPIPE_REQUIRE_SHARED)."""
    msg = f"{SHARED_DATA} is absent and the clone tier (tests/golden) has no {what}"
    if REQUIRE_SHARED:
        pytest.fail(msg)
    pytest.skip(msg)


def _clone_data(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bertpipe_golden_build", CLONE / "build.py")
    golden_build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden_build)
    h = hashlib.md5()
    for p in sorted(CLONE.iterdir()):
        if p.is_file() and p.suffix != ".md":
            h.update(p.name.encode() + p.read_bytes())
    cache = getattr(config, "cache", None)  # across sessions under .pytest_cache, where the plugin is on
    base = Path(cache.mkdir("bertpipe-golden")) if cache is not None else tmp_path_factory.getbasetemp()
    here = base / f"clone-{h.hexdigest()[:12]}"
    data = golden_build.materialize(here)
    for old in base.glob("clone-*"):  # trees of an earlier tests/golden (~150 MB each)
        if old != here:
            shutil.rmtree(old, ignore_errors=True)
    return data


@pytest.fixture(scope="session")
def data_tier() -> str:
    """``shared`` (../shared/data) or ``clone`` (rebuilt from tests/golden)."""
    return "shared" if SHARED_DATA.is_dir() else "clone"


@pytest.fixture(scope="session")
def shared_data(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, data_tier: str) -> Path:
    """../shared/data, or in a clone the same layout rebuilt from tests/golden (no mlperf_sample/, and of the
    shortened dump only its first pages: use the ``mlperf_sample`` and ``real_dump`` fixtures for those)."""
    if data_tier == "shared":
        return SHARED_DATA
    return _clone_data(request.config, tmp_path_factory)


@pytest.fixture(scope="session")
def golden(shared_data: Path) -> Path:
    return shared_data / "golden"


@pytest.fixture(scope="session")
def mlperf_sample(data_tier: str) -> Path:
    """../shared/data/mlperf_sample (the full tier only: 4 MB of MLCommons' sample text)."""
    if data_tier != "shared":
        _shared_only("mlperf_sample/ (MLCommons' 4 MB sample text)")
    return SHARED_DATA / "mlperf_sample"


@dataclass(frozen=True)
class RealDump:
    """A real enwiki dump and what bertpipe's extract (wikiextractor 3.1.0) makes of it."""

    path: Path
    articles: int  # extracted articles
    with_text: int  # articles left with text after the text stages (3.1.0 empties list-only articles)
    files: tuple[str, ...]  # extractor files, 1 MiB each at most
    first_line: str  # the start of the training part's first line (num_test_articles=20, seed 12345)
    min_lines: int  # the training part has more non-empty lines than this
    whole: bool  # the whole shortened dump (its ids are those of the golden text chain)


@pytest.fixture(scope="session")
def real_dump(shared_data: Path, data_tier: str) -> RealDump:
    """The shortened enwiki dump (206 pages), or in a clone its first 127 pages (tests/golden/README.md)."""
    if data_tier == "shared":
        return RealDump(shared_data / REAL_DUMP, 106, 105, ("AA/wiki_00", "AA/wiki_01", "AA/wiki_02"),
                        "Autism is a neurodevelopmental disorder", 5000, True)
    return RealDump(shared_data / "enwiki-shortened-first127pages.xml.bz2", 48, 48, ("AA/wiki_00", "AA/wiki_01"),
                    "Autism is a neurodevelopmental disorder", 4000, False)
