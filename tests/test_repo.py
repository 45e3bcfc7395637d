"""Repository checks: .ci/run and the README's test command identical; the docs' links resolve."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_cmds = [b.strip() for b in blocks if "pytest" in b]
    assert len(test_cmds) == 1, "README must have exactly one bash block with the test command"
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmds[0] in ci.splitlines(), ".ci/run must run the README's test command verbatim"


def test_relative_links_in_the_docs_exist():
    """Every relative link in the README and docs/*.md points at a file or folder of the repository
    (logs and plots named as a run's record must have been committed)."""
    root = ROOT
    missing = []
    for md in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (md.parent / target).exists():
                missing.append(f"{md.relative_to(root)}: {target}")
    assert not missing, missing


def test_readme_quickstart_runs_as_written():
    """The README's Quickstart block runs unchanged in a fresh interpreter (tiled CPU path without a
    GPU, the kernels with one) and prints nothing on stderr but warnings."""
    import os
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)\n```", section, re.S)
    assert len(blocks) == 1, "the Quickstart section must hold exactly one python block"
    code = blocks[0] + "\nprint('quickstart ok', tuple(out.shape))\n"
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "quickstart ok (2, 1000, 8, 64)" in res.stdout, res.stdout
