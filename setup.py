"""Maps the top-level folders (daemon/, backends/, tui/, clients/, link/) under the one namespace `evenflow`."""
from setuptools import find_packages, setup

SUBPACKAGES = ("daemon", "backends", "tui", "clients", "link")
packages = ["evenflow"] + [
    f"evenflow.{p}" for p in find_packages(include=[f"{s}*" for s in SUBPACKAGES]) if p.split(".")[0] in SUBPACKAGES
]
setup(packages=packages)
