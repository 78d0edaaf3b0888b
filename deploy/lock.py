"""Write the images' lock files: every package each role's image installs, at one version.

    python deploy/lock.py            # from the repository root, with network access to PyPI

pip resolves ``.[compiled]`` (the extender image) and ``.[agent]`` (the agent image) as it would in
the image, without installing anything (``pip install --dry-run --ignore-installed
--report``), and this writes the result as ``name==version`` lines to
``deploy/requirements/extender.txt`` and ``agent.txt``; ``stubs.txt`` is the build stage
that generates the device-plugin stubs (``grpcio-tools``, resolved together with the agent's
``grpcio`` and ``protobuf``, so the generated code loads in the runtime). ``deploy/Dockerfile`` installs
exactly those with ``--no-deps``, then gpufrac itself with ``--no-deps``: two builds from
the same lock install the same dependency set, whatever PyPI has published since. Run it
with the images' Python (3.11), since a dependency can differ by Python version; re-run it
to take new versions, and commit the result with the change that needs them.
``tests/deploy/test_deploy.py`` checks the committed files against ``pyproject.toml``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "requirements"
ROLES = {"extender": ".[compiled]", "agent": ".[agent]"}
"""What each image installs (pip's target): the extender with its compiled score functions."""


def resolve(*target: str) -> list[str]:
    """``name==version`` of every package pip would install for ``target`` (pip's arguments),
    gpufrac left out."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", str(report), *target], cwd=ROOT, check=True)
        installs = json.loads(report.read_text())["install"]
    return sorted((f"{i['metadata']['name']}=={i['metadata']['version']}" for i in installs
                   if i["metadata"]["name"] != "gpufrac"), key=str.lower)


def main() -> int:
    if sys.version_info[:2] != (3, 11):
        sys.stderr.write(f"deploy/lock.py: run it with Python 3.11, the images' (this is {sys.version.split()[0]})\n")
        return 2
    OUT.mkdir(exist_ok=True)
    write("extender", resolve(ROLES["extender"]))
    # The agent's grpcio and protobuf are resolved together with grpcio-tools, so the stubs
    # it generates load in the agent (their gencode checks the runtime's versions).
    with tempfile.TemporaryDirectory() as tmp:
        joint = Path(tmp) / "joint.txt"
        joint.write_text("".join(f"{p}\n" for p in resolve(ROLES["agent"], "grpcio-tools")))
        write("agent", resolve(ROLES["agent"], "-c", str(joint)))
        write("stubs", resolve("grpcio-tools", "-c", str(joint)))
    return 0


def write(role: str, pins: list[str]) -> None:
    """``deploy/requirements/<role>.txt``: a header, then one pin a line."""
    what = "stage generating the device-plugin stubs" if role == "stubs" else "image"
    header = (f"# The {role} {what}: its packages (deploy/Dockerfile installs them with --no-deps).\n"
              "# Written by `python deploy/lock.py`; do not edit by hand.\n")
    (OUT / f"{role}.txt").write_text(header + "".join(f"{p}\n" for p in pins))
    sys.stdout.write(f"{OUT / f'{role}.txt'}: {len(pins)} packages\n")


if __name__ == "__main__":
    sys.exit(main())
