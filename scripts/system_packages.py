"""The Debian packages anyformer's scripts need from the system, found missing and installed up front.

``python3 scripts/system_packages.py --install [GROUP...]`` checks each package of the groups
(``venv``, ``build``, ``gpu-probe``, ``browser``; all of them by default). As root, or with
password-less sudo, it installs what is missing with apt-get; otherwise it prints one line naming
the missing packages and the command that installs them, and exits 1, so that nothing fails later
deep inside a build or a test. ``scripts/install`` asks for ``venv build``, ``scripts/test`` for all.
Only the standard library is used: this runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

#: Where Debian's chromium is; the chat page's browser tests drive it through Playwright.
CHROMIUM = os.environ.get("ANYFORMER_CHROMIUM", "/usr/bin/chromium")


def _has_ensurepip() -> bool:
    return importlib.util.find_spec("ensurepip") is not None


def _has_lavapipe() -> bool:
    return bool(glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json"))


def _has_libvulkan() -> bool:
    import ctypes.util

    return ctypes.util.find_library("vulkan") is not None or bool(glob.glob("/usr/lib/*/libvulkan.so.1"))


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One Debian package, what it is for, and how to tell it is there."""

    package: str
    group: str
    why: str
    present: Callable[[], bool]
    #: Install with the package's recommended packages (chromium's fonts).
    recommends: bool = False


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("python3-venv", "venv", "virtual environments", _has_ensurepip),
    Requirement("build-essential", "build", "compiling llama.cpp", lambda: shutil.which("g++") is not None),
    Requirement("cmake", "build", "compiling llama.cpp", lambda: shutil.which("cmake") is not None),
    Requirement("libvulkan1", "gpu-probe", "the GPU-probe tests: the Vulkan loader", _has_libvulkan),
    Requirement("mesa-vulkan-drivers", "gpu-probe", "the GPU-probe tests: lavapipe, a software adapter", _has_lavapipe),
    Requirement(
        "chromium", "browser", "the chat page's browser tests", lambda: os.access(CHROMIUM, os.X_OK), recommends=True
    ),
)
GROUPS = tuple(dict.fromkeys(r.group for r in REQUIREMENTS))


def missing(requirements: Sequence[Requirement] = REQUIREMENTS) -> list[Requirement]:
    """The requirements that are not met on this machine."""
    return [r for r in requirements if not r.present()]


def install_command(packages: Sequence[Requirement], *, sudo: bool) -> str:
    """The one line a person runs to install ``packages``."""
    names = " ".join(r.package for r in packages)
    prefix = "sudo " if sudo else ""
    return f"{prefix}apt-get update && {prefix}apt-get install -y {names}"


def missing_line(packages: Sequence[Requirement], *, apt: bool = True) -> str:
    """One line: which packages are missing, what for, and the command that installs them."""
    what = ", ".join(f"{r.package} ({r.why})" for r in packages)
    if not apt:
        return f"missing system packages: {what}; install them with your package manager (Debian names)"
    return f"missing system packages: {what}; install them with: {install_command(packages, sudo=True)}"


def _privilege_prefix() -> list[str] | None:
    """``[]`` as root, ``["sudo", "-n"]`` with password-less sudo, None when packages cannot be installed."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False)
    if sudo and sudo.returncode == 0:
        return ["sudo", "-n"]
    return None


def apt_install(packages: Sequence[Requirement], prefix: Sequence[str], run: Callable[..., object]) -> None:
    """``apt-get update`` then install ``packages`` (chromium with its recommended fonts, the rest without)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run([*prefix, "apt-get", "update", "-qq"], check=True, env=env)
    plain = [r.package for r in packages if not r.recommends]
    with_recommends = [r.package for r in packages if r.recommends]
    base = [*prefix, "apt-get", "install", "-y", "-qq"]
    if plain:
        run([*base, "--no-install-recommends", *plain], check=True, env=env)
    if with_recommends:
        run([*base, *with_recommends], check=True, env=env)


def main(argv: Sequence[str] | None = None) -> int:
    """Check (and with ``--install``, install) the system packages; 0 when everything is there."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="install what is missing when root or sudo allows")
    parser.add_argument("groups", nargs="*", metavar="GROUP", help=f"any of {', '.join(GROUPS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.groups) - set(GROUPS)
    if unknown:
        parser.error(f"unknown group {', '.join(sorted(unknown))}; the groups are {', '.join(GROUPS)}")
    wanted = [r for r in REQUIREMENTS if not args.groups or r.group in args.groups]
    absent = missing(wanted)
    if not absent:
        return 0
    apt = shutil.which("apt-get") is not None
    prefix = _privilege_prefix() if args.install and apt else None
    if prefix is None:
        print(f"anyformer: {missing_line(absent, apt=apt)}", file=sys.stderr)
        return 1
    print(f"anyformer: installing system packages: {' '.join(r.package for r in absent)}", file=sys.stderr)
    try:
        apt_install(absent, prefix, subprocess.run)
    except subprocess.CalledProcessError as exc:
        print(f"anyformer: apt-get failed (exit {exc.returncode}); {missing_line(absent)}", file=sys.stderr)
        return 1
    still = missing(wanted)
    if still:
        print(f"anyformer: {missing_line(still)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
