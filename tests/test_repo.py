"""Keep .ci/run and the README's test command identical."""

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
