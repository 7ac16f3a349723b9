"""lmlab.native: C kernels built on first use into a cache, or None (the NumPy twin) when they
cannot be built; never an error for the user."""

from __future__ import annotations

import logging
import subprocess

import pytest

from lmlab import native


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty kernel cache in tmp_path, nothing remembered from earlier loads."""
    monkeypatch.setenv("LMLAB_NATIVE_DIR", str(tmp_path))
    monkeypatch.delenv("LMLAB_NATIVE", raising=False)
    native.load.cache_clear()
    yield tmp_path
    native.load.cache_clear()


def needs_compiler():
    if native.compiler() is None:
        pytest.skip("no C compiler on this machine: the NumPy twins are all there is to test")


def test_builds_once_into_the_cache_then_loads_it_without_a_compiler(fresh, monkeypatch):
    needs_compiler()
    library = native.load("dropout")
    assert library is not None and hasattr(library, "lmlab_dropout_forward")
    built = sorted(p.name for p in fresh.iterdir())
    assert len(built) == 1 and built[0].startswith("dropout-") and built[0].endswith(".so")  # no .part left
    native.load.cache_clear()

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled again although the cache holds the library")

    monkeypatch.setattr(subprocess, "Popen", no_compiling)
    assert native.load("dropout") is not None
    assert sorted(p.name for p in fresh.iterdir()) == built


def test_an_edited_kernel_is_built_anew(fresh, tmp_path_factory, monkeypatch):
    needs_compiler()
    sources = tmp_path_factory.mktemp("sources")
    (sources / "answer.c").write_text("int lmlab_answer(void) { return 41; }\n")
    monkeypatch.setattr(native, "SOURCES", sources)
    assert native.load("answer").lmlab_answer() == 41
    (sources / "answer.c").write_text("int lmlab_answer(void) { return 42; }\n")
    native.load.cache_clear()
    assert native.load("answer").lmlab_answer() == 42
    assert len(list(fresh.glob("answer-*.so"))) == 2


def test_a_failed_build_falls_back_is_remembered_and_leaves_no_partial_file(fresh, monkeypatch, caplog,
                                                                            tmp_path_factory):
    needs_compiler()
    sources = tmp_path_factory.mktemp("sources")
    (sources / "broken.c").write_text("this is not C\n")
    monkeypatch.setattr(native, "SOURCES", sources)
    with caplog.at_level(logging.INFO, logger="lmlab.native"):
        assert native.load("broken") is None
    assert "not built" in caplog.text and "using NumPy" in caplog.text
    (marker,) = fresh.iterdir()  # no library, no partial output: only the note of the failure
    assert marker.suffix == ".failed" and "failed" in marker.read_text()
    native.load.cache_clear()

    def no_compiling(*args, **kwargs):
        raise AssertionError("tried again although an earlier build failed")

    monkeypatch.setattr(subprocess, "Popen", no_compiling)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmlab.native"):
        assert native.load("broken") is None
    assert "delete it to try again" in caplog.text


def test_a_hanging_compiler_is_stopped(fresh, monkeypatch, tmp_path_factory):
    bin_dir = tmp_path_factory.mktemp("bin")
    slow = bin_dir / "slowcc"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))
    monkeypatch.setattr(native, "BUILD_TIMEOUT", 0.5)
    assert native.load("dropout") is None
    assert [p.suffix for p in fresh.iterdir()] == [".failed"]


def test_no_home_folder_is_no_error(fresh, monkeypatch):
    """A container user without HOME or a passwd entry: Path.home() raises; dropout must not."""
    needs_compiler()
    monkeypatch.delenv("LMLAB_NATIVE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(native.Path, "home", staticmethod(no_home))
    assert native.load("dropout") is None


def test_a_library_others_may_write_is_not_loaded(fresh, caplog):
    needs_compiler()
    assert native.load("dropout") is not None
    (library,) = fresh.glob("dropout-*.so")
    library.chmod(0o777)
    native.load.cache_clear()
    with caplog.at_level(logging.INFO, logger="lmlab.native"):
        assert native.load("dropout") is None
    assert "may be written by other users" in caplog.text


@pytest.mark.parametrize("setting, reason", [
    ({"CC": "no-such-compiler-anywhere"}, "no C compiler"),
    ({"LMLAB_NATIVE": "0"}, "off"),
])
def test_no_compiler_or_switched_off_means_numpy(fresh, monkeypatch, caplog, setting, reason):
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.INFO, logger="lmlab.native"):
        assert native.load("dropout") is None
    assert reason in caplog.text
    assert list(fresh.iterdir()) == []


def test_cc_may_carry_arguments(monkeypatch):
    monkeypatch.setenv("CC", "env cc")  # like "ccache gcc": the first word must exist
    assert native.compiler() == ["env", "cc"]


def test_a_cc_that_is_not_a_command_line_means_numpy(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", "gcc '-O2")  # an unclosed quote
    with caplog.at_level(logging.INFO, logger="lmlab.native"):
        assert native.load("dropout") is None
    assert "is not a command line" in caplog.text and "fix CC" in caplog.text
