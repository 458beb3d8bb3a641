"""Check a release as a person adopting it meets it: build the sdist and the wheel, ``twine check --strict`` them,
install the sdist into a fresh virtual environment (pip builds the wheel from it) and run the unpacked sdist's
test suite against that installed copy (the doctests of the installed package too), then the README's demo;
install the wheel alone into a second environment and run ``python -m nvdispatch --help`` and
``nvdispatch.show_config()``. Each step prints the command it runs; the first that fails stops the check
(exit status 1).

The environments fetch their packages from the package index (``--system-site-packages`` reuses this
interpreter's instead: faster, offline for those it has). Torch's CPU build is what the ``[test]`` extra should
find on a machine without a GPU: install ``torch==2.13.0`` from Torch's CPU index into the first environment
before (``--pre-install``), or let pip take the pinned release from the index.

    python tools/release_check.py                               # everything (the suite takes minutes)
    python tools/release_check.py --skip-tests                  # build, check, install, demo
    python tools/release_check.py --upload                      # also: the metadata is ready for an index

CONTRIBUTING.md ("Releasing") lists this among the release steps; tests/release/ checks the file lists."""

from __future__ import annotations

import argparse
import email
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: paths never released: caches, build outputs, compiled files (setuptools' own egg-info is left out apart)
JUNK = re.compile(
    r"(^|/)(__pycache__|\.hypothesis|\.pytest_cache|\.ruff_cache|\.git|build|dist|_build|\.old|\.gpu|\.whl|"
    r"\.benchmarks)(/|$)|\.(pyc|pyo|so|o)$"
)
#: what --upload requires of the metadata's Project-URL entries
UPLOAD_URLS = ("Homepage", "Documentation", "Source", "Issues", "Changelog")


class CheckFailed(Exception):
    """A step of the check failed; the message says which."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=pathlib.Path, help="folder for the artefacts and environments "
                        "(default: a new temporary folder, kept and printed)")  # fmt: skip
    parser.add_argument("--system-site-packages", action="store_true",
                        help="let the environments see this interpreter's packages (not downloaded again)")  # fmt: skip
    parser.add_argument("--extras", default="test", help="the extras the sdist is installed with (default: test)")
    parser.add_argument("--pre-install", default="",
                        help="pip arguments run in the first environment before the sdist, e.g. "
                        "'torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu'")  # fmt: skip
    parser.add_argument("--pytest-args", default="-q -p no:cacheprovider -x",
                        help="options for the suite of the unpacked sdist (default: %(default)s)")  # fmt: skip
    parser.add_argument("--skip-tests", action="store_true", help="build, check, install and run the demo only")
    needs = ", ".join(UPLOAD_URLS)
    parser.add_argument("--upload", action="store_true", help=f"also require the https Project-URLs {needs}")
    return parser


def _run(cmd: list[str], cwd: pathlib.Path | None = None, env: dict | None = None) -> str:
    print(f"$ {shlex.join(map(str, cmd))}" + (f"    (in {cwd})" if cwd else ""), flush=True)
    done = subprocess.run(list(map(str, cmd)), cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise CheckFailed(f"exit status {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def _venv(path: pathlib.Path, system_site: bool) -> pathlib.Path:
    _run([sys.executable, "-m", "venv", *(["--system-site-packages"] if system_site else []), path])
    return path / "bin" / "python"


def _clean_env() -> dict:
    """This environment without what would put a checkout's source first."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NVDISPATCH_PURE_PYTHON")}


def tracked_files(root: pathlib.Path) -> set[str]:
    """The files of ``root`` as its repository tracks them; without git (an unpacked sdist), the files on disk
    less caches, build outputs and setuptools' generated files."""
    if (root / ".git").exists() and shutil.which("git"):
        done = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True)
        if done.returncode == 0:
            return {f for f in done.stdout.split("\0") if f and (root / f).is_file()}
    found = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    return {f for f in found if not JUNK.search(f) and ".egg-info/" not in f and f not in ("PKG-INFO", "setup.cfg")}


def clean_copy(root: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """``root``'s tracked files copied into ``dest``: what is built from it is what the repository holds (a build
    in the tree itself would also take every file an earlier build listed in its egg-info)."""
    for name in tracked_files(root):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)
    return dest


def _check_installed(python: pathlib.Path, version: str, cwd: pathlib.Path, env: dict) -> None:
    """The environment of ``python`` imports the nvdispatch installed into it, of the version built."""
    code = "import nvdispatch, sys; print(nvdispatch.__version__, nvdispatch.__file__, sys.prefix, sep='\\n')"
    got, where, prefix = _run([python, "-c", code], cwd=cwd, env=env).splitlines()
    if got != version or not pathlib.Path(where).is_relative_to(prefix):
        raise CheckFailed(f"{python} imports nvdispatch {got} from {where}, not the {version} installed there")


def build(work: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    dist = work / "dist"
    source = clean_copy(ROOT, work / "source")
    _run([sys.executable, "-m", "build", "--outdir", dist, source], env=_clean_env())
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return sdist, wheel


def metadata(wheel: pathlib.Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(whl.read(name))


def check_upload_urls(meta: email.message.Message) -> None:
    urls = dict(entry.split(", ", 1) for entry in meta.get_all("Project-URL") or [])
    wrong = [f"{label}: {urls.get(label, 'missing')}" for label in UPLOAD_URLS
             if not urls.get(label, "").startswith("https://")]  # fmt: skip
    if wrong:
        raise CheckFailed("Project-URL entries a package index needs as https addresses ([project.urls] in "
                          "pyproject.toml): " + "; ".join(wrong))  # fmt: skip


def check(args: argparse.Namespace) -> None:
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="nvdispatch-release-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}")
    env = _clean_env()

    sdist, wheel = build(work)
    print(_run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel]).strip())
    meta = metadata(wheel)
    if args.upload:
        check_upload_urls(meta)

    python = _venv(work / "venv-sdist", args.system_site_packages)
    if args.pre_install:
        _run([python, "-m", "pip", "install", *shlex.split(args.pre_install)], env=env)
    target = f"{sdist}[{args.extras}]" if args.extras else str(sdist)
    _run([python, "-m", "pip", "install", target], env=env)
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "unpacked", filter="data")
    tree = work / "unpacked" / sdist.name.removesuffix(".tar.gz")
    _check_installed(python, meta["Version"], tree, env)
    if not args.skip_tests:
        pytest = [python, "-m", "pytest", *shlex.split(args.pytest_args)]
        print(_run([*pytest, "tests", "conformance"], cwd=tree, env=env).strip().splitlines()[-1])
        print(_run([*pytest, "--doctest-modules", "--pyargs", "nvdispatch"], cwd=tree, env=env)
              .strip().splitlines()[-1])  # fmt: skip
    print(_run([python, "-m", "nvdispatch"], cwd=work, env=env).strip().splitlines()[-1])

    python = _venv(work / "venv-wheel", args.system_site_packages)
    _run([python, "-m", "pip", "install", wheel], env=env)
    _check_installed(python, meta["Version"], work, env)
    _run([python, "-m", "nvdispatch", "--help"], cwd=work, env=env)
    print(_run([python, "-c", "import nvdispatch; nvdispatch.show_config()"], cwd=work, env=env).strip())
    print(f"release check passed: {sdist.name}, {wheel.name} (in {sdist.parent})")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check(args)
    except CheckFailed as failed:
        print(f"release check FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
