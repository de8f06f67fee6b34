"""Install `coati`; runtime requirements come from requirements.txt so there is one list."""
from pathlib import Path

from setuptools import find_packages, setup


def read_requirements(path: str = "requirements.txt") -> list:
    """Requirement lines of `path`, without comments and blanks."""
    lines = Path(__file__).with_name(path).read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


setup(
    name="coati",
    version="0.1.0",
    description="ColossalAI-native RLHF: SFT, reward models, DPO, PPO and GRPO on colossalai's Booster",
    packages=find_packages(include=["coati", "coati.*"]),
    python_requires=">=3.9",
    install_requires=read_requirements(),
    entry_points={"console_scripts": ["coati = coati.cli.main:main"]},
)
