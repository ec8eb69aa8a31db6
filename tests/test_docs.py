"""The README stays true: CI runs its test command, and its reference (with docs/*.md) lists every
config field."""

from pathlib import Path

from jaxtrain.config.defaults import default_config

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
  readme = (ROOT / "README.md").read_text()
  ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
  command = ci_lines[-1]
  assert "pytest" in command and command.startswith("python3 -m venv .venv")
  assert f"```bash\n{command}\n```" in readme


def test_readme_config_reference_names_every_field():
  readme = "".join(p.read_text() for p in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))])

  def dotted(d, prefix=""):
    for k, v in d.items():
      yield from dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]

  missing = [f for f in dotted(default_config().to_dict()) if f"`{f}`" not in readme]
  assert not missing, f"README config reference lacks {missing}"
