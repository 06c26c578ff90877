"""The rendered spec in a real browser: headless Chromium (Debian's `chromium`, which
.ci/run installs) loads spec.html, every internal link of the page it built resolves,
and a screenshot is kept (in $KVSPEC_ARTIFACTS when set, which .ci/run prints).

Skipped where Chromium is not installed, unless KVSPEC_REQUIRE_CHROMIUM=1 (CI), where
its absence fails."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_spec_view import links_of

from kvspec.spec.clauses import load_clauses

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROOT = Path(__file__).resolve().parent.parent

if CHROMIUM is None and os.environ.get("KVSPEC_REQUIRE_CHROMIUM") != "1":
    pytest.skip("headless Chromium is not installed (apt-get install chromium)", allow_module_level=True)


def chromium(*args: str) -> subprocess.CompletedProcess:
    assert CHROMIUM, "KVSPEC_REQUIRE_CHROMIUM=1 but no chromium on PATH: apt-get install chromium"
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("spec")
    result = subprocess.run(["kvspec", "spec", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return out / "spec.html"


def test_chromium_renders_the_spec_and_every_internal_link_resolves(page):
    result = chromium("--dump-dom", page.as_uri())
    assert result.returncode == 0, result.stderr
    dom = links_of(result.stdout)  # the document as Chromium built it, not as written
    assert set(load_clauses()) <= dom.ids
    assert len(dom.targets) > 2 * len(load_clauses())
    assert set(dom.targets) <= dom.ids, f"links to no element: {sorted(set(dom.targets) - dom.ids)}"
    assert dom.files and all((page.parent / target).is_file() for target in dom.files)  # the cited sources
    assert "<title>kvspec: the specification</title>" in result.stdout


def test_a_screenshot_of_the_rendered_spec_is_kept(page, tmp_path):
    folder = Path(os.environ.get("KVSPEC_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    screenshot = folder / "spec.png"
    screenshot.unlink(missing_ok=True)
    result = chromium("--window-size=1280,1800", f"--screenshot={screenshot}", page.as_uri())
    assert result.returncode == 0, result.stderr
    from PIL import Image  # with matplotlib, in the test extra

    with Image.open(screenshot) as image:
        assert image.size == (1280, 1800)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 50, "the screenshot is (nearly) blank"
    print(f"screenshot of the rendered spec: {screenshot}")
