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
