"""The built wheel works on its own, not only the source tree."""

import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_built_wheel_imports_every_subpackage(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True)
    wheel, = (tmp_path / "dist").glob("kvspec-*.whl")
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)
    probe = textwrap.dedent(f"""
        import importlib.resources, kvspec.spec, kvspec.reference, kvspec.conformance, kvspec.adapters
        from kvspec.spec.clauses import load_clauses
        for module in (kvspec.spec, kvspec.reference, kvspec.conformance, kvspec.adapters):
            assert module.__file__.startswith({str(target)!r}), module.__file__
        assert load_clauses(), "the chapters ship with the wheel"
        from kvspec.adapters.reference import ReferenceAllocatorAdapter
        print(ReferenceAllocatorAdapter(8, 8, 2).alloc_extend([0], [3], [-1]))
        # the rendered spec, from the wheel's own sources and the checkout's tests
        from pathlib import Path
        from kvspec.conformance.review.spec_view import write
        written, problems = write(Path("rendered"), Path({str(ROOT / "tests")!r}))
        assert problems == [], problems
        assert "sglang-mutant-no-chunk-release" in written[0].read_text(encoding="utf-8")
        # the vectors tree ships as kvspec.vectors, index and all; the divergence lists find their traces in it
        from kvspec.conformance.runs.tree import TREE, corpus
        from kvspec.adapters.sglang.divergences import KNOWN_DIVERGENCES
        assert str(TREE).startswith({str(target)!r}) and len(corpus(TREE)) > 100
        assert (TREE / "INTERPRETING.md").is_file() and all(d.path.is_file() for d in KNOWN_DIVERGENCES)
    """)
    # -S: no site-packages processing, so the editable install of the source tree is
    # invisible; torch and the other dependencies come from the current environment.
    env = {"PYTHONPATH": f"{target}:{sysconfig.get_paths()['purelib']}:{sysconfig.get_paths()['platlib']}"}
    result = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[2, 3, 4]"
